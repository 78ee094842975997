"""`eagle3lab report`: run the pipeline's stages and notebooks with papermill, render them,
and write an index (eagle3lab.report.run.run_report)."""

from __future__ import annotations

import argparse

from eagle3lab.cli.common import add_command, no_progress_option


def report_options(*, params_default: str | None) -> argparse.ArgumentParser:
    """The options of `report` and `demo` (a parent parser)."""
    p = argparse.ArgumentParser(add_help=False,
                                parents=[no_progress_option("no tqdm bars in stages")])
    p.add_argument("--params", default=params_default, metavar="FILE.yaml",
                   help="parameters file: report/pipeline/common sections and one section per "
                   "notebook (see params/cpu-demo.yaml, params/gpu.yaml); default: "
                   + (params_default or "the pipeline's defaults, every notebook's own"))
    p.add_argument("--only", default=None, metavar="NAMES",
                   help="comma-separated steps to run (unique prefixes such as 02 work); the "
                   "stages they need always run and are reused when complete")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="report directory (default reports/<timestamp>)")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="execution timeout per notebook cell in seconds (default: the "
                   "file's report.timeout_s, else 1800)")
    p.add_argument("--notebooks", default=None, metavar="DIR",
                   help="notebooks directory (default: the repository's notebooks/)")
    return p


def add_parser(sub) -> None:
    add_command(
        sub, "report", run,
        help="run the pipeline as papermill notebooks and write a shareable report",
        description="Run the library stages (prepare target, regenerate, extract, train, "
        "convert; reused when complete in the work dir pipeline.work_dir) and the notebooks in "
        "pipeline order under papermill, with the parameters each declares. Writes the "
        "executed notebooks, an HTML rendering of each (code hidden, images embedded), "
        "index.html (status, key numbers, failures with the failing cell, parameters, "
        "versions), report.json and report.log. A failing step skips only its dependents. "
        "Exit status 1 when a step failed.",
        parents=[report_options(params_default=None)], show_defaults=False)


def run_with(args, *, command: str = "report", default_params: str | None = None) -> int:
    """Run the report of `args`; command / default_params: for the one-line error of an
    installed package run outside the checkout (report.plan.checkout_inputs)."""
    from eagle3lab.report.plan import checkout_inputs
    from eagle3lab.report.run import run_report

    notebooks = checkout_inputs(command, notebooks_dir=args.notebooks,
                                default_params=default_params)
    only = [s.strip() for s in args.only.split(",") if s.strip()] if args.only else None
    rep = run_report(params=args.params, only=only, out=args.out, timeout_s=args.timeout,
                     notebooks_dir=notebooks, progress=not args.no_progress)
    failed = [e["name"] for e in rep["steps"] if e["status"] == "failed"]
    missing = [e["name"] for e in rep["steps"] if e["status"] == "missing"]
    print(f"\nReport: {rep['out']}/index.html")
    if missing:
        print(f"  missing notebooks (not run): {', '.join(missing)}")
    if failed:
        print(f"  FAILED: {', '.join(failed)} (details in index.html and report.log)")
        return 1
    return 0


def run(args) -> int:
    return run_with(args)
