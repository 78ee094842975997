"""`eagle3lab extract`: aux hidden-state shards from regenerated conversations.

The options are `ExtractConfig`'s fields (`cli.common.add_config_options`; --aux-ids in
the one aux-ids syntax, `eagle3lab.targets.auxlayers.AUX_IDS_SYNTAX`), beside the options
several commands share (--target, --device, --no-progress) and --draft-vocab-size (the
vocab map built after, as `eagle3lab vocab`)."""

from __future__ import annotations

from eagle3lab.cli.common import (add_command, add_config_options, config_from_args,
                                  device_option, no_progress_option, target_option)


def add_parser(sub) -> None:
    from eagle3lab.data.extract import ExtractConfig
    from eagle3lab.data.stage import STAGE_GROUPS

    p = add_command(
        sub, "extract", run,
        help="write EAGLE-3 training shards (aux hidden states) + manifest",
        description="Run the target over each regenerated conversation, capture the aux "
        "hidden states with forward hooks (default capture points [2, N//2, N-3], SGLang's "
        "and vLLM's default), and write safetensors shards with input_ids, loss_mask, the "
        "fused aux states (width 3H) and the final norm's input, plus manifest.json. "
        "Prints the bytes needed first and refuses when the disk is too small (--force "
        "overrides). A re-run resumes after the last complete shard. With "
        "--draft-vocab-size, also builds the draft vocabulary map (as `eagle3lab vocab`). "
        "Under torchrun (torchrun --nproc-per-node N -m eagle3lab extract ...) each rank "
        "extracts a share of the conversations balanced by tokens and rank 0 merges one "
        "manifest; --device-map spreads a target larger than one GPU over several.",
        parents=[target_option("must be the model that wrote the conversations"),
                 device_option(), no_progress_option()])
    p.add_argument("--draft-vocab-size", type=int, default=None,
                   help="also build the draft vocab map of this size from these shards")
    add_config_options(p, ExtractConfig, groups=STAGE_GROUPS)


def run(args) -> int:
    from eagle3lab.distributed import detect
    from eagle3lab.data.extract import ExtractConfig, extract
    from eagle3lab.data.vocab import build_shard_vocab

    s = extract(config_from_args(ExtractConfig, args, "extract"),
                progress=not args.no_progress)
    if not detect().main:  # rank 0 reports (and builds the vocab map) for all ranks
        return 0
    if not s["complete"]:
        print(f"{s['out']}: incomplete ({s['samples']} samples in complete shards); re-run "
              f"the same command to resume.")
    rate = f", {s['tokens_per_s']:,.0f} tok/s" if s["tokens_per_s"] else ""
    print(f"{s['out']}: {s['shards']} shards, {s['samples']} samples, {s['tokens']:,} tokens, "
          f"{s['bytes'] / 1e6:,.1f} MB ({s['bytes_per_token'] or 0:,.0f} bytes/token{rate})")
    if args.draft_vocab_size and s["complete"]:
        v = build_shard_vocab(data=args.out, draft_vocab_size=args.draft_vocab_size)
        print(f"vocab map: {v['draft_vocab_size']} draft tokens cover {v['coverage']:.1%} of "
              f"{v['loss_tokens']:,} loss tokens ({v['distinct_loss_tokens']} distinct)")
    return 0
