"""The key-numbers contract between a notebook and the batch report.

Prevents the report from scraping printed text (which breaks silently when a notebook's
wording changes) and from showing numbers nobody can trace: a notebook's last cell calls
`record_summary(notebook, **numbers)`, which displays the numbers once as JSON under a
dedicated MIME type (read back from the executed .ipynb by `read_summary`) and once as a
readable table (what a person sees in the notebook and in its HTML rendering).

Values are JSON: numbers, strings, booleans, None, and lists of them (per-position
accuracies). numpy/torch scalars are converted; NaN and infinities become None.

`headline` turns the acceptance and live-server notebooks' numbers into the index's first
table, and prevents a headline measured in a slow configuration (a live arm in float32 at
x0.73 beside an offline x1.65 on the same machine): each speed-up is the one measured in
the machine's fastest configuration (`fastest`), named beside it, and a row measured in
another one says so; float32 exactness is its own row. `step_times` / `times_text`: the
per-step wall times a report prints at its end and keeps in report.json and the index.
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


# ---------------------------------------------------------------------------------------
# Per-step times (printed at the end of a report, kept in report.json and the index)
# ---------------------------------------------------------------------------------------
def step_times(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step, in plan order: name, kind, wall seconds (None when it did not run) and
    status (computed / reused / ok / failed / skipped / missing / not selected)."""
    return [{"step": e["name"], "kind": e["kind"], "seconds": e.get("wall_s"),
             "status": e.get("status") or "not run"} for e in steps]


def times_text(times: list[dict[str, Any]], total_s: float | None) -> str:
    """The per-step time table printed at the end of a report (and of `make demo`): one
    line per step, then the total wall time. Steps that did not run show "-"."""
    width = max([len(t["step"]) for t in times] + [len("total")])
    lines = ["per-step times:", f"  {'step'.ljust(width)}  {'kind':8}  {'seconds':>8}  status"]
    for t in times:
        secs = "-" if t["seconds"] is None else f"{t['seconds']:.1f}"
        lines.append(f"  {t['step'].ljust(width)}  {t['kind']:8}  {secs:>8}  {t['status']}")
    failed = sum(t["status"] == "failed" for t in times)
    total = "-" if total_s is None else f"{total_s:.1f}"
    lines.append(f"  {'total'.ljust(width)}  {'':8}  {total:>8}  "
                 + (f"{failed} failed" if failed else "ok"))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# The index's headline: what a newcomer reads first
# ---------------------------------------------------------------------------------------
#: Notebooks the headline reads (their `record_summary` keys below).
OFFLINE, LIVE = "05_acceptance", "04_live_server"


