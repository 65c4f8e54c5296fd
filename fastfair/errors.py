"""The one exception type for bad user input: the CLI prints its message (which names the fix)."""


class UserError(Exception):
    """Bad input from the user (unknown name, missing data, bad config key)."""


class Interrupted(Exception):
    """Ctrl-C, turned into one line saying what was kept and how to continue (the CLI exits with code 130)."""
