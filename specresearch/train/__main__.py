"""`python -m specresearch.train drafter=NAME [train.KEY=VALUE ...]`: train a drafter on the target's own
predictions (the training itself is specresearch.train; this is its command-line shell)."""

from __future__ import annotations

from specresearch.cli import cli
from specresearch.train import run


def main() -> None:
    cli("train", run, timed=False)


if __name__ == "__main__":
    main()
