"""`python -m specresearch [group=option ...]` (or the `specresearch` command): one experiment, or a
sweep with `-m`. The configs are conf/; each group folder there is the registry of its
options, and each study of experiments/ is an option of `experiment`. Tab completion:
`eval "$(specresearch -sc install=bash)"` (Hydra's), or `eval "$(python -m specresearch -sc install=bash)"`
for the `python -m` form.
"""

from __future__ import annotations

import os
import re
import sys

from omegaconf import DictConfig

from specresearch.cli import cli


def work(cfg: DictConfig) -> dict[str, float]:
    """One job: quality with `eval=NAME` (lm-eval, specresearch.evaluation.runner), else speed
    (specresearch.measure)."""
    if cfg.get("eval") is not None:
        from specresearch.evaluation.runner import run_eval  # imported here so `--help` stays fast

        return run_eval(cfg)
    from specresearch.measure import run

    return run(cfg)


def ready(cfg: DictConfig) -> None:
    """What a speed job checks before it waits for the speed lock (specresearch.measure.check_run);
    a quality job (`eval=NAME`) takes no lock and checks as it starts."""
    if cfg.get("eval") is None:
        from specresearch.measure import check_run

        check_run(cfg)


# Bash completion of `python -m specresearch ...`, which Hydra's own script skips (it completes `python
# FILE.py` only): the same query (COMP_LINE in, the matching words out), and python's previous
# completion for other python commands, kept (once) in _HYDRA_OLD_COMP: Hydra's `-sc uninstall=bash`
# restores it.
PYTHON_M_COMPLETION = r"""[[ $(complete -p python 2> /dev/null) == *_specresearch_python_completion* ]] ||
    export _HYDRA_OLD_COMP=$(complete -p python 2> /dev/null || echo complete -r python)
_specresearch_python_completion()
{
    local words=($COMP_LINE)
    if [[ ${words[1]} == -m && ${words[2]} == specresearch ]]; then
        local choices=$(COMP_LINE=$COMP_LINE COMP_POINT=$COMP_POINT ${words[0]} -m specresearch -sc query=bash)
        COMPREPLY=($(compgen -o nospace -o default -W "$choices" -- "${COMP_WORDS[COMP_CWORD]}"))
    elif [[ $_HYDRA_OLD_COMP =~ -F\ ([^ ]+) ]]; then
        "${BASH_REMATCH[1]}" "$@"
    fi
}
COMP_WORDBREAKS=${COMP_WORDBREAKS//=}
complete -o nospace -o default -F _specresearch_python_completion python"""


def main() -> None:
    """The `specresearch` command, and `python -m specresearch`: Hydra's command line (see `--help`)."""
    if sys.argv[0].endswith(".py"):  # python -m specresearch: Hydra would take it for `python FILE.py`
        if "install=bash" in sys.argv and {"-sc", "--shell-completion"} & set(sys.argv):
            print(PYTHON_M_COMPLETION)
            return
        if "COMP_LINE" in os.environ:  # a completion query: Hydra strips `python`, not `-m specresearch`
            os.environ["COMP_LINE"] = re.sub(r"^\s*\S*python[\d.]*\s+-m\s+", "", os.environ["COMP_LINE"])
    cli("config", work, ready=ready)


if __name__ == "__main__":
    main()
