"""The key-numbers contract between a notebook and the batch report.

Prevents the report from scraping printed text (which breaks silently when a notebook's
wording changes) and from showing numbers nobody can trace: a notebook's last cell calls
`record_summary(notebook, **numbers)`, which displays the numbers once as JSON under a
dedicated MIME type (read back from the executed .ipynb by `read_summary`) and once as a
readable table (what a person sees in the notebook and in its HTML rendering).

Values are JSON: numbers, strings, booleans, None, and lists of them (per-position
accuracies). numpy/torch scalars are converted; NaN and infinities become None.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any

#: The MIME type of the machine-readable summary output.
MIME = "application/vnd.eagle3lab.summary+json"


def _clean(value: Any, where: str) -> Any:
    """A JSON-safe copy of `value` (numpy/torch scalars and arrays become Python values)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v, where) for v in value]
    if hasattr(value, "tolist"):  # numpy / torch scalars and arrays
        return _clean(value.tolist(), where)
    if hasattr(value, "item"):
        return _clean(value.item(), where)
    raise TypeError(f"record_summary: {where} is a {type(value).__name__}; give a number, "
                    f"string, bool, None or a list of them.")


def format_value(value: Any, *, digits: int = 4, compact: bool = False) -> str:
    """How a table shows one value: `digits` significant digits, lists joined. compact
    (the index page, for reading): numbers of a million and more as 31.5M / 1.2G."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)) and compact and abs(value) >= 1e6:
        for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
            if abs(value) >= scale:
                return f"{value / scale:.{digits}g}{suffix}"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list):
        return (" / ".join(format_value(v, digits=digits, compact=compact) for v in value)
                if value else "none")
    if isinstance(value, dict):
        return "none" if not value else ", ".join(f"{k}: {format_value(v, digits=digits, compact=compact)}"
                         for k, v in value.items())
    return str(value)


def summary_bundle(notebook: str, numbers: dict[str, Any]) -> dict[str, Any]:
    """The display bundle: the JSON under MIME, plus text/plain and text/html tables."""
    clean = {k: _clean(v, k) for k, v in numbers.items()}
    # "order": executed notebooks are saved with sorted keys; the index keeps the call's order
    payload = {"notebook": notebook, "numbers": clean, "order": list(clean)}
    width = max((len(k) for k in clean), default=0)
    text = "\n".join([f"key numbers ({notebook})"]
                     + [f"  {k.ljust(width)}  {format_value(v)}" for k, v in clean.items()])
    rows = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
                   f"<td style='text-align:left'>{html.escape(format_value(v))}</td></tr>"
                   for k, v in clean.items())
    table = (f"<table class='eagle3lab-summary'><caption>Key numbers ({html.escape(notebook)})"
             f"</caption>{rows}</table>")
    return {MIME: payload, "text/plain": text, "text/html": table}


def record_summary(notebook: str, **numbers: Any) -> None:
    """Show this notebook's key numbers; the batch report reads them back. Call it in the
    notebook's last cell, e.g. `record_summary("05_acceptance", tau=2.1, speedup=1.4)`.
    Returns None (so the cell shows the table once, not a repr as well)."""
    from IPython.display import display

    display(summary_bundle(notebook, numbers), raw=True)


def read_summary(nb: Any) -> dict[str, Any] | None:
    """The numbers recorded in an executed notebook (a dict from json/nbformat, or a
    path), merged in order if recorded more than once; None when nothing was recorded."""
    if not isinstance(nb, dict):
        with open(nb, encoding="utf-8") as f:
            nb = json.load(f)
    found: dict[str, Any] | None = None
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []) or []:
            data = out.get("data") or {}
            if MIME in data:
                payload = data[MIME]
                if isinstance(payload, str):
                    payload = json.loads(payload)
                numbers = payload.get("numbers", {})
                order = [k for k in payload.get("order", []) if k in numbers]
                numbers = {**{k: numbers[k] for k in order}, **numbers}
                found = {**(found or {}), **numbers}
    return found
