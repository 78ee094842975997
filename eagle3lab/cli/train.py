"""`eagle3lab train`: train an EAGLE-3 drafter on shards, or online from conversations
(speculators' model and loss).

The options are generated from `TrainConfig`'s fields (names, types, defaults, the help
text from each field's `description`, and the option group each field names: data, model,
optimiser, schedule, checkpoints, distributed) by `cli.common.add_config_options`, so the
CLI and the library cannot drift apart.
"""

from __future__ import annotations

import json

from eagle3lab.cli.common import add_command, add_config_options


def add_parser(sub) -> None:
    from eagle3lab.train import TrainConfig
    from eagle3lab.train.config import OPTION_GROUPS, engine_profiles_text

    p = add_command(
        sub, "train", run,
        help="train an EAGLE-3 drafter on shards, or online from conversations "
        "(speculators' model and loss)",
        description="Build speculators' EAGLE-3 drafter from the shards' manifest (target "
        "hidden size, aux layers written as vLLM ids = capture points, target vocab, the "
        "shards' draft vocab map), train it with our loop around speculators' forward and "
        "loss, and write RUN_DIR/run.json, metrics.jsonl (one line per logged step: loss and "
        "full/conditional accuracy per TTT position, train and eval), atomic checkpoints "
        "(checkpoints/step-N: speculators save_pretrained + trainer_state.pt) and final/. "
        "--resume continues exactly. Shards that do not match (eval split, resumed run, "
        "--init-from drafter) are refused before training. Online (`--online --conversations "
        "R.jsonl --target T`): no shards; the target computes the states of each micro-batch "
        "inside the loop with extract's capture (aux ids, convention, --states-dtype as "
        "extract's --dtype) and the draft vocab is built from the conversations as `eagle3lab "
        "vocab` builds it (--vocab-map: a given one); no data workers. Under torchrun (`torchrun "
        "--nproc-per-node N -m eagle3lab train ...`) every rank trains the one drafter: DDP, "
        "or FSDP2 with --fsdp; a step is N x --grad-accum micro-batches. --serve-engine "
        f"picks the speculators flags that engine implements: {engine_profiles_text()}.")
    p.add_argument("--config", default=None,
                   help="JSON file of TrainConfig fields; command-line options override it")
    p.add_argument("--no-verify", action="store_true",
                   help="skip checking the shards' recorded sha256s (cached by size and "
                   "mtime in sha256-cache.json, so a re-check of unchanged shards is instant)")
    add_config_options(p, TrainConfig, groups=OPTION_GROUPS, from_file=True)


def run(args) -> int:
    from eagle3lab.errors import UserError
    from eagle3lab.fsutil import read_json_object
    from eagle3lab.train import SIGTERM_EXIT, TrainConfig, train_run
    from eagle3lab.distributed import detect

    opts = {k: v for k, v in vars(args).items() if k in TrainConfig.model_fields}
    where = "train options"
    if args.config:
        base = read_json_object(args.config, what="--config file", fix="It must hold one "
                                "JSON object of TrainConfig fields, e.g. {\"lr\": 0.0003}.")
        opts = {**base, **opts}
        where = f"train config {args.config} (with the command-line options)"
    if "out" not in opts:  # data or --online: TrainConfig's check says which is missing
        raise UserError("--out is required (or set it in --config).")
    summary = train_run(TrainConfig.from_dict(opts, where), verify=not args.no_verify)
    if detect().main:  # under torchrun: once
        print(json.dumps(summary, indent=2))
    return SIGTERM_EXIT if summary.get("signal") == "SIGTERM" else 0
