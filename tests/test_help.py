"""The command line as a Hydra 1.3 user meets it: `--help` says what each config group of the registry
is and lists its options, with examples that compose; bash tab completion, installed and queried as
Hydra's protocol does it, works for `specresearch` and for `python -m specresearch`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from specresearch.config import CONF_DIR, compose, groups, options, study_groups
from specresearch.errors import SpecResearchError

pytestmark = pytest.mark.e2e  # runs the command line's --help

BIN = Path(sys.executable).parent  # python and the `specresearch` console script of this environment

# What bash does on TAB, for each line given: the installed function, called with COMP_LINE, COMP_POINT,
# COMP_WORDS and COMP_CWORD set (cursor at the end), prints its COMPREPLY on one line.
COMPLETE = r"""eval "$($1 -sc install=bash)"; shift
for line; do
    COMP_LINE=$line COMP_POINT=${#line} COMP_WORDS=($line) COMPREPLY=()
    COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
    [[ $(complete -p ${COMP_WORDS[0]}) =~ -F\ ([^ ]+) ]]
    "${BASH_REMATCH[1]}" ${COMP_WORDS[0]} "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
    echo "${COMPREPLY[*]}"
done"""


def run(*command: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=True)


def described(help_text: str) -> dict[str, tuple[str | None, str]]:
    """The help's config groups section: group -> (the command line's choice, or None; the description)."""
    section = help_text.split("== Config groups", 1)[1].split("\n\n", 1)[0]
    return {m[1]: (m[2], m[3]) for m in re.finditer(r"^([\w-]+) +(?:\[(\S+)\] +)?(.+)$", section, re.M)}


def listed(help_text: str) -> list[str]:
    """The groups of the help's list of options ("group: a, b, ..." lines), in order."""
    section = help_text.split("\nOptions:\n", 1)[1].split("\n\n", 1)[0]
    return [line.split(":", 1)[0] for line in section.splitlines()]


def examples(help_text: str, config_name: str) -> list[list[str]]:
    """The help's example command lines, as arguments, each checked to compose (a sweep's first job)."""
    section = help_text.split("== Examples ==\n", 1)[1].split("\n\n", 1)[0]
    found = [line.split("#")[0].split() for line in section.splitlines()]
    for example in found:
        command = 3 if example[0] == "python" else 1
        compose([arg.split(",")[0] for arg in example[command:] if arg != "-m"], config_name=config_name)
    return found


def test_help_describes_every_group_without_importing_torch(tmp_path):
    result = run(sys.executable, "-X", "importtime", "-m", "specresearch", "drafter=pld", "--help", cwd=tmp_path)
    lines = described(result.stdout)
    assert set(lines) == set(groups())  # a line on every group folder (and `experiment`), on no other
    assert lines["drafter"][0] == "pld"  # the choice of this command line
    for group in groups():
        assert f"\n{group}: {', '.join(options(group))}\n" in result.stdout
    assert listed(result.stdout) == groups() and study_groups()  # not the studies' own (batch_synergy/arm, ...)
    assert not any(f"{group}:" in result.stdout for group in study_groups())
    runs = examples(result.stdout, "config")
    assert any("-m" in example for example in runs)
    assert any(arg.startswith("eval=") for example in runs for arg in example)
    assert "--cfg job" in result.stdout and "--hydra-help" in result.stdout
    assert re.search(r"\|\s*hydra$", result.stderr, re.M) and not re.search(r"\|\s*torch$", result.stderr, re.M)
    settings = result.stdout.split("== The settings of drafter=pld ==\n", 1)[1]  # the option it names: its settings and why
    assert settings.startswith("drafter=pld: ") and "\n  k=10 " in settings and "\nWhy these defaults:\n  k=10: " in settings


def test_help_shows_a_study_presets_choices_and_refuses_a_bad_override_in_one_line(tmp_path):
    """`-h` is `--help`; the brackets show the choices of the config the overrides compose, a study's preset's
    included; an override Hydra cannot parse is one line and exit 2, as when it runs."""
    result = run(sys.executable, "-m", "specresearch", "experiment=medusa_typical", "dataset=mtbench", "-h", cwd=tmp_path)
    choices = {group: choice for group, (choice, _) in described(result.stdout).items() if choice}
    assert {"drafter": "medusa", "verifier": "typical", "dataset": "mtbench"}.items() <= choices.items()  # preset's, ours
    assert listed(result.stdout) == groups()
    bad = subprocess.run([sys.executable, "-m", "specresearch", "drafter.k=[1", "--help"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == ["error: no viable alternative at input '[1'"]


def test_train_help_lists_its_groups_and_their_options(tmp_path):
    from specresearch.train import trainable

    def can_train(name: str) -> bool:
        try:
            return bool(trainable(compose([f"drafter={name}"], config_name="train")))
        except SpecResearchError:
            return False

    result = run(sys.executable, "-m", "specresearch.train", "--help", cwd=tmp_path)
    lines = described(result.stdout)
    defaults = OmegaConf.load(CONF_DIR / "train.yaml").defaults
    assert set(lines) == {key for item in defaults if not isinstance(item, str) for key in item if " " not in key}
    for group, (_, description) in lines.items():
        named = set(re.findall(r"[\w.-]+", description)) & set(options(group))
        assert named == {name for name in options(group) if group != "drafter" or can_train(name)}, group
    examples(result.stdout, "train")


@pytest.mark.parametrize("command", ["specresearch", "python -m specresearch", "python -m specresearch.train"])
def test_version_prints_specresearchs_version(command, tmp_path):
    """`--version` is ours (Hydra's would print "Hydra 1.3.8"), wherever it stands on the line; --help names it."""
    from specresearch import __version__

    if shutil.which(command.split()[0], path=str(BIN)) is None:
        pytest.skip(f"no {command.split()[0]} in {BIN}")
    argv = [sys.executable, *command.split()[1:]] if command.startswith("python") else [str(BIN / command)]
    for args in (["--version"], ["drafter=pld", "--version"]):
        result = run(*argv, *args, cwd=tmp_path)
        assert result.stdout == f"specresearch {__version__}\n" and "Hydra" not in result.stdout + result.stderr
    assert "specresearch's version: --version" in run(*argv, "--help", cwd=tmp_path).stdout


@pytest.mark.parametrize("command", ["specresearch", "python -m specresearch"])
def test_tab_completion_lists_options_and_keys(command, tmp_path):
    if shutil.which(command.split()[0], path=str(BIN)) is None:
        pytest.skip(f"no {command.split()[0]} in {BIN}")
    lines = [f"{command} drafter=", f"{command} -m drafter=pld verifier=ty", f"{command} drafter.k"]
    result = run("bash", "-c", COMPLETE, "bash", command, *lines, cwd=tmp_path)
    drafters, verifiers, keys = (set(line.split()) for line in result.stdout.splitlines())
    assert "drafter=medusa" in drafters and drafters == {f"drafter={name}" for name in options("drafter")}
    assert verifiers == {f"verifier={name}" for name in options("verifier") if name.startswith("ty")}
    assert keys == {f"drafter.{key}=" for key in compose().drafter if key.startswith("k")}
