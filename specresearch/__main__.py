"""`python -m specresearch [group=option ...]`: one experiment, or a sweep with `-m`.

The configs are the top-level `conf/` folder of the checkout (the one users edit), found from any
working directory; each group folder there is the registry of its options.
"""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from specresearch.errors import SpecResearchError
from specresearch.tracking import JobFailed, JobSkipped

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def _task(cfg: DictConfig) -> float | JobFailed | JobSkipped | None:
    """One job, speed or quality (`eval=`), inside specresearch.sweeps.job: SIGTERM/SIGHUP/SIGINT end
    its run as FAILED, `resume` may skip it, a speed job holds the machine's speed lock.

    Returns:
        The summary metric `objective` (a float, for Optuna's sweeper; None when it is not set or not
        finite), or what SweepCallback counts: JobSkipped, JobFailed (a refused experiment).
    """
    from specresearch import sweeps
    from specresearch.experiment import fail, run  # imported here so `--help` stays fast
    from specresearch.validate import check_config

    try:
        check_config(cfg)  # before sweeps.job: a refused config opens no run and takes no lock
        with sweeps.job(cfg, multirun=HydraConfig.get().mode == RunMode.MULTIRUN) as skipped:
            if skipped is not None:
                return skipped
            if cfg.get("eval") is not None:  # eval=NAME: quality (lm-eval) instead of speed
                from specresearch.evaluation.runner import run_eval

                summary = run_eval(cfg)
            else:
                summary = run(cfg)
    except SpecResearchError as err:
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            sweeps.discard_refused_run()  # nothing measured: leave no empty outputs/DATE/TIME/ behind
            fail(str(err))
        # In a sweep the other jobs go on; SweepCallback counts this one and exits non-zero at the end.
        overrides = " ".join(HydraConfig.get().overrides.task)
        print(f"error: job {HydraConfig.get().job.num} ({overrides}): {err}", file=sys.stderr)
        return JobFailed(str(err))
    optimizing = "BasicSweeper" not in str(HydraConfig.get().sweeper.get("_target_"))  # Optuna reads the return value
    return sweeps.objective_value(cfg, summary, warn=optimizing)


def unknown_option(args: list[str]) -> str | None:
    """The one-line error for a `group=NAME` (or `+group=a,b` in a sweep) that names no option of a
    conf/ group, or None. Checked before Hydra composes, whose own message is a dozen lines; values
    Hydra's sweep grammar writes otherwise (`choice(...)`, globs) are left to Hydra."""
    for arg in args:
        group, sep, value = arg.lstrip("+").partition("=")
        if not sep or not group.isidentifier() or not (CONF_DIR / group).is_dir() or not re.fullmatch(r"[\w.-]+(,[\w.-]+)*", value):
            continue
        options = sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))
        for name in value.split(","):
            if name not in options and name != "null":
                return f"unknown {group} '{name}': valid are {', '.join(options)}"
    return None


def main() -> None:
    if not (CONF_DIR / "config.yaml").is_file():
        raise SystemExit(f"error: config folder {CONF_DIR} not found: install specresearch from a checkout (pip install -e .)")
    problem = unknown_option(sys.argv[1:])
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    try:
        hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(_task)()
    except KeyboardInterrupt:  # Ctrl-C outside a job (during a job sweeps.exit_on_signals turns it into SystemExit(130))
        print("\ninterrupted by SIGINT", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)


if __name__ == "__main__":
    main()
