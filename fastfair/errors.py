"""The one exception type for bad user input: the CLI prints its message (which names the fix)."""


class UserError(Exception):
    """Bad input from the user (unknown name, missing data, bad config key)."""


class Interrupted(Exception):
    """A stop signal (Ctrl-C, SIGTERM, SIGUSR1; :mod:`fastfair.stopping`), turned into one line saying what was kept
    and how to continue; the CLI exits with 128 + ``signum``. An empty message says nothing (torchrun's other
    ranks: rank 0 says it)."""

    def __init__(self, message: str, signum: int = 2):
        super().__init__(message)
        self.signum = signum
