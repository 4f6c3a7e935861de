"""conf/GROUP/OPTION.yaml of every config group (model, drafter, verifier, tracker, dataset, sampling,
eval) and the docs' page of every option's settings (docs/options.md), written from the settings
dataclasses: their defaults, descriptions and docstrings, and the class each option builds (`_target_`:
the class that declares the option's settings, `specresearch.options.implements`); `specresearch
--settings GROUP=OPTION` prints one option's. The files are what users read and Hydra composes; the
dataclasses are where a setting is declared. A test holds the files to them:

    python -m specresearch.config           # rewrite conf/ and docs/options.md of this checkout
    python -m specresearch.config --check   # exit 1 naming the stale files
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from specresearch.errors import SpecResearchError, fail
from specresearch.options import MISSING, chosen, target
from specresearch.options.groups import OPTIONS, PRESETS


def project_folder(name: str, marker: str) -> Path:
    """A folder of the project's top level (conf, experiments): inside the package in a wheel, beside it
    in a checkout. Found by a file it holds (`marker`), so that a leftover folder of the same name (a
    checkout's old specresearch/conf/__pycache__, which git leaves behind) is not taken for it."""
    package = Path(__file__).resolve().parents[1]
    return package / name if (package / name / marker).is_file() else package.parent / name


CONF_DIR = project_folder("conf", "config.yaml")

COLUMN = 30  # where the descriptions start (longer lines push theirs one space further)
WIDTH = 120  # a header comment's width


def render(schema: type, values: Any = None, title: str | None = None) -> str:
    """The YAML of one option: a header from `title` (default: the docstring), `_target_` if its group's
    options build a class (the class that declares `schema` its Settings, defined by now), then each
    setting (`values`' or the defaults) with its description."""
    values = values if values is not None else schema()
    title = title or " ".join((schema.__doc__ or "").split())
    lines = [f"# {line}" for line in textwrap.wrap(title, WIDTH - 2)]
    if schema.builds:
        if target(schema) is None:
            raise SpecResearchError(f"{schema.group}={schema.option}: no class declares {schema.__name__} its Settings "
                                    "(or its module is not imported yet)")
        lines.append(f"_target_: {target(schema)}")
    lines += _node(values, "")
    return "\n".join(lines) + "\n"


def shipped(values: Any) -> Iterator[tuple[str, Any, str, str]]:
    """(name, value, description, the setting it follows or "") of each setting a dataclass instance's
    YAML has: the `extra` ones aside, a setting that follows another (`follows`, a class's FOLLOWS)
    does so where it has its default."""
    follows = getattr(type(values), "FOLLOWS", {})
    for f in fields(values):
        if f.name.startswith("_") or f.metadata.get("extra"):
            continue
        value = getattr(values, f.name)
        source = f.metadata.get("follows") or follows.get(f.name, "")
        yield f.name, value, f.metadata.get("doc", ""), source if source and value == f.default else ""


def _node(values: Any, indent: str) -> list[str]:
    """Each shipped setting of a dataclass instance, nested nodes as blocks."""
    out = []
    for name, value, doc, source in shipped(values):
        if source:  # the default: follow the other setting
            out.append(f"{indent}{name}: ${{{source}}}")
        elif is_dataclass(value):
            out.append(_commented(f"{indent}{name}:", doc))
            out += _node(value, indent + "  ")
        elif isinstance(value, dict):
            out.append(_commented(f"{indent}{name}:", doc))
            out += [f"{indent}  {key}: {_scalar(v)}" for key, v in value.items()]
        else:
            out.append(_commented(f"{indent}{name}: {_scalar(value)}", doc))
    return out


def _commented(line: str, doc: str) -> str:
    return f"{line.ljust(COLUMN - 1)} # {doc}" if doc else line


def _scalar(value: Any) -> str:
    """A value in YAML's flow style."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    if isinstance(value, str) and not _plain(value):
        return json.dumps(value)
    return str(value)


def _plain(text: str) -> bool:
    """Whether YAML reads `text` as this string without quotes."""
    return (bool(text) and text.isprintable() and text == text.strip() and text not in ("null", "true", "false")
            and not any(c in text for c in ":#{}[],&*!|>'\"%@`"))


def files() -> dict[str, str]:
    """Path relative to the checkout -> text, for every generated file."""
    out = {}
    for group, name, schema, values, title in registered():
        out[f"conf/{group}/{name}.yaml"] = render(schema, values, title)
    out["docs/options.md"] = markdown()
    return out


def registered(shipped: bool = True):
    """(group, option, schema, its values, its title) of every registered option: the schemas' own
    options (values None), then the presets (a model, a dataset, drafter=plain_chain). shipped: the
    package's own only (what conf/ and docs/options.md hold), not those other modules define."""
    for group, found in OPTIONS.items():
        presets = PRESETS.get(group, {})
        for name, schema in found.items():
            if name != "*" and name not in presets and (not shipped or schema.__module__.startswith("specresearch.")):
                yield group, name, schema, None, None
        for name, (title, preset) in presets.items():
            schema = found.get(name, found.get("*"))
            yield group, name, schema, schema(**preset), title


def table(schema: type, values: Any = None, prefix: str = "") -> list[tuple[str, str, str]]:
    """(setting, default, description) of every shipped setting, nested nodes dotted."""
    values = values if values is not None else schema()
    rows = []
    for name, value, doc, source in shipped(values):
        if source:
            rows.append((prefix + name, f"${{{source}}}", f"follows {source}"))
        elif is_dataclass(value):
            rows += table(type(value), value, f"{prefix}{name}.")
        elif isinstance(value, dict):
            rows += [(f"{prefix}{name}.{key}", _scalar(v), doc if i == 0 else "") for i, (key, v) in enumerate(value.items())]
        else:
            rows.append((prefix + name, "(in conf/)" if value == MISSING else _scalar(value), doc))
    return rows


def describe(group: str, option: str) -> str:
    """One option's settings as text (`specresearch --settings GROUP=OPTION`)."""
    for g, name, schema, values, title in registered(shipped=False):
        if (g, name) == (group, option):
            rows = table(schema, values)
            head = f"{group}={option}: " + (title or " ".join((schema.__doc__ or "").split()))
            width = min(max((len(r[0]) + len(r[1]) for r in rows), default=0) + 3, COLUMN)
            lines = [f"  {n}={d}".ljust(width + 2) + f" {doc}" for n, d, doc in rows] or ["  (no settings)"]
            said = reasons(schema, values)
            why = [f"  {n}={d}: {said[n]}" for n, d, _ in rows if n in said]
            return "\n".join(textwrap.wrap(head, WIDTH) + lines + ["Why these defaults:"] * bool(why) + why)
    valid = [f"{g}={n}" for g, n, *_ in registered(shipped=False)]
    raise SpecResearchError(f"unknown option '{group}={option}': valid are {', '.join(valid)}")


def markdown() -> str:
    """docs/options.md: every option's settings, with their defaults and descriptions."""
    lines = ["# Options and their settings", "",
             "Every option of every config group, with each setting's default and description: generated from the "
             "settings dataclasses of `specresearch.options` (the one place a setting is declared) by "
             "`python -m specresearch.config`. One option's, in the terminal: "
             "`specresearch --settings drafter=pld`. Set any of them on the command line: `drafter.k=8`. "
             "`(in conf/)`: the value lives in conf/ (a node that configures no class of its own).", ""]
    for group in OPTIONS:
        lines += [f"## {group}", ""]
        for g, name, schema, values, title in registered():
            if g != group:
                continue
            lines += [f"### {group}={name}", "", title or " ".join((schema.__doc__ or "").split()), ""]
            rows = table(schema, values)
            if not rows:
                lines += ["No settings.", ""]
                continue
            lines += ["| setting | default | description |", "|---|---|---|"]
            lines += [f"| `{n}` | `{d}` | {_cell(doc)} |" for n, d, doc in rows] + [""]
            said = reasons(schema, values)
            why = [f"- `{n}={d}`: {said[n]}" for n, d, _ in rows if n in said]
            lines += ["Why these defaults:", "", *why, ""] if why else []
    return "\n".join(lines)


def reasons(schema: type, values: Any = None) -> dict[str, str]:
    """Why each default of `schema` is what it is (its CHOSEN lines), as `--settings` and docs/options.md
    print them: for a preset (`values`), of the settings it leaves at the schema's default only (its own
    values are its title's reason)."""
    reasons = chosen(schema)
    if values is None:
        return reasons
    own = {name: default for name, default, _ in table(schema)}
    return {name: reasons[name] for name, default, _ in table(schema, values) if name in reasons and own.get(name) == default}


def _cell(text: str) -> str:
    """Text in a Markdown table cell (a `|` would end the cell)."""
    return text.replace("|", "\\|")


def stale(root: Path, texts: dict[str, str] | None = None) -> list[str]:
    """The generated files of the checkout at `root` that differ from the dataclasses (or are missing);
    `texts`: `files()`, if already made."""
    texts = files() if texts is None else texts
    return [path for path, text in texts.items() if not (root / path).is_file() or _read(root / path) != text]


def _read(path: Path) -> str | None:
    """A generated file's text, or None where it is not UTF-8 (then it is out of date: rewriting it mends it)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def root_problem(root: Path) -> str | None:
    """Why `root` is no checkout to check or write conf/ and docs/options.md in (missing, a file, a folder without
    conf/config.yaml), or None."""
    if not root.exists():
        return "no such folder"
    if not root.is_dir():
        return "a file, not a folder"
    if not (root / "conf" / "config.yaml").is_file():
        return "no conf/config.yaml there"
    return None


def main(argv: list[str] | None = None) -> int:
    """`python -m specresearch.config` (which imports the classes the options build first)."""
    default = Path(__file__).resolve().parents[2]
    parser = argparse.ArgumentParser(prog="python -m specresearch.config", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=default, help="the checkout")
    parser.add_argument("--check", action="store_true", help="only name the files that are out of date (exit 1)")
    args = parser.parse_args(argv)
    problem = root_problem(args.root)
    if problem:  # before a check that would call every file out of date, or a write that fails on the first
        fail(f"--root {args.root}: {problem}: valid is a checkout, the folder holding conf/config.yaml (default {default})")
    if args.check:
        out = stale(args.root)
        for path in out:
            print(f"{path} is out of date: run python -m specresearch.config", file=sys.stderr)
        return 1 if out else 0
    texts = files()
    for path in stale(args.root, texts):  # only what changed: a sweep composing conf/ meanwhile never reads a file half written
        (args.root / path).parent.mkdir(parents=True, exist_ok=True)  # a new group's folder
        (args.root / path).write_text(texts[path], encoding="utf-8")
    return 0
