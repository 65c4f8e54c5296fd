"""The one exception type for bad user input: the CLI prints its message (which names the fix)."""


class UserError(Exception):
    """Bad input from the user (unknown name, missing data, bad config key)."""


class WriteError(UserError):
    """A file could not be written (disk full, quota, I/O error, read-only, no permission): one line naming
    the file, why, the free space there and how to go on; the CLI exits with 74 (sysexits' EX_IOERR), so a
    script tells it from a mistake (2). ``what`` says what failed and what was kept, ``then`` how to go on."""

    exit_code = 74

    def __init__(self, what: str, then: str = "run the same command again"):
        super().__init__(f"{what}, then {then}")
        self.what, self.then = what, then

    def continue_with(self, command: str) -> "WriteError":
        """The same error, ending with the command that continues (``fastfair train --out RUN --resume``)."""
        return WriteError(self.what, f"continue with: {command}")


def no_checkpoint(path) -> UserError:
    """A run folder or checkpoint file that is not there: said by the loader, and by the CLI before it imports torch,
    so the mistake costs no seconds of imports."""
    return UserError(f"no checkpoint at {path}; pass a run directory or a .pt file written by fastfair train")


class Interrupted(Exception):
    """A stop signal (Ctrl-C, SIGTERM, SIGUSR1; :mod:`fastfair.stopping`), turned into one line saying what was kept
    and how to continue; the CLI exits with 128 + ``signum``. An empty message says nothing (torchrun's other
    ranks: rank 0 says it)."""

    def __init__(self, message: str, signum: int = 2):
        super().__init__(message)
        self.signum = signum
