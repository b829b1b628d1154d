"""Defaults and limits shared by the library and the command line (a light module: no imports)."""

DEFAULT_MIN_RATIO = 0.5  # swap refuses a standby with fewer items than this fraction of the active filter's
MAX_KEEP_OLD_SECONDS = 10 * 365 * 24 * 3600  # the longest --keep-old (PEXPIRE must not overflow)
