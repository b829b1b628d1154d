"""The signal between the Arrow CSV reader and the csv module's reader (no numpy or pyarrow here)."""


class Unsure(Exception):
    """The fast reader cannot promise the csv module's result from here on."""
