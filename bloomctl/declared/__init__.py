"""Declared filters: ``bloomctl.toml`` read and checked, and what runs over every filter it declares.

``config`` reads the file; ``declarations`` turns it into the library's terms; ``fleet`` is the
one loop over the declared filters, which ``check``, ``apply``, ``rebuild_all`` and ``exporter``
run their actions through (``schedule`` says when a filter is due).
"""
