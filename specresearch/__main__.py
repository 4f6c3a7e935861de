"""`python -m specresearch [group=option ...]` (or the `specresearch` command): one experiment, or a
sweep with `-m`. The configs are specresearch/conf; each group folder there is the registry of its
options, and each study of specresearch/studies is an option of `experiment`.
"""

from __future__ import annotations

from omegaconf import DictConfig

from specresearch.app import cli


def work(cfg: DictConfig) -> dict[str, float]:
    """One job: quality with `eval=NAME` (lm-eval, specresearch.evaluation.runner), else speed
    (specresearch.experiment)."""
    if cfg.get("eval") is not None:
        from specresearch.evaluation.runner import run_eval  # imported here so `--help` stays fast

        return run_eval(cfg)
    from specresearch.experiment import run

    return run(cfg)


def main() -> None:
    cli("config", work)


if __name__ == "__main__":
    main()
