"""Batch reports: the pipeline's stages and notebooks, run in order, rendered and indexed.

Prevents the unshareable research run: a stage computed by hand, a notebook that failed
half-way without anyone noticing, numbers nobody can trace to parameters and versions.
`run_report` runs the plan (eagle3lab.report.plan.PLAN) on one parameters file: library
stages in a shared work dir (reused when complete), then each notebook under papermill
with the parameters it declares (execution timeout per cell, cell outputs logged), writing
into the report directory:

  NAME.ipynb     the executed notebook (failed ones too: the error cell is marked)
  NAME.html      report mode: code hidden, images embedded, no scripts
  index.html     self-contained summary: the headline numbers (eagle3lab.report.summary.
                 headline), status, key figures and numbers, per-step times, failures,
                 parameters, versions
  report.json    the same data, machine-readable
  report.log     progress lines and papermill's logged cell output

At the end the per-step time table (eagle3lab.report.summary.times_text) is printed and
logged; report.json keeps it as "times".

A failing step skips only the steps that depend on it; notebooks that are not in
notebooks/ yet are listed as missing. Key numbers come from `record_summary` outputs
(eagle3lab.report.summary), never from scraping text. This module only orchestrates: one
notebook's run is eagle3lab.report.execute, the versions recorded are
eagle3lab.report.environment, the wiring is eagle3lab.report.plan.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from eagle3lab.config import repo_root
from eagle3lab.errors import UserError
from eagle3lab.report.environment import versions
from eagle3lab.report.execute import declared_parameters, error_info, run_notebook
from eagle3lab.report.figures import key_figure
from eagle3lab.report.html import render_index, render_notebook
from eagle3lab.report.params import notebook_parameters, parse_params
from eagle3lab.report.pipeline import run_stage
from eagle3lab.report.plan import (PLAN, Step, check_plan, notebook_path, selected_steps,
                                   wiring_context)
from eagle3lab.report.summary import index_tables, read_summary, times_text
from eagle3lab.workdir import WorkDir

REPORT_FORMAT = "eagle3lab-report"
REPORT_VERSION = 1
#: Default execution timeout per notebook cell (seconds).
DEFAULT_TIMEOUT_S = 1800.0


def default_out_dir() -> Path:
    return repo_root() / "reports" / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")


class _Log:
    """Progress lines to the console and the log file; papermill's cell output to the file."""

    def __init__(self, path: Path, echo: Callable[[str], None] | None):
        self.echo = echo
        self.handler = logging.FileHandler(path, encoding="utf-8")
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
        self.pm_logger = logging.getLogger("papermill")
        self.old_level = self.pm_logger.level
        self.pm_logger.addHandler(self.handler)
        self.pm_logger.setLevel(logging.INFO)
        self.logger = logging.getLogger("eagle3lab.report.run")
        self.logger.addHandler(self.handler)
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False

    def __call__(self, line: str) -> None:
        self.logger.info(line)
        if self.echo:
            self.echo(line)

    def close(self) -> None:
        self.pm_logger.removeHandler(self.handler)
        self.pm_logger.setLevel(self.old_level)
        self.logger.removeHandler(self.handler)
        self.handler.close()


