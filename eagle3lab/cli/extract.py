"""`eagle3lab extract`: aux hidden-state shards from regenerated conversations."""

from __future__ import annotations

import argparse

from eagle3lab.cli.common import (add_command, device_option, no_progress_option, scale_options,
                                  target_option)


def int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def add_parser(sub) -> None:
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
                 device_option(), scale_options(),
                 no_progress_option()])
    p.add_argument("--conversations", required=True, help="JSONL from `eagle3lab regenerate`")
    p.add_argument("--out", required=True, help="shard directory")
    p.add_argument("--aux-ids", type=int_list, default=None,
                   help="explicit aux layer ids, e.g. 1,14,26 (default: the engines' default)")
    p.add_argument("--aux-convention", choices=["sglang", "vllm"], default="sglang",
                   help="how --aux-ids are meant: sglang (id k = output of layer k) or vllm "
                   "(id k = input of layer k)")
    p.add_argument("--dtype", default="bfloat16", help="storage dtype of the hidden states")
    p.add_argument("--model-dtype", default="float32", help="dtype the target runs in")
    p.add_argument("--samples-per-shard", type=int, default=64, help="samples per shard file")
    p.add_argument("--max-tokens-per-batch", type=int, default=4096,
                   help="padded tokens per forward")
    p.add_argument("--max-seq-len", type=int, default=2048, help="longer samples are truncated")
    p.add_argument("--limit", type=int, default=None, help="use only the first N conversations")
    p.add_argument("--draft-vocab-size", type=int, default=None,
                   help="also build the draft vocab map of this size from these shards")
    p.add_argument("--force", action="store_true", help="start even if free space looks short")
    p.add_argument("--stop-after-shards", type=int, default=None,
                   help="write at most this many new shards (per rank), then stop as if "
                   "killed (for tests of resumption)")


def run(args) -> int:
    from eagle3lab.distributed import detect
    from eagle3lab.data.extract import extract
    from eagle3lab.data.vocab import build_shard_vocab

    s = extract(conversations=args.conversations, out=args.out, target=args.target,
                aux_ids=args.aux_ids, aux_convention=args.aux_convention, dtype=args.dtype,
                model_dtype=args.model_dtype, device=args.device, device_map=args.device_map,
                samples_per_shard=args.samples_per_shard,
                max_tokens_per_batch=args.max_tokens_per_batch, max_seq_len=args.max_seq_len,
                limit=args.limit, force=args.force, progress=not args.no_progress,
                stop_after_shards=args.stop_after_shards, dist_timeout=args.dist_timeout)
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
