"""`eagle3lab train`: train an EAGLE-3 drafter on shards (speculators' model and loss).

The options are generated from `TrainConfig` (names, types, defaults, and the help text
from each field's comment), so the CLI and the library cannot drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import typing


def _field_help() -> dict[str, str]:
    from eagle3lab.train import TrainConfig

    src = inspect.getsource(TrainConfig)
    return {m.group(1): m.group(2).strip()
            for m in re.finditer(r"^\s+(\w+):[^#\n]*#\s*(.*)$", src, re.M)}


def add_parser(sub) -> None:
    from eagle3lab.train import ENGINE_PROFILES, TrainConfig

    p = sub.add_parser(
        "train", help="train an EAGLE-3 drafter on shards (speculators' model and loss)",
        description="Build speculators' EAGLE-3 drafter from the shards' manifest (target "
        "hidden size, aux layers written as vLLM ids = capture points, target vocab, the "
        "shards' draft vocab map), train it with our loop around speculators' forward and "
        "loss, and write RUN_DIR/run.json, metrics.jsonl (one line per logged step: loss and "
        "full/conditional accuracy per TTT position, train and eval), atomic checkpoints "
        "(checkpoints/step-N: speculators save_pretrained + trainer_state.pt) and final/. "
        "--resume continues exactly. Shards that do not match (eval split, resumed run, "
        "--init-from drafter) are refused before training. Under torchrun (`torchrun "
        "--nproc-per-node N -m eagle3lab train ...`) every rank trains the one drafter: DDP, "
        "or FSDP2 with --fsdp; a step is N x --grad-accum micro-batches. --serve-engine "
        "picks the flags "
        f"that engine implements: {json.dumps(ENGINE_PROFILES)}.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--config", default=None,
                   help="JSON file of TrainConfig fields; command-line options override it")
    helps = _field_help()
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        tp = hints[f.name]
        kw: dict = {"dest": f.name, "default": argparse.SUPPRESS,
                    "help": helps.get(f.name, "")}
        if f.default is not dataclasses.MISSING and f.default is not None:
            kw["help"] += f" (default: {f.default})"
        args = typing.get_args(tp)
        if tp is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
            continue
        if typing.get_origin(tp) is typing.Literal:
            kw["choices"] = list(args)
        elif typing.get_origin(tp) is list:
            kw.update(nargs="*", type=args[0])
        else:
            base = next((a for a in args if a is not type(None)), tp) if args else tp
            kw["type"] = base
        p.add_argument(flag, **kw)
    p.set_defaults(func=run)


def run(args) -> int:
    from eagle3lab.errors import UserError
    from eagle3lab.train import train
    from eagle3lab.train.distributed import env_rank

    opts = {k: v for k, v in vars(args).items() if k not in ("func", "command", "config")}
    if args.config:
        try:
            base = json.loads(open(args.config).read())
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"--config {args.config}: cannot read it as JSON ({e}).") from None
        opts = {**base, **opts}
    for req in ("data", "out"):
        if req not in opts:
            raise UserError(f"--{req} is required (or set it in --config).")
    summary = train(**opts)
    if env_rank() == 0:  # under torchrun: once
        print(json.dumps(summary, indent=2))
    return 0
