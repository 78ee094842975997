"""`eagle3lab demo`: the whole pipeline on the default target as a batch report (what
`make demo` runs): `eagle3lab report --params params/cpu-demo.yaml`. Needs the repository
checkout (notebooks/, params/, data/prompts/): an installed package run elsewhere says so in
one line (report.plan.checkout_inputs)."""

from __future__ import annotations

from eagle3lab.cli.common import add_command
from eagle3lab.config import repo_root


def default_params() -> str:
    """The demo's parameters file: params/cpu-demo.yaml of the checkout."""
    return str(repo_root() / "params" / "cpu-demo.yaml")


def add_parser(sub) -> None:
    from eagle3lab.cli.report import report_options

    default = default_params()
    add_command(
        sub, "demo", run,
        help="run the whole pipeline on the default target and write a report "
        "(what `make demo` runs)",
        description="The batch report with the CPU demo parameters: prepare the default "
        "target, regenerate train and eval responses, extract shards and the vocab map, "
        "train a drafter, convert and inspect it, measure offline acceptance, benchmark the "
        "reference server with and without speculation, and render every notebook into "
        "reports/<timestamp>/ with an index.html. Stages live in data/runs/default and are "
        "reused when complete, so a second run only re-executes the notebooks. "
        "`--only target,data` runs just the data stages.",
        parents=[report_options(params_default=str(default))], show_defaults=False)


def run(args) -> int:
    from eagle3lab.cli.report import run_with

    default = default_params()
    return run_with(args, command="demo",
                    default_params=default if args.params == default else None)
