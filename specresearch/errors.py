"""One exception type for every user-facing error, and `fail`: how every command prints it (one line, exit 2)."""

import sys


class SpecResearchError(Exception):
    """A bad input or a broken environment, with a message that says what to do about it."""


def fail(message: str) -> None:
    """Print a one-line error and exit 2 (how every command reports a SpecResearchError)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)