def run_report(
    *, params: str | os.PathLike | dict | None = None, only: list[str] | None = None,
    out: str | os.PathLike | None = None, timeout_s: float | None = None,
    notebooks_dir: str | os.PathLike | None = None, plan: list[Step] | None = None,
    kernel_name: str = "python3", progress: bool = True,
    echo: Callable[[str], None] | None = print,
) -> dict[str, Any]:
    """Run the plan's stages and notebooks with `params` (a YAML file or a dict) into `out`
    (default reports/<timestamp>); returns the report data (also written as report.json).

    only: step names (or unique prefixes) to run; the stages they need always run (and are
    reused when complete). timeout_s: per-cell execution timeout (default: the file's
    report.timeout_s, else 1800 s). notebooks_dir / plan: for tests and other studies.
    """
    plan = list(plan if plan is not None else PLAN)
    check_plan(plan)
    nb_dir = Path(notebooks_dir) if notebooks_dir else repo_root() / "notebooks"
    chosen = selected_steps(plan, only)
    declared = declared_parameters(plan, nb_dir)
    rp = parse_params(params, plan, declared)
    timeout = float(timeout_s or rp.timeout_s or DEFAULT_TIMEOUT_S)
    out_dir = Path(out) if out else default_out_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    out_dir = out_dir.resolve()
    work = rp.pipeline.work_path().resolve()
    scratch = Path(tempfile.mkdtemp(prefix="eagle3lab-report-"))  # removed at the end
    ctx = wiring_context(work=WorkDir(work), target=rp.pipeline.target,
                         device=rp.pipeline.device, out=out_dir, scratch=scratch)
    # Idle OpenMP threads sleep instead of spinning: on a small shared CPU, spinning
    # threads of one process stall the others (kernels inherit this environment).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    log = _Log(out_dir / "report.log", echo)
    t_start = time.time()
    report: dict[str, Any] = {
        "format": REPORT_FORMAT, "version": REPORT_VERSION,
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "out": str(out_dir), "work_dir": str(work), "params_file": rp.source,
        "params": rp.raw, "pipeline": rp.pipeline.model_dump(),
        "description": rp.description, "timeout_s": timeout, "only": only,
        "notebooks_dir": str(nb_dir), "versions": versions(), "steps": [], "notes": [],
    }
    extra = sorted(p.stem for p in nb_dir.glob("*.ipynb")
                   if p.stem not in {s.name for s in plan})
    if extra:
        report["notes"].append(f"notebooks not in the plan (not run): {', '.join(extra)}")
    status: dict[str, str] = {}
    thumbnails: dict[str, str] = {}  # step -> key figure thumbnail (the index embeds it)
    n = len(plan)
    try:
        log(f"report: {n} steps -> {out_dir} (work dir {work}, timeout {timeout:.0f} s/cell)")
        for i, step in enumerate(plan, 1):
            entry: dict[str, Any] = {"name": step.name, "kind": step.kind,
                                     "deps": list(step.deps), "about": step.about,
                                     "status": None, "wall_s": None}
            report["steps"].append(entry)
            tag = f"[{i}/{n}] {step.kind} {step.name}"
            blocked = [d for d in step.deps if status.get(d) in ("failed", "skipped", "missing")]
            if step.name not in chosen:
                entry["status"] = status[step.name] = "not selected"
                continue
            if step.kind == "notebook" and declared.get(step.name) is None:
                entry["status"] = status[step.name] = "missing"
                entry["reason"] = f"{notebook_path(nb_dir, step.name)} does not exist (yet)"
                log(f"{tag}: missing ({entry['reason']})")
                continue
            if blocked:
                entry["status"] = status[step.name] = "skipped"
                entry["reason"] = "needs " + ", ".join(f"{d} ({status[d]})" for d in blocked)
                log(f"{tag}: skipped, {entry['reason']}")
                continue
            t0 = time.time()
            if step.kind == "stage":
                _run_stage(step, rp, entry, tag, log, progress)
            else:
                params_used, notes = notebook_parameters(step, rp, declared[step.name], ctx)
                entry["parameters"] = params_used
                entry["notes"] = notes
                for note in notes:
                    log(f"{tag}: warning: {note}")
                log(f"{tag}: running with {len(params_used)} parameter(s)")
                nb_out = out_dir / f"{step.name}.ipynb"
                entry.update(run_notebook(notebook_path(nb_dir, step.name), nb_out,
                                          parameters=params_used, timeout_s=timeout,
                                          kernel_name=kernel_name, cwd=out_dir))
                if nb_out.exists():
                    entry["ipynb"] = nb_out.name
                    entry["summary"] = read_summary(nb_out)
                    if (kf := key_figure(nb_out)) is not None:
                        entry["key_figure"] = kf.record()
                        thumbnails[step.name] = kf.thumbnail()
                    try:
                        render_notebook(nb_out, out_dir / f"{step.name}.html")
                        entry["html"] = f"{step.name}.html"
                    except Exception as e:  # noqa: BLE001 - a rendering bug must not hide results
                        entry.setdefault("notes", []).append(f"HTML rendering failed: {e}")
            entry["wall_s"] = round(time.time() - t0, 2)
            status[step.name] = entry["status"]
            log(f"{tag}: {entry['status']} in {entry['wall_s']:.1f} s"
                + (f" -> {entry['html']}" if entry.get("html") else "")
                + (f"; {entry['error']['ename']}: {entry['error']['evalue'][:300]}"
                   if entry.get("error") else ""))
    finally:
        report["wall_s"] = round(time.time() - t_start, 2)
        counts: dict[str, int] = {}
        for e in report["steps"]:
            counts[e["status"] or "not run"] = counts.get(e["status"] or "not run", 0) + 1
        report["counts"] = counts
        report["ok"] = not any(e["status"] == "failed" for e in report["steps"])
        report.update(index_tables(report["steps"]))
        (out_dir / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        render_index(report, out_dir / "index.html", thumbnails)
        log(times_text(report["times"], report["wall_s"]))
        log(f"report: {', '.join(f'{v} {k}' for k, v in counts.items())} in "
            f"{report['wall_s']:.0f} s; index: {out_dir / 'index.html'}")
        log.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return report


def _run_stage(step: Step, rp, entry: dict, tag: str, log, progress: bool) -> None:
    log(f"{tag}: running")
    try:
        rec = run_stage(step.name, rp.pipeline, progress=progress)
        entry["status"] = "reused" if rec["reused"] else "computed"
        entry["record"] = rec
        entry["summary"] = rec["numbers"]
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001
        if isinstance(e, KeyboardInterrupt):
            raise
        entry["status"] = "failed"
        entry["error"] = error_info(e)
        if isinstance(e, UserError):
            entry["error"]["traceback"] = ""
