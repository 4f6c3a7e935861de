"""One exception type for every user-facing error, `fail`: how every command prints it (one line, exit 2), and
`write_problem`: why a folder cannot take files (the check before a run writes anywhere), `first_surrogate`: where a
text holds what UTF-8 cannot encode (an override, a prompt). Stdlib only."""

import sys
import tempfile
from pathlib import Path


class SpecResearchError(Exception):
    """A bad input or a broken environment, with a message that says what to do about it."""


def fail(message: str) -> None:
    """Print a one-line error and exit 2 (how every command reports a SpecResearchError)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def first_surrogate(text: str) -> int | None:
    """The index of `text`'s first surrogate code point (U+D800-U+DFFF: half of a JSON escape's UTF-16 pair, or a byte
    Python could not decode, surrogate-escaped), which UTF-8 cannot encode; None when it holds none."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # (a str fails UTF-8 only on its surrogates)
        return err.start
    return None


def report_problem(path: Path, option: str) -> str | None:
    """Why a report could not be written at `path` (given as `option`, e.g. "--json"), as one line, or None when
    it can: its folder must take files (write_problem) and `path` must not be a folder. Checked before the work."""
    problem = write_problem(path.parent) or (f"{path} is a folder" if path.is_dir() else None)
    return f"cannot write the report {path} ({option}): {problem}" if problem else None


def report_path(value: str | None, option: str) -> Path | None:
    """The path a report is to be written at (`value` as given to `option`; None: no report), checked before the work:
    a SpecResearchError naming why it cannot be written (report_problem)."""
    path = Path(value) if value else None
    if path is not None and (problem := report_problem(path, option)):
        raise SpecResearchError(problem)
    return path


def write_problem(folder: Path) -> str | None:
    """Why files cannot be written in `folder` (made with its missing parents first), or None when
    they can: its nearest existing ancestor must be a folder in which a file can be created. Creates
    nothing that stays: a probe file is made and removed (chmod does not stop root, a probe does
    stop everyone on a read-only or pseudo file system)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".specresearch-probe-"):
            pass
    except OSError as err:
        return f"cannot create a file in {existing} ({err.strerror})"
    return None
