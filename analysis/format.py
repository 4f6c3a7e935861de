"""Tables as data (records + column specs) rendered to markdown and LaTeX (booktabs), and the number
formats every table shares: a missing or NaN value is always "–"."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

DASH = "–"


def missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def num(x: Any, digits: int = 2) -> str:
    """A number with `digits` decimals; "–" for None/NaN."""
    return DASH if missing(x) else f"{float(x):.{digits}f}"


def num3(x: Any) -> str:
    return num(x, 3)


def signed(x: Any, digits: int = 3) -> str:
    return DASH if missing(x) else f"{float(x):+.{digits}f}"


def speed(x: Any) -> str:
    """A speedup: "1.23×"."""
    return DASH if missing(x) else f"{float(x):.2f}×"


def integer(x: Any) -> str:
    return DASH if missing(x) else f"{int(x)}"


def pvalue(p: Any) -> str:
    """Two significant digits: 0.0012, 0.17, 1."""
    return DASH if missing(p) else f"{float(p):.2g}"


def temperature(t: Any) -> str:
    return DASH if missing(t) else f"{float(t):g}"


def with_ci(value: Any, low: Any, high: Any, digits: int = 3) -> str:
    """"+0.194 [+0.097, +0.290]" (a value and its confidence interval)."""
    if missing(value):
        return DASH
    ci = f" [{signed(low, digits)}, {signed(high, digits)}]" if not (missing(low) or missing(high)) else ""
    return signed(value, digits) + ci


def speed_tau(pair: tuple[Any, Any] | None) -> str:
    """Spec-Bench's cell: "1.23× (τ 2.10)"."""
    if pair is None or missing(pair[0]):
        return DASH
    s, tau = pair
    return speed(s) + ("" if missing(tau) else f" (τ {float(tau):.2f})")


def text(x: Any) -> str:
    return DASH if missing(x) or x == "" else str(x)


@dataclass
class Col:
    """One column: its header, where its value comes from (a record key or a function of the
    record), how it is printed, and its LaTeX alignment."""

    header: str
    key: str | Callable[[dict], Any]
    fmt: Callable[[Any], str] = text
    align: str = "r"

    def value(self, record: dict) -> Any:
        return self.key(record) if callable(self.key) else record.get(self.key)


@dataclass
class Table:
    """A table: the raw records (what the tests compare with MLflow) and how to print them.

    Args:
        name: file-safe identifier (LaTeX label `tab:NAME`).
        title: one line naming the table.
        caption: what it is, how many runs, the machine facts the runs carry.
        columns: the columns, left to right.
        records: one dict per row, raw values (floats, NaN for missing).
        notes: lines printed under the table (sources of published numbers, remarks).
        published: numbers copied from papers, not measured here: printed in their own section.
    """

    name: str
    title: str
    caption: str
    columns: list[Col]
    records: list[dict]
    notes: list[str] = field(default_factory=list)
    published: bool = False

    @property
    def headers(self) -> list[str]:
        return [c.header for c in self.columns]

    @property
    def cells(self) -> list[list[str]]:
        return [[c.fmt(c.value(r)) for c in self.columns] for r in self.records]

    def column(self, header: str) -> list[str]:
        """The printed cells of one column."""
        i = self.headers.index(header)
        return [row[i] for row in self.cells]


def markdown(table: Table) -> str:
    """The table as GitHub markdown: a heading, the caption in italics, the grid, the notes."""
    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"

    lines = [f"### {table.title}", "", f"*{table.caption}*", "", row(table.headers),
             "|" + "|".join("---" if c.align == "l" else "---:" for c in table.columns) + "|"]
    lines += [row(cells) for cells in table.cells] or [row([DASH] * len(table.columns))]
    if table.notes:
        lines += [""] + [f"{note}  " for note in table.notes]
    return "\n".join(lines) + "\n"


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "|": r"\textbar{}", "<": r"\textless{}", ">": r"\textgreater{}"}
_LATEX_UNICODE = {"×": r"$\times$", "τ": r"$\tau$", "α": r"$\alpha$", "ε": r"$\varepsilon$", "Δ": r"$\Delta$",
                  "–": "--", "—": "---", "≥": r"$\geq$", "≤": r"$\leq$", "±": r"$\pm$", "→": r"$\rightarrow$",
                  "·": r"$\cdot$", "Σ": r"$\Sigma$", "≈": r"$\approx$", "−": "-", "“": "``", "”": "''", "’": "'"}
_SPECIAL_RE = re.compile("|".join(re.escape(c) for c in _LATEX_SPECIAL))


def latex_escape(s: str) -> str:
    """Escape LaTeX's special characters and spell the Greek letters and symbols we print as math."""
    s = _SPECIAL_RE.sub(lambda m: _LATEX_SPECIAL[m.group()], s)
    return "".join(_LATEX_UNICODE.get(ch, ch) for ch in s)


def latex(table: Table) -> str:
    """The table as a LaTeX `table` float with booktabs rules (\\usepackage{booktabs})."""
    cells = table.cells
    width = [max((len(row[i]) for row in cells), default=0) for i in range(len(table.columns))]
    spec = "".join(r"p{0.3\linewidth}" if c.align == "l" and w > 40 else c.align for c, w in zip(table.columns, width))
    lines = [r"\begin{table}[ht]", r"\centering", r"\small",
             rf"\caption{{{latex_escape(table.title)}. {latex_escape(table.caption)}}}",
             rf"\label{{tab:{table.name}}}", rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
             " & ".join(latex_escape(h) for h in table.headers) + r" \\", r"\midrule"]
    lines += [" & ".join(latex_escape(c) for c in row) + r" \\" for row in cells]
    lines.append(r"\bottomrule")
    lines.append(r"\end{tabular}")
    if table.notes:
        lines.append(r"\par\smallskip\footnotesize " + r" \\ ".join(latex_escape(n) for n in table.notes))
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"