def fastest(candidates: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The candidate measured in the machine's fastest configuration: among those with a
    speed-up, the last one flagged `fast` (the configuration its notebook runs as this
    machine's fastest: bf16 on one thread on a CPU with native bf16, notebook 05's speed
    section and notebook 04's arms with dtype "auto"), else the first one. Plain tokens/s
    are not compared across candidates: they were measured on other answer lengths."""
    measured = [c for c in candidates if c.get("speedup") is not None]
    fast = [c for c in measured if c.get("fast")]
    return fast[-1] if fast else (measured[0] if measured else None)


def _config_text(c: dict[str, Any]) -> str:
    parts = []
    if c.get("plain_tokens_per_s") is not None and c.get("spec_tokens_per_s") is not None:
        parts.append(f"{c.get('plain_name', 'plain')} {c['plain_tokens_per_s']:.1f} -> "
                     f"speculative {c['spec_tokens_per_s']:.1f} tok/s")
    if c.get("accept") is not None:
        parts.append(f"{c.get('accept_name', 'tau')} {c['accept']:.2f}")
    label = c["config"] + ("" if c.get("fast") else " (not this machine's fastest "
                           "configuration)")
    return f"{label}: " + ", ".join(parts) if parts else label


def _speed_row(what: str, source: str, candidates: list[dict[str, Any]]) -> dict | None:
    best = fastest(candidates)
    if best is None:
        return None
    others = [f"{c['config']}: x{c['speedup']:.2f}"
              for c in candidates if c is not best and c.get("speedup") is not None]
    return {"what": what, "source": source, "value": best["speedup"],
            "text": f"x{best['speedup']:.2f}", "config": best["config"],
            "fast": bool(best.get("fast")),
            "detail": _config_text(best)
            + (f"; also measured: {'; '.join(others)}" if others else "")}


def offline_candidates(s: dict[str, Any]) -> list[dict[str, Any]]:
    """Notebook 05's configurations: its main measurement (the notebook's dtype: float32
    on a CPU, exact) and, when its speed section ran, the machine's fastest configuration
    (flagged `fast`)."""
    out = [{"config": s.get("config") or "the notebook's dtype",
            "speedup": s.get("speedup_measured"),
            "plain_tokens_per_s": s.get("plain_tokens_per_s"),
            "spec_tokens_per_s": s.get("spec_tokens_per_s"), "accept": s.get("tau")}]
    if s.get("fast_config"):
        out.append({"config": s["fast_config"], "speedup": s.get("fast_speedup_measured"),
                    "plain_tokens_per_s": s.get("fast_plain_tokens_per_s"),
                    "spec_tokens_per_s": s.get("fast_spec_tokens_per_s"),
                    "accept": s.get("fast_tau"), "fast": True})
    return out


def live_candidates(s: dict[str, Any]) -> list[dict[str, Any]]:
    """Notebook 04's one configuration (both servers run it), `fast` when the notebook
    recorded it as the machine's fastest (`fast_config`)."""
    return [{"config": s.get("config") or "the notebook's configuration",
             "speedup": s.get("speedup"), "plain_tokens_per_s": s.get("baseline_tokens_per_s"),
             "spec_tokens_per_s": s.get("spec_tokens_per_s"), "fast": bool(s.get("fast_config")),
             "accept": s.get("accept_length"), "accept_name": "accept length",
             "plain_name": "baseline"}]


def headline(summaries: dict[str, dict[str, Any] | None]) -> list[dict[str, Any]]:
    """The index's headline rows from the notebooks' key numbers (`summaries`: notebook
    name -> its `read_summary`): the offline speed-up and the live server's, each in the
    machine's fastest configuration measured (`fastest`; a row in another one says so),
    and the exactness of speculative decoding (the first drafter's outputs equal to plain
    greedy) as its own row, in the configuration it was checked in (float32 on a CPU).
    Each row: what, source (notebook), value, text (for reading), config, fast, detail. A
    notebook that recorded nothing gives no row."""
    rows = []
    off, live = summaries.get(OFFLINE) or {}, summaries.get(LIVE) or {}
    if off:
        row = _speed_row("offline speed-up (speculative vs plain decoding)", OFFLINE,
                         offline_candidates(off))
        if row:
            rows.append(row)
    if live:
        row = _speed_row(f"live server speed-up ({live.get('engine') or 'server'}: "
                         f"speculative vs baseline server)", LIVE, live_candidates(live))
        if row:
            rows.append(row)
    if off.get("same_as_plain") is not None:
        config = off.get("config") or "the notebook's dtype"
        rows.append({"what": "exactness: outputs equal to plain greedy (prompts)",
                     "source": OFFLINE, "value": off["same_as_plain"],
                     "text": str(off["same_as_plain"]), "config": config, "fast": False,
                     "detail": f"{config}: the first drafter's speculative outputs, "
                               f"compared token for token with plain greedy decoding"})
    return rows


def index_tables(steps: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """What a report records beside its steps for the index: `times` (`step_times`) and
    `headline` (`headline` over the notebooks' summaries)."""
    return {"times": step_times(steps),
            "headline": headline({e["name"]: e.get("summary") for e in steps
                                  if e["kind"] == "notebook"})}
