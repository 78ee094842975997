"""One notebook run under papermill, and where it stopped when it failed.

Prevents a notebook that failed half-way going unnoticed or unexplained: the run never
raises (any failure, a timeout or a dead kernel included, comes back as a status with the
exception's name, message and cleaned traceback), and `failed_cell` names the cell that
failed (or, for a timeout or a dead kernel, the last one that started) by its index among
the SOURCE notebook's cells, not among the cells papermill inserted.
"""

from __future__ import annotations

import json
import re
import traceback
from pathlib import Path
from typing import Any

from eagle3lab.report.kernel import execute_notebook
from eagle3lab.report.plan import Step, notebook_path

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def declared_parameters(plan: list[Step], notebooks_dir: Path) -> dict[str, dict | None]:
    """The parameters each of the plan's notebooks declares (papermill.inspect_notebook),
    by step name; None for a notebook that does not exist (yet)."""
    import papermill as pm

    out: dict[str, dict | None] = {}
    for s in plan:
        if s.kind == "notebook":
            p = notebook_path(notebooks_dir, s.name)
            out[s.name] = dict(pm.inspect_notebook(str(p))) if p.exists() else None
    return out


def error_info(exc: BaseException) -> dict[str, Any]:
    """Name, message (2000 characters at most) and traceback (ANSI codes removed, the last
    6000 characters) of an exception; papermill's own traceback when it carries one."""
    tb = getattr(exc, "traceback", None)
    text = "\n".join(tb) if isinstance(tb, list) else "".join(
        traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {"ename": getattr(exc, "ename", None) or type(exc).__name__,
            "evalue": str(getattr(exc, "evalue", None) or exc).strip()[:2000],
            "traceback": _ANSI.sub("", text)[-6000:]}


def run_notebook(src: Path, dst: Path, *, parameters: dict[str, Any], timeout_s: float,
                 kernel_name: str = "python3", cwd: Path | None = None) -> dict[str, Any]:
    """Execute `src` into `dst` with `parameters` (per-cell timeout, cell output logged to
    the `papermill` logger); returns {"status": "ok"} or {"status": "failed", "error",
    "failed_cell"}. Only KeyboardInterrupt propagates."""
    try:
        execute_notebook(str(src), str(dst), parameters=parameters,
                         kernel_name=kernel_name, execution_timeout=timeout_s,
                         log_output=True, progress_bar=False,
                         cwd=str(cwd) if cwd else None,
                         # the kernel's own start-up chatter (not cell output) stays quiet
                         extra_arguments=["--IPKernelApp.log_level=ERROR"])
        return {"status": "ok"}
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - any failure is recorded, the run goes on
        return {"status": "failed", "error": error_info(e), "failed_cell": failed_cell(dst)}


def failed_cell(nb_path: Path) -> dict[str, Any] | None:
    """Where an executed notebook stopped: the cell papermill marked with the exception,
    else (a timeout, a dead kernel) the last cell that started. Index among the source
    notebook's cells (counted from 0, markdown included), execution count, first line."""
    if not nb_path.exists():
        return None
    nb = json.loads(nb_path.read_text())
    added, last_started = 0, None  # added: cells papermill inserted (parameters, banner)
    for i, cell in enumerate(nb.get("cells", [])):
        tags = cell.get("metadata", {}).get("tags", [])
        if "injected-parameters" in tags or "papermill-error-cell-tag" in tags:
            added += 1
            continue
        pm_meta = cell.get("metadata", {}).get("papermill", {})
        if pm_meta.get("start_time"):
            last_started = (i, added, cell)
        if pm_meta.get("exception"):
            return _cell_info(i, added, cell)
    return _cell_info(*last_started) if last_started else None


def _cell_info(i: int, added: int, cell: dict) -> dict[str, Any]:
    src = "".join(cell.get("source", "")).strip().splitlines()
    err = next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)
    return {"cell_index": i - added, "executed_cell_index": i,
            "execution_count": cell.get("execution_count"),
            "source_first_line": src[0][:200] if src else "",
            "ename": err.get("ename") if err else None,
            "evalue": err.get("evalue") if err else None}
