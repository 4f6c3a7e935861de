"""One exception type for every user-facing error: the runner prints it as one line and exits non-zero."""


class SpecResearchError(Exception):
    """A bad input or a broken environment, with a message that says what to do about it."""
