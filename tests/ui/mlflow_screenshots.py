"""What a sweep looks like in the MLflow UI, in a real browser: runs a small sweep on the tiny model
into a fresh store, serves it with `mlflow ui`, and takes screenshots with headless Chromium
(Playwright driving Debian's /usr/bin/chromium).

    apt-get install chromium && pip install playwright
    python tests/ui/mlflow_screenshots.py [OUT_DIR]     # default: docs/mlflow

Screenshots: the first screen of the page a run names (first_screen.png: the runs table, the headline metrics as columns,
1400 x 900), the runs table with the sweep's parent expanded, the
chart view, the parent run's page (description = table of jobs), the compare page of the jobs (its
default axis is the first metric logged: speedup), the parent's sweep figure, and a job's
acceptance-by-position and time-split figures.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", "--disable-quic"]  # this machine's closed network refuses Chromium's own connections


def sweep(store: Path) -> str:
    """A three-job sweep of prompt lookup's k on the tiny model, recorded in `store`; the page its last line says to
    open (the runs table on `mlflow ui`'s default address, http://127.0.0.1:5000)."""
    done = subprocess.run([sys.executable, "-m", "specresearch", "-m", "model=tiny", "drafter=pld", "drafter.k=2,4,8",
                           "verifier=greedy", "dataset.num_prompts=3", f"tracker.store={store}", f"hydra.sweep.dir={store}/outputs/pld-k"],
                          check=True, cwd=store, capture_output=True, text=True)
    said = done.stdout.strip().splitlines()[-1]  # "sweep recorded as one parent run (...); browse it with: mlflow ui ... and open PAGE"
    return said.rsplit(" and open ", 1)[1]


def first_screen(page, address: str) -> None:
    """Open `address` (a runs page) in `page` and wait until its table shows the headline's columns."""
    page.goto(address)
    column(page, "speedup").wait_for(timeout=120_000)
    page.wait_for_timeout(1000)


def column(page, metric: str):
    """The runs table's header cell of `metric`."""
    return page.locator(f'[role="columnheader"][col-id="metrics.`{metric}`"]')


def serve(store: Path) -> tuple[subprocess.Popen, str]:
    """`mlflow ui` on the store, on a free port; returns the process and its address once it answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{store}/mlflow.db",
                               "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(url, timeout=1)
            return server, url
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise RuntimeError("mlflow ui did not answer in 60 s")


def screenshots(url: str, store: Path, out: Path, said: str) -> list[Path]:
    """Take the screenshots of the sweep in `store`, served at `url`, into `out`: first the page the sweep `said` to open
    as a 1400 x 900 browser shows it (first_screen.png)."""
    from mlflow import MlflowClient
    from playwright.sync_api import sync_playwright

    client = MlflowClient(f"sqlite:///{store}/mlflow.db")
    experiment = client.get_experiment_by_name("specresearch").experiment_id
    runs = client.search_runs([experiment])
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    job = next(r for r in runs if "mlflow.parentRunId" in r.data.tags)
    base = f"{url}/#/experiments/{experiment}"
    out.mkdir(parents=True, exist_ok=True)
    taken = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1800, "height": 950})

        def click(text: str) -> None:
            """Click the first element showing `text`, if there is one (the UI changes between releases)."""
            found = page.get_by_text(text, exact=True)
            if found.count():
                found.first.click()
                page.wait_for_timeout(800)

        def shot(name: str, address: str, wait: int = 3500, full: bool = False, artifact: str | None = None) -> None:
            page.goto(address)
            page.wait_for_timeout(wait)
            click("Got it")  # a first-visit tip
            if artifact:  # open its folder if it is closed, then the file
                folder, _, file = artifact.rpartition("/")
                if folder and not page.get_by_text(file, exact=True).count():
                    click(folder)
                click(file)
            page.screenshot(path=out / name, full_page=full)
            taken.append(out / name)

        first = browser.new_page(viewport={"width": 1400, "height": 900})
        first_screen(first, said.replace("http://127.0.0.1:5000", url))
        first.screenshot(path=out / "first_screen.png")
        taken.append(out / "first_screen.png")
        first_screen(page, said.replace("http://127.0.0.1:5000", url))
        close = page.locator("[aria-label='Close assistant'], [aria-label='Close']")
        if close.count():
            close.first.click()
        name = page.get_by_text(parent.info.run_name, exact=True)
        if name.count():  # the parent's row opens on its jobs: its expander is left of its name
            box = name.first.bounding_box()
            page.mouse.click(box["x"] - 30, box["y"] + box["height"] / 2)
            page.wait_for_timeout(1500)
        page.screenshot(path=out / "runs.png")
        taken.append(out / "runs.png")
        shot("charts.png", f"{base}/runs?compareRunsMode=CHART")
        shot("parent.png", f"{base}/runs/{parent.info.run_id}", full=True)
        jobs = json.dumps([r.info.run_id for r in runs if "mlflow.parentRunId" in r.data.tags])
        shot("compare.png", f"{url}/#/compare-runs?runs={urllib.parse.quote(jobs)}&experiments={urllib.parse.quote(json.dumps([experiment]))}")
        shot("parent_figure.png", f"{base}/runs/{parent.info.run_id}/artifacts", artifact="figures/sweep.png")
        shot("job_acceptance.png", f"{base}/runs/{job.info.run_id}/artifacts", artifact="figures/acceptance_by_position.png")
        shot("job_time_split.png", f"{base}/runs/{job.info.run_id}/artifacts", artifact="figures/time_split.png")
        browser.close()
    return taken


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else Path(__file__).resolve().parents[2] / "docs" / "mlflow").resolve()
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        said = sweep(store)
        server, url = serve(store)
        try:
            for path in screenshots(url, store, out, said):
                print(path)
        finally:
            server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
