"""`eagle3lab inspect`: the checkpoint doctor, from the command line."""

from __future__ import annotations

import sys
from pathlib import Path

from eagle3lab.cli.common import add_command, json_option
from eagle3lab.config import DEFAULT_TARGET


def add_parser(sub) -> None:
    from eagle3lab.formats.profiles import ENGINES

    p = add_command(
        sub, "inspect", run,
        help="check a drafter checkpoint for train/serve mismatches (no GPU)",
        description="Read a drafter checkpoint (config.json + *.safetensors, an index, or a "
        "pytorch_model.bin opened with weights_only=True) and report every mismatch between "
        "what was trained and what ENGINE would serve: dropped or missing keys, shapes, fc "
        "width, hidden sizes, the d2t/t2d vocab map, aux layer ids and their convention, "
        "architecture, NaN/Inf, norms the engine ignores, dtypes; with --target, also the chat "
        "template the drafter's data was rendered with against the target's own "
        "(`chat-template`). Exit status: 0 no error, "
        "1 at least one error, 2 CKPT missing.",
        parents=[json_option("print one JSON object (format, engine, ok, findings, tensors, "
                             "...)")])
    p.add_argument("ckpt", metavar="CKPT", help="drafter checkpoint directory (speculators or "
                   "SGLang format, e.g. `specforge export` output; a speculators save_path "
                   "means its checkpoint_best epoch)")
    p.add_argument("--target", default=None,
                   help=f"the target: a directory with its config.json (weights not needed) or "
                   f"a preset name such as {DEFAULT_TARGET!r}; without it, checks that need "
                   f"the target (hidden size, aux-layer range, vocabulary) are skipped")
    p.add_argument("--engine", choices=ENGINES, default=None,
                   help="the engine that will load the checkpoint: sglang = portable across "
                   "SGLang releases, sglang-0.5.23 = exactly that release, vllm = vLLM 0.25.1 "
                   "(its default V2 model runner; `eagle3lab preflight` picks the runner of "
                   "a launch), speculators (its from_pretrained); default: sglang for the "
                   "eagle3 format, vllm for the speculators format")
    p.add_argument("--tensors", action="store_true", help="also list every tensor (table mode)")
    p.add_argument("--no-values", action="store_true",
                   help="read headers only: skip the NaN/Inf scan and the vocab-map checks")


def run(args) -> int:
    from eagle3lab.formats.doctor import inspect_checkpoint

    if not Path(args.ckpt).is_dir():
        print(f"eagle3lab inspect: error: checkpoint {args.ckpt!r} does not exist or is not a "
              f"directory.", file=sys.stderr)
        return 2
    report = inspect_checkpoint(args.ckpt, target=args.target, engine=args.engine,
                                check_values=not args.no_values)  # located and read once
    if args.target:  # the drafter's recorded chat template vs the target's own
        from eagle3lab.formats.opened import open_drafter
        from eagle3lab.preflight.rendering import rendering_findings, resolve_target_dir

        report.findings += rendering_findings(open_drafter(args.ckpt),
                                              target_dir=resolve_target_dir(args.target))
    print(report.to_json() if args.json else report.table(show_tensors=args.tensors))
    return 0 if report.ok else 1
