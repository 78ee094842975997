"""`eagle3lab preflight -- COMMAND`: judge a whole serving launch before a GPU is spent."""

from __future__ import annotations

import argparse
import sys

from eagle3lab.cli.common import add_command, json_option
from eagle3lab.targets.auxlayers import AUX_IDS_SYNTAX


def add_parser(sub) -> None:
    p = add_command(
        sub, "preflight", run,
        help="judge a serving launch command (engine, version, target, drafter, flags)",
        description="Parse the launch command you are about to run (python -m "
        "sglang.launch_server ..., sglang serve ..., vllm serve ..., eagle3lab serve ...) as "
        "the engine would, resolve its target and drafter (directories; hub ids only from "
        "the local cache), and report: every checkpoint-doctor finding for that engine and "
        "version; whether that engine version captures aux hidden states from the target's "
        "model class (aux-capture); which target layers it will capture for this drafter vs "
        "the layers it was trained on; flags that change acceptance or stop a start "
        "(draft-tokens, tp-heads, context-length, vocab, launch-dtype); the known start-up "
        "warnings it will trigger. Exit status: 0 no error, 1 at least one error, 2 the "
        "command could not be judged (not a serving command, bad --speculative-config, or a "
        "target/drafter hub id that is not in the local cache: NOT JUDGED).",
        parents=[json_option("print one JSON object (engine, version, target, draft, "
                             "capture, aux, findings, ...)")])
    p.add_argument("--engine-version", default=None, metavar="VERSION",
                   help="the engine release to judge for (default: the installed sglang, "
                   "else the pinned one; vLLM: the installed one, else judged as 0.25.1, the "
                   "release its checks were read from). SGLang before 0.5.23 is judged "
                   "with the midlayer loader and the reported capture cases")
    p.add_argument("--trained-aux-layers", default=None, metavar="IDS",
                   help=f"the aux layer ids the drafter was trained on, when its checkpoint "
                   f"does not record them: {AUX_IDS_SYNTAX} (one word: the launch command "
                   f"follows)")
    p.add_argument("--trained-convention", choices=("vllm", "sglang"), default="vllm",
                   help="convention of --trained-aux-layers: vllm/speculators (id = capture "
                   "point) or sglang/SpecForge (id k = output of layer k)")
    p.add_argument("--values", action="store_true",
                   help="also read tensor values (NaN/Inf scan, d2t/t2d checks): slower on "
                   "big drafters")
    p.add_argument("--no-engine-parser", action="store_true",
                   help="skip SGLang's own prepare_server_args check (a subprocess that "
                   "imports sglang; seconds to tens of seconds)")
    p.add_argument("launch", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                   help="the launch command, after --")


def run(args) -> int:
    from eagle3lab.errors import UserError
    from eagle3lab.preflight.run import preflight
    from eagle3lab.targets.auxlayers import check_aux_ids

    launch = list(args.launch)
    if launch and launch[0] == "--":
        launch = launch[1:]
    if not launch:
        print("eagle3lab preflight: error: no launch command; pass it after --, e.g. "
              "eagle3lab preflight -- python -m sglang.launch_server --model-path T ...",
              file=sys.stderr)
        return 2
    try:
        trained = check_aux_ids(args.trained_aux_layers, "--trained-aux-layers")
    except UserError as e:
        print(f"eagle3lab preflight: error: {e}", file=sys.stderr)
        return 2
    try:
        report = preflight(launch[0] if len(launch) == 1 else launch,
                           engine_version=args.engine_version, trained_aux_layers=trained,
                           trained_convention=args.trained_convention,
                           check_values=args.values, engine_parser=not args.no_engine_parser)
    except UserError as e:
        print(f"eagle3lab preflight: error (not judged): {e}", file=sys.stderr)
        return 2
    print(report.to_json() if args.json else report.table())
    return report.exit_code
