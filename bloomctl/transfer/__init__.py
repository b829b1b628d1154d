"""Filters leaving and entering a server: the portable dump file (``dumpfile``), reading a filter
(``dump``), checking a dump before it is restored (``validate``), loading it into scratch keys
(``scratch``) and the standbys (``restore``), and both at once between two servers (``copy``)."""
