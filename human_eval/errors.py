"""The exception `dwb` shows as a one-line message for problems a user can fix."""


class HumanEvalError(Exception):
    """A bad manifest, a missing image, a study folder in the wrong state, a database of another study.

    `dwb` prints ``error: <message>`` and exits non-zero; the traceback appears only with ``--debug``.
    """

    user_facing = True  # `dwb` shows any exception class with this flag as one line
