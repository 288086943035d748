"""The one exception type the command line shows as a one-line message."""


def first_line(e: BaseException, limit: int = 200) -> str:
    """An exception's message cut to its first line (at most ``limit`` characters), or its type's name: how a
    library's error becomes the reason in a one-line WorkbenchError."""
    text = str(e).strip()
    return text.splitlines()[0][:limit] if text else type(e).__name__


class WorkbenchError(Exception):
    """A problem the user can fix: a bad config key, a missing path or weight, a corrupt file.

    `dwb` prints ``error: <message>`` and exits non-zero; the traceback appears only with ``--debug``.
    """

    user_facing = True  # `dwb` shows any exception class with this flag as one line

    def __str__(self) -> str:
        """The message; for one raised in a DataLoader worker process, the worker's own message: PyTorch
        re-raises it in the main process as "Caught WorkbenchError in DataLoader worker process 0.", a line
        break and the worker's whole traceback, whose last line is "...WorkbenchError: <message>"."""
        text = super().__str__()
        if text.startswith("Caught ") and "\nOriginal Traceback" in text:
            last = text.rstrip().splitlines()[-1]
            return last.split("Error: ", 1)[1] if "Error: " in last else last
        return text


class CheckpointError(WorkbenchError):
    """A problem of one checkpoint itself (truncated, corrupt, of an unknown kind): other checkpoints may be fine.

    Callers that go over many checkpoints (`dwb evaluate watch`) record it against that checkpoint and go on;
    any other error is a problem of the setup and stops them.
    """
