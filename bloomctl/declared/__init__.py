"""Declared filters: ``bloomctl.toml`` read and checked, and what runs over every filter it declares.

``config`` reads the file; ``declarations`` turns it into the library's terms; ``schedule``,
``check``, ``apply`` and ``exporter`` act on every declared filter.
"""
