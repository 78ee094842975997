"""`eagle3lab demo`: the pipeline on the embedded default target (what `make demo` runs)."""

from __future__ import annotations

import argparse

from ..config import DEFAULT_TARGET


def add_parser(sub) -> None:
    p = sub.add_parser(
        "demo", help="run the pipeline on the default target (what `make demo` runs)",
        description="Prepare the default target, have it answer shipped train and eval "
        "prompts, extract hidden-state shards for both, and build the draft vocab map, in "
        "data/runs/default (or --run-dir). Finished stages are reused: a second run takes "
        "seconds.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--run-dir", default=None, help="run directory (default data/runs/default)")
    p.add_argument("--target", default=DEFAULT_TARGET, help="preset, HF directory or hub id")
    p.add_argument("--train-prompts", type=int, default=96, help="train prompts to answer")
    p.add_argument("--eval-prompts", type=int, default=24, help="held-out prompts to answer")
    p.add_argument("--max-new-tokens", type=int, default=160, help="answer length cap")
    p.add_argument("--batch-size", type=int, default=16, help="generation batch size")
    p.add_argument("--draft-vocab-size", type=int, default=8192, help="draft vocab size")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, ...")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..pipeline import run_demo

    s = run_demo(run_dir=args.run_dir, target=args.target, train_prompts=args.train_prompts,
                 eval_prompts=args.eval_prompts, max_new_tokens=args.max_new_tokens,
                 batch_size=args.batch_size, draft_vocab_size=args.draft_vocab_size,
                 device=args.device)
    tr, ev = s["extract_train"], s["extract_eval"]
    print(f"\nDone in {s['seconds']:.0f} s. Run directory: {s['paths']['run_dir']}")
    print(f"  train: {tr['samples']} conversations, {tr['tokens']:,} tokens -> "
          f"{s['paths']['shards_train']}")
    print(f"  eval:  {ev['samples']} conversations, {ev['tokens']:,} tokens -> "
          f"{s['paths']['shards_eval']}")
    print(f"  vocab map: {s['vocab']['draft_vocab_size']} tokens, coverage "
          f"{s['vocab']['coverage']:.1%}")
    return 0
