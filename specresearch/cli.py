"""The command-line shell every Hydra command shares (`python -m specresearch`, `python -m
specresearch.train`): one-line errors, sweeps that survive, the same job handling, the console's log
filter.
"""

from __future__ import annotations

import logging
import os
import signal
import string
import sys
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from specresearch.config import CONF_DIR, groups, options, register_options, unknown_option
from specresearch.errors import SpecResearchError, fail, first_surrogate


class OwnMessages(logging.Filter):
    """The console's filter (conf/hydra/job_logging): our own loggers' messages at every level, the
    libraries' warnings and errors only (lm-eval's and MLflow's INFO lines go to the job's log file),
    less lm-eval's advice on `--metadata`, which it gives as a warning for every task that builds its
    own data (ours do) and which asks nothing of our user."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "lm_eval.api.task" and "Custom kwargs can be passed to `--metadata`" in record.getMessage():
            return False
        return record.name.split(".")[0] in ("specresearch", "__main__") or record.levelno >= logging.WARNING


def cli(config_name: str, work: Callable[[DictConfig], dict[str, float] | None], timed: bool = True,
        ready: Callable[[DictConfig], Any] | None = None) -> None:
    """Run a Hydra command (`python -m specresearch`, `python -m specresearch.train`): every job, single
    or in a sweep, is checked (settings.check_config) before a run opens, then runs `work(cfg)` inside
    sweeps.job (signals end its run FAILED, `resume` may skip it, a timed speed job holds the speed lock).
    A SpecResearchError is one `error:` line and exit 2 for a single run (which leaves no empty output
    folder); in a sweep the other jobs go on and the sweep's callback counts the failed one. `--help` (-h) is
    answered here (_print_help), in a fraction of the time Hydra's takes, whatever other Hydra flags come with it
    (-m, --cfg job, ...; a sweep's first value), but --config-name/-path/-dir, whose help Hydra's answers.

    Args:
        config_name: the primary config of conf/ ("config" or "train").
        work: the job: the composed config in, the summary metrics out.
        timed: whether the jobs' results are timings (sweeps.job: the speed lock); False for training.
        ready: the job's own checks that need no model (files, prompts, sizes), run with settings.check_config
            before sweeps.job: a job it refuses neither waits for the speed lock nor opens a run.
    """
    for arg in sys.argv[1:]:  # an undecodable byte of the shell (surrogate-escaped): Hydra's lexer would say 4 lines
        at = first_surrogate(arg)
        if at is not None:
            shown = os.fsencode(arg).decode("utf-8", "backslashreplace")
            fail(f"the override '{shown}' is not UTF-8 text (it holds the surrogate U+{ord(arg[at]):04X} at character "
                 f"{at}): write overrides (group=option, key=value) in UTF-8")
    if "--version" in sys.argv[1:] or "-V" in sys.argv[1:]:  # ours, not Hydra's ("Hydra 1.3.8")
        from specresearch import __version__

        print(f"specresearch {__version__}")
        return
    if "--settings" in sys.argv[1:]:  # one option's settings, from the dataclass that declares them
        _print_settings(sys.argv[sys.argv.index("--settings") + 1:])
        return
    import hydra

    register_options()  # options defined in code, without a file in conf/
    problem = unknown_option(sys.argv[1:], config_name)
    if problem:
        fail(problem)
    helping = {"--help", "-h"} & set(sys.argv[1:])
    overrides = _help_overrides(sys.argv[1:]) if helping else None
    if overrides is not None:
        _print_help(config_name, overrides)
        _print_settings(sys.argv[1:], listing=False)
        return
    try:
        hydra.main(config_path=str(CONF_DIR), config_name=config_name, version_base="1.3")(_job(work, timed, ready))()
    except SystemExit as done:  # Hydra's --help (with its other flags) exits here; then the settings of the options it names (drafter=pld)
        if helping and not done.code:
            _print_settings(sys.argv[1:], listing=False)
        raise
    except KeyboardInterrupt:  # Ctrl-C outside a job (during a job sweeps.exit_on_signals turns it into SystemExit(130))
        print("\ninterrupted by SIGINT", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)


def _help_overrides(args: list[str]) -> list[str] | None:
    """The overrides of a `--help` that _print_help answers, read by Hydra's own parser (hydra/_internal/utils.py
    get_args_parser): its other flags (-m, --cfg job, --package, --info, --resolve, ...) change nothing the help
    prints (Hydra answers --help before them); None with --config-name, --config-path or --config-dir (Hydra's)."""
    from hydra._internal.utils import get_args_parser

    parsed = get_args_parser().parse_intermixed_args(args)  # a bad flag: argparse's usage line, as Hydra's
    return None if parsed.config_name or parsed.config_path or parsed.config_dir else parsed.overrides


def _print_help(config_name: str, overrides: list[str]) -> None:
    """`--help`: Hydra's help (the template of conf/hydra/help/, its ${...} resolved in the config these overrides
    compose, a sweep's with its first value: a,b, choice(...), range(...); glob(...), interval(...) left out), with
    $APP_CONFIG_GROUPS the groups a user sets and their options (specresearch.config.groups). Hydra's own listing
    builds a config repository for each of its ~130 groups and options (seconds on a 2-core CPU) and names the study
    presets' own groups (batch_synergy/arm) too."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Transformer, ValueType
    from hydra.errors import HydraException

    try:
        unlisted = (ValueType.GLOB_CHOICE_SWEEP, ValueType.INTERVAL_SWEEP)  # sweeps without a first value here
        chosen = [f"{o.get_key_element()}={next(o.sweep_iterator(Transformer.encode))}" if o.is_sweep_override()
                  else o.input_line for o in OverridesParser.create().parse_overrides(overrides)
                  if o.value_type not in unlisted]
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=chosen, return_hydra_config=True)
    except HydraException as err:
        fail(str(err).splitlines()[0])
    listing = "".join(f"{group}: {', '.join(options(group))}\n" for group in groups())  # as Hydra writes its list
    print(string.Template(cfg.hydra.help.template).substitute(APP_CONFIG_GROUPS=listing))


def _print_settings(args: list[str], listing: bool = True) -> None:
    """`--settings GROUP=OPTION ...`: each option's settings, defaults, descriptions and why each default
    was chosen; no option: the options there are (`listing`). With `--help` (listing=False): the settings
    of each GROUP=OPTION among the arguments that names an option, the rest of them left alone."""
    from specresearch.options.conf import describe, registered

    chosen = [a for a in args if "=" in a and not a.startswith("-")]
    if not listing:
        chosen = [a for a in chosen if a in {f"{g}={n}" for g, n, *_ in registered()}]
        if not chosen:
            return
        print("\n== The settings of " + ", ".join(chosen) + " ==")
    if not chosen:
        print("specresearch --settings GROUP=OPTION [...]: an option's settings. Options:")
        groups: dict[str, list[str]] = {}
        for group, name, *_ in registered():
            groups.setdefault(group, []).append(name)
        print("\n".join(f"  {group}: {', '.join(names)}" for group, names in groups.items()))
        return
    try:
        print("\n\n".join(describe(*a.split("=", 1)) for a in chosen))
    except SpecResearchError as err:
        fail(str(err))


def _job(work: Callable[[DictConfig], dict[str, float] | None], timed: bool,
         ready: Callable[[DictConfig], Any] | None = None) -> Callable[[DictConfig], Any]:
    def task(cfg: DictConfig) -> Any:
        """One job. Returns the summary metric `objective` (a float, for Optuna's sweeper; None when
        it is not set or not finite), or what SweepCallback counts: JobSkipped, JobFailed."""
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        from specresearch import sweeps
        from specresearch.settings import check_config

        hc = HydraConfig.get()
        multirun = hc.mode == RunMode.MULTIRUN
        try:
            check_config(cfg)  # before sweeps.job: a refused config opens no run and takes no lock
            if ready is not None:
                ready(cfg)  # so are missing or damaged files, too few prompts, sizes a model cannot hold
            with sweeps.job(cfg, multirun=multirun, timed=timed) as skipped:
                if skipped is not None:
                    return skipped
                summary = work(cfg)
        except SpecResearchError as err:
            if not multirun:
                sweeps.discard_refused_run()  # nothing measured: leave no empty outputs/DATE/TIME/ behind
                fail(str(err))
            # In a sweep the other jobs go on; SweepCallback counts this one and exits non-zero at the end.
            print(f"error: job {hc.job.num} ({' '.join(hc.overrides.task)}): {err}", file=sys.stderr)
            return sweeps.JobFailed(str(err))
        optimizing = "BasicSweeper" not in str(hc.sweeper.get("_target_"))  # Optuna reads the return value
        return sweeps.objective_value(cfg, summary, warn=optimizing)

    return task
