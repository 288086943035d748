"""The one exception type the command line shows as a one-line message."""


class WorkbenchError(Exception):
    """A problem the user can fix: a bad config key, a missing path or weight, a corrupt file.

    `dwb` prints ``error: <message>`` and exits non-zero; the traceback appears only with ``--debug``.
    """

    user_facing = True  # `dwb` shows any exception class with this flag as one line
