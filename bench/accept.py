"""Offline speculative-decoding benchmark on one machine, in one run.

For the default target and a drafter (default: the shipped/default drafter), on held-out
eval prompts, greedy: chains of 3 and 5 draft steps and one tree setting. Prints, per
setting: tau (accept length incl. the bonus token), cumulative acceptance per position,
plain and speculative decode tokens/s measured side by side on the same prompts
(interleaved), their ratio, the speedup predicted from tau and the measured step costs,
and the ceiling speedup (perfect acceptance at the measured costs).

    .venv/bin/python -P bench/accept.py [--draft CKPT] [--limit 24] [--max-new-tokens 128]
        [--settings 3,1,4 5,1,6 4,4,12] [--dtype bfloat16 --threads 1] [--device cuda]

On a CPU with native bf16 (avx512_bf16 / AMX), `--dtype bfloat16 --threads 1` is the
fastest configuration for plain decoding as well (measured on a 2-core EPYC: plain step
28-30 ms vs 45-48 ms in fp32), and its verify cost hardly grows with the number of tokens
(fp32 GEMMs with 2-16 rows cost ~2x a one-row GEMV there). In bf16 a multi-token verify
rounds differently from one-token steps, so outputs may leave plain greedy after a near
tie ("same" column); fp32 is exact.
(-P keeps bench/ off sys.path.)
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--draft", default=None, help="default: eagle3lab.workdir.default_drafter()")
    ap.add_argument("--prompts", default="eval")
    ap.add_argument("--limit", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--settings", nargs="+", default=["3,1,4", "5,1,6", "4,4,12"],
                    help="steps,topk,draft_tokens triples")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    ap.add_argument("--json", default=None, help="also write all results to this file")
    args = ap.parse_args(argv)

    import torch

    from eagle3lab.specdec.accept import Arm, measure_acceptance
    from eagle3lab.target.adapter import load_target
    from eagle3lab.workdir import default_drafter

    draft = args.draft or default_drafter(args.target)
    if draft is None:
        print("No drafter: pass --draft or train/ship a default drafter.", file=sys.stderr)
        return 2
    tgt = load_target(args.target, device=args.device, dtype=args.dtype)
    print(f"target {tgt.name} on {tgt.device} ({args.dtype}, "
          f"{args.threads or torch.get_num_threads()} "
          f"threads); drafter {draft}; "
          f"{args.limit} {args.prompts} prompts x {args.max_new_tokens} new tokens, greedy")
    print(f"{'S,K,D':>8} {'tau':>6} {'plain tok/s':>11} {'spec tok/s':>10} {'ratio':>6} "
          f"{'predicted':>9} {'ceiling':>7} {'same':>5}  cumulative acceptance by position")
    everything = []
    for s in args.settings:
        steps, topk, d = (int(x) for x in s.split(","))
        r = measure_acceptance(target=tgt, arms=[Arm("draft", draft)], prompts=args.prompts,
                               limit=args.limit, max_new_tokens=args.max_new_tokens,
                               steps=steps, topk=topk, draft_tokens=d,
                               threads=args.threads, progress=False)
        a = r["arms"][0]
        st = a["stats"]
        cum = " ".join(f"{v:.2f}" for v in st["acceptance_cumulative"])
        print(f"{s:>8} {st['tau']:6.2f} {r['plain']['tokens_per_s']:11.2f} "
              f"{st['tokens_per_s']:10.2f} {a['speedup_measured']:6.2f} "
              f"{a['speedup_predicted']:9.2f} {a['speedup_ceiling']:7.2f} "
              f"{a['matches_plain']:>2}/{r['requests']:<2}  {cum}")
        print(f"{'':>8} step costs: plain {r['plain']['step_s'] * 1e3:.1f} ms/token, verify "
              f"{a['verify_step_s'] * 1e3:.1f} ms, drafting {a['draft_per_verify_s'] * 1e3:.1f}"
              f" ms per verify step; histogram {st['accept_histogram']}")
        everything.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
