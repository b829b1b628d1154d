"""Filters leaving and entering a server: the portable dump file, dump, restore, copy."""
