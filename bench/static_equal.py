"""The static engine against the eager one, token for token, on a GPU: the check to run first
in a device session after the static engine changed (CPU tests cover its code, but not its
CUDA graphs).

Prevents a live measurement (the study's `live_tau`, `accept --engine static`) from resting
on an engine whose captured steps drift from the eager reference: in fp32 both must give
the same output ids, accept histograms, verify steps, finish reasons and rejected drafts
(`mismatches`), prompt by prompt, at every draft shape asked, greedy and sampled; and so
must an engine whose graphs were captured with other drafter weights after the drafter is
copied back in (`swap_drafter`, how the study's live decodes reuse one engine per shape).

    python3 -P bench/static_equal.py --device cuda --target /root/e3l/target \
        [--draft DIR] [--limit 8] [--max-new-tokens 64] [--batch-size 4] \
        [--settings 3,1,4 5,1,6 4,4,12] [--temperature 0 0.9]

Prints one line per shape and temperature ("equal 8/8" or the first difference) and exits 1
when any differs. On a CPU it runs too (the same engines without graphs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: What must match, per prompt (specdec.result.GenerationResult fields).
FIELDS = ("output_ids", "accept_histogram", "verify_ct", "finish_reason", "mismatches")


def first_difference(old, new) -> str | None:
    """'prompt I: FIELD differs' for the first prompt and field that differ, else None."""
    for i, (a, b) in enumerate(zip(old, new)):
        for f in FIELDS:
            if getattr(a, f) != getattr(b, f):
                return f"prompt {i}: {f} differs"
    return None if len(old) == len(new) else f"{len(new)} results for {len(old)} prompts"


def _report(label: str, old, new) -> int:
    """Print 'LABEL: equal k/n' (and the first difference); 1 when any differs."""
    diff = first_difference(old, new)
    same = sum(all(getattr(a, f) == getattr(b, f) for f in FIELDS) for a, b in zip(old, new))
    print(f"{label}: equal {same}/{len(old)}" + (f"; first: {diff}" if diff else ""),
          flush=True)
    return int(diff is not None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--draft", default=None, help="default: the shipped drafter")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--limit", type=int, default=8, help="held-out prompts")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4, help="rows in flight (static)")
    ap.add_argument("--settings", nargs="+", default=["3,1,4", "5,1,6", "4,4,12"])
    ap.add_argument("--temperature", nargs="+", type=float, default=[0.0, 0.9])
    ap.add_argument("--no-swap", dest="swap", action="store_false",
                    help="skip the swap check (graphs captured with other drafter weights, "
                         "the drafter copied back in by swap_drafter)")
    return _run(ap.parse_args(argv))


def _run(args) -> int:
    from eagle3lab.specdec.accept import prompt_ids
    import torch

    from eagle3lab.specdec.load import load_drafter, load_engine
    from eagle3lab.study.atscale import parse_setting
    from eagle3lab.targets.adapter import load_target
    from eagle3lab.workdir import default_drafter

    tgt = load_target(args.target, device=args.device, dtype="float32")
    draft = args.draft or str(default_drafter())
    prompts = [ids for _, ids in prompt_ids(tgt.tokenizer, "eval", args.limit, 1000)]
    bad = 0
    for s in args.settings:
        steps, topk, d = parse_setting(s)
        for temp in args.temperature:
            if temp > 0 and topk > 1:  # trees verify greedily only
                print(f"{s} temperature {temp:g}: skipped (a tree is verified greedily only)")
                continue
            eager = load_engine(target=tgt, draft=draft, steps=steps, topk=topk,
                                draft_tokens=d, engine="eager")
            old = [eager.generate(p, max_new_tokens=args.max_new_tokens, temperature=temp,
                                  seed=i) for i, p in enumerate(prompts)]
            static = load_engine(target=tgt, draft=draft, steps=steps, topk=topk,
                                 draft_tokens=d, engine="static", batch_size=args.batch_size)
            new = static.generate_many(prompts, max_new_tokens=args.max_new_tokens,
                                       temperature=temp, seeds=list(range(len(prompts))))
            graphs = getattr(getattr(static, "graphs", None), "enabled", False)
            bad += _report(f"{s} temperature {temp:g} (graphs {'on' if graphs else 'off'})",
                           old, new)
            if args.swap:
                # the graphs captured with halved drafter weights, then the drafter copied
                # back in (swap_drafter, as the study's live_tau does): eager's outputs again
                with torch.no_grad():
                    for t in static.drafter.model.parameters():
                        t.mul_(0.5)
                static.generate_many(prompts, max_new_tokens=args.max_new_tokens,
                                     temperature=temp, seeds=list(range(len(prompts))))
                static.swap_drafter(*load_drafter(draft, target=tgt))
                new = static.generate_many(prompts, max_new_tokens=args.max_new_tokens,
                                           temperature=temp, seeds=list(range(len(prompts))))
                bad += _report(f"{s} temperature {temp:g} swapped back", old, new)
    return 1 if bad else 0


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    sys.exit(bench_main("static_equal.py", main))
