"""`python -m specresearch.analysis experiment=NAME [tracker.store=PATH] [tracker.uri=URI] [out=DIR] [data=PATH] [merge=true]
[save=true] [log=true]`

Reads the runs of study NAME from MLflow, writes its tables (markdown and LaTeX) and figures
(PNG) into DIR (default `outputs/analysis/NAME` under the working directory) and prints the markdown.
It only reads the store: `log=true` also logs the folder to the study's latest sweep parent run
(artifacts under `analysis/`).

`save=true` also commits what was read: docs/results/data/study-NAME.json (the first table as a
results page, the others and the figures after it, the runs under `data`) and its figures under
docs/results/figures/. Where the store holds no run of the study (a fresh clone), the runs come from
that committed file, and the header says so; `data=PATH` reads a committed file instead of MLflow;
`merge=true` adds the store's runs to the committed ones (a study resumed on another machine, whose new cells
must not replace the committed ones on `save`: a config run in both keeps its latest run).

`tracker.*` means what it means for `python -m specresearch`: the defaults come from the same
config (conf/, composed with Hydra, the study's preset included), so `tracker.store`
and `tracker.experiment` name the same store and MLflow experiment the runs were logged to.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from specresearch.analysis.format import latex, markdown
from specresearch.analysis.report import Report
from specresearch.analysis.runs import AnalysisError, Study, committed, load_committed, load_study, merged, runs_record
from specresearch.analysis.studies import analysed, builder

from specresearch.config import STUDY_GROUP, compose
from specresearch.tracking import store_path_problem, write_problem

COMMAND = "python -m specresearch.analysis"
USAGE = (f"{COMMAND} experiment=NAME [tracker.store=PATH] [tracker.uri=URI] [tracker.experiment=NAME] [out=DIR] [data=PATH] "
         "[merge=true] [save=true] [log=true]")
OUT_ROOT = Path("outputs") / "analysis"  # under the working directory, beside Hydra's outputs of the runs


def parse(argv: list[str]) -> tuple[str, dict[str, str], Path | None, Path | None, bool, bool, bool]:
    """key=value arguments -> (study, tracker overrides, output folder or None, committed data or None, save, merge, log)."""
    study, tracker, out, data = None, {}, None, None
    flags = dict(save=False, merge=False, log=False)
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or not value:
            raise AnalysisError(f"expected key=value, got '{arg}': {USAGE}")
        if key in ("experiment", "study"):
            study = value
        elif key == "out":
            out = Path(value)
        elif key == "data":
            data = Path(value)
        elif key in flags:
            if value.lower() not in ("true", "false"):
                raise AnalysisError(f"{key} must be true or false, got '{value}'")
            flags[key] = value.lower() == "true"
        elif key.startswith("tracker.") and len(key) > len("tracker."):
            tracker[key.removeprefix("tracker.")] = value
        else:
            raise AnalysisError(f"unknown argument '{key}': valid are experiment=NAME, tracker.KEY=VALUE (store, uri, "
                                f"experiment), out=DIR, data=PATH, merge=true, save=true, log=true")
    if study is None:
        raise AnalysisError(f"name a study: {USAGE}, NAME one of {', '.join(analysed())}")
    if study not in analysed():
        raise AnalysisError(f"unknown study '{study}': valid are {', '.join(analysed())}")
    return study, tracker, out, data, flags["save"], flags["merge"], flags["log"]


def tracker_target(study: str, overrides: dict[str, str]) -> tuple[str, str]:
    """(tracking URI, MLflow experiment) from the config composed as for the runs (the study's preset
    included), with `tracker.*` overrides.

    `tracker.uri` is taken as it is when the tracker config has no such key (a remote server,
    `sqlite:///...`); any other key the tracker config lacks is an error that lists the valid ones.
    """
    from hydra.utils import instantiate
    from omegaconf import OmegaConf, open_dict

    cfg = compose([f"{STUDY_GROUP}={study}"])
    node = cfg.tracker
    if not str(node.get("_target_", "")).endswith("MLflowTracker"):
        raise AnalysisError(f"the analysis reads MLflow, but the config's tracker is {node.get('_target_')}: use tracker=mlflow")
    uri = None
    for key, value in overrides.items():
        if key in node and key != "_target_":
            with open_dict(node):  # set as a string: paths and URIs need no Hydra override grammar
                OmegaConf.update(node, key, value, merge=False)
        elif key == "uri":
            uri = value
        else:
            valid = ", ".join(f"tracker.{k}" for k in dict.fromkeys([*node.keys(), "uri"]) if k != "_target_")
            raise AnalysisError(f"unknown argument 'tracker.{key}': valid are {valid}")
    tracker = instantiate(node)
    problem = store_path_problem(tracker.store) if uri is None and tracker.local else None
    if problem:
        raise AnalysisError(problem)
    return uri or tracker.uri, tracker.experiment


def analyse(study: str, uri: str, experiment: str = "specresearch", out: Path | None = None,
            log: bool = False, data: Path | None = None, save: bool = False, merge: bool = False) -> tuple[Study, Report, Path]:
    """Build a study's tables and figures from MLflow (or committed data) and write them to `out`; with `log`, log
    them to its sweep parent too (else the store is only read).

    Args:
        study: the study's name (a folder of experiments/ with an analysis.py).
        uri: MLflow tracking URI.
        experiment: the MLflow experiment the runs are in.
        out: output folder; None = outputs/analysis/STUDY under the working directory.
        log: log the folder as artifacts `analysis/` of the study's latest sweep parent run (`log=true`).
        data: read the runs from this committed file (`save`) instead of MLflow; without it, the study's committed
            file serves where the store holds none of its runs.
        save: commit the runs read and the tables built (`commit`).
        merge: add the store's runs to the study's committed ones (`runs.merged`) instead of reading the store alone.

    Returns:
        (the runs read, the report built, the output folder).
    """
    from specresearch import figures

    build = builder(study)
    out = Path(out) if out is not None else OUT_ROOT / study
    problem = write_problem(out)  # (a file there: "is not a folder")
    if problem:  # before the runs are read and the tables computed
        raise AnalysisError(f"cannot write the tables to {out} (out=DIR): {problem}")
    source = f"MLflow ({uri}, experiment '{experiment}')"
    if data is not None:
        runs, source = load_committed(study, data), f"the committed runs in {data.name}"
    else:
        try:
            runs = load_study(study, uri, experiment)
            if merge and committed(study).is_file():
                runs = merged(load_committed(study, committed(study)), runs)
                source += f" with the committed runs in {committed(study).name}"
        except AnalysisError as err:
            if not committed(study).is_file():
                raise
            runs, source = load_committed(study, committed(study)), f"the committed runs in {committed(study).name} ({err})"
    report = build(runs)
    if runs.superseded:
        report.notes.append(f"{len(runs.superseded)} earlier run(s) of a config that ran again later were left out "
                            f"(the latest counts): {', '.join(r.id for r in runs.superseded)}")
    if runs.unfinished:
        report.notes.append(f"{len(runs.unfinished)} job run(s) not FINISHED were left out: "
                            + ", ".join(f"{r.id} ({r.status})" for r in runs.unfinished))
    out.mkdir(parents=True, exist_ok=True)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = f"Study `{study}`: tables from {source}, {len(runs.runs)} runs, made {when} by `{COMMAND} experiment={study}`."
    measured = [t for t in report.tables if not t.published]
    published = [t for t in report.tables if t.published]
    md = [f"# {study}", "", header, ""] + [f"> {n}" for n in report.notes] + ([""] if report.notes else [])
    md += ["## Measured here", ""] + [markdown(t) for t in measured]
    if published:
        md += ["## Published numbers (not measured here: other models, tasks, hardware)", ""] + [markdown(t) for t in published]
    (out / "tables.md").write_text("\n".join(md))
    tex = [f"% {header}", "% needs \\usepackage{booktabs}", ""] + [latex(t) for t in measured]
    if published:
        tex += ["% Published numbers (not measured here)", ""] + [latex(t) for t in published]
    (out / "tables.tex").write_text("\n".join(tex))
    for name, fig in report.figures.items():
        fig.savefig(out / name, dpi=120)
        figures.close(fig)
    provenance = dict(study=study, uri=uri, experiment=experiment, made=when,
                      parent=runs.parent.id if runs.parent else None,
                      runs=[dict(id=r.id, config_hash=r.config_hash, kind="quality" if r.quality else "speed") for r in runs.runs],
                      superseded=[r.id for r in runs.superseded], unfinished=[r.id for r in runs.unfinished],
                      files=sorted(["tables.md", "tables.tex", *report.figures]))
    (out / "runs.json").write_text(json.dumps(provenance, indent=2))
    if save:
        commit(runs, report, out, when)
    if log and runs.parent is not None and not runs.uri.startswith("committed:"):
        import mlflow

        mlflow.MlflowClient(tracking_uri=uri).log_artifacts(runs.parent.id, str(out), artifact_path="analysis")
    return runs, report, out


def commit(runs: Study, report: Report, out: Path, when: str) -> Path:
    """docs/results/data/study-NAME.json: the first measured table as a results report (the page), the other
    tables and the figures (copied to docs/results/figures/) after it, the runs under `data`; returns its path."""
    import shutil

    from specresearch import reports

    path = committed(runs.name)
    stem = path.stem
    figures = []
    for name in report.figures:
        shutil.copy(out / name, path.parent.parent / "figures" / f"{stem}-{name}")
        figures.append(f"![{name.removesuffix('.png').replace('_', ' ')}](figures/{stem}-{name})")
    measured = [t for t in report.tables if not t.published]
    published = [t for t in report.tables if t.published]
    first = measured[0]
    extra = [markdown(t).replace("### ", "## ", 1) for t in measured[1:]] + figures
    if published:
        extra += ["## Published numbers (not measured here: other models, tasks, hardware)", ""]
        extra += [markdown(t) for t in published]
    machine = "; ".join(sorted({f"{r.tags.get('specresearch.processor', '?')}, {r.tags.get('specresearch.threads', '?')} threads, "
                                f"{r.tags.get('specresearch.dtype', '?')}, torch {r.tags.get('specresearch.torch', '?')}"
                                for r in runs.runs}))
    record = dict(title=first.title, date=when[:10], machine=machine, topic="studies",
                  command=[f"python -m specresearch experiment={runs.name}", f"{COMMAND} experiment={runs.name} save=true"],
                  columns=first.headers, rows=first.cells, prompts=first.caption,
                  notes=[*report.notes, *first.notes], extra="\n\n".join(extra), data=runs_record(runs))
    reports.checked(record, str(path))
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0
    try:
        study, tracker, out, data, save, merge, log = parse(argv)
        uri, experiment = tracker_target(study, tracker)
        runs, report, folder = analyse(study, uri, experiment, out, log=log, data=data, save=save, merge=merge)
    except AnalysisError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print((folder / "tables.md").read_text())
    print(f"wrote {folder}/: {', '.join(sorted(p.name for p in folder.iterdir() if p.is_file()))}")
    if save:
        print(f"committed the runs and tables to {committed(study)} (its page: docs/results/{committed(study).stem}.md)")
    if runs.uri.startswith("committed:"):
        print("read from committed data: nothing logged to MLflow")
    elif not log:
        print("the store was only read (log=true logs this folder to the study's latest sweep parent run)")
    elif runs.parent is not None:
        print(f"logged to MLflow run {runs.parent.id} (the study's latest sweep parent), artifacts under analysis/")
    else:
        print("no sweep parent run found for this study: nothing logged back to MLflow")
    return 0


if __name__ == "__main__":
    sys.exit(main())
