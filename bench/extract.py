"""Extraction overhead benchmark: plain forward tokens/s vs extraction tokens/s, one run.

Prints, from the same conversations on the same target in the same process (interleaved
repeats, median of each):
  plain forward    the target's base-model forward over the same padded batches, no hooks
  plain + lm_head  the full causal-LM forward (what a user would otherwise run)
  extraction       eagle3lab.data.extract: hooks + concat + dtype cast + shard write + sha256
and their ratio (goal: extraction / plain forward >= 0.9), and bytes per token on disk.

    .venv/bin/python bench/extract.py [--target T] [--conversations FILE] [--n 48]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def synthetic_conversations(path: Path, tokenizer, n: int) -> Path:
    """Shipped train prompts, each answered by a fixed-length slice of another prompt's text
    (realistic lengths, no generation needed)."""
    from eagle3lab.data.prompts import chat_prompt_ids, conversation_record, load_prompts

    prompts = load_prompts("train", limit=2 * n)
    with open(path, "w") as f:
        for i in range(n):
            p, other = prompts[i], prompts[-1 - i]
            resp = (tokenizer((other.prompt + " ") * 4).input_ids[:160]
                    + [tokenizer.eos_token_id])
            rec = conversation_record(p, chat_prompt_ids(tokenizer, p.prompt), resp, "",
                                      "stop", None)
            f.write(json.dumps(rec) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--conversations", default=None, help="default: synthetic, from prompts")
    ap.add_argument("--n", type=int, default=48, help="conversations")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--model-dtype", default="float32")
    ap.add_argument("--dtype", default="bfloat16", help="shard storage dtype")
    ap.add_argument("--max-tokens-per-batch", type=int, default=4096)
    args = ap.parse_args(argv)

    import torch

    from eagle3lab.data.extract import _batches, extract
    from eagle3lab.data.prompts import read_conversations
    from eagle3lab.targets.adapter import load_target

    tgt = load_target(args.target, device=args.device, dtype=args.model_dtype)
    tmp = Path(tempfile.mkdtemp(prefix="bench-extract-"))
    convs_path = Path(args.conversations) if args.conversations else synthetic_conversations(
        tmp / "convs.jsonl", tgt.tokenizer, args.n)
    convs = read_conversations(convs_path)[:args.n]
    lengths = [len(c["input_ids"]) for c in convs]
    n_tokens = sum(lengths)
    samples_per_shard = 64
    # the same batches extract() forms: consecutive groups within each shard's chunk
    batches = []
    for s0 in range(0, len(convs), samples_per_shard):
        chunk = lengths[s0:s0 + samples_per_shard]
        for a, b in _batches(chunk, args.max_tokens_per_batch):
            width = max(chunk[a:b])
            ids = torch.zeros((b - a, width), dtype=torch.long)
            attn = torch.zeros_like(ids)
            for r in range(b - a):
                n = chunk[a + r]
                ids[r, :n] = torch.tensor(convs[s0 + a + r]["input_ids"])
                attn[r, :n] = 1
            batches.append((ids.to(tgt.device), attn.to(tgt.device)))

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def plain(lm_head: bool) -> float:
        sync()
        t0 = time.perf_counter()
        with torch.inference_mode():
            for ids, attn in batches:
                if lm_head:
                    tgt.model(input_ids=ids, attention_mask=attn, use_cache=False)
                else:
                    tgt._base_forward(ids, attn)
        sync()
        return n_tokens / (time.perf_counter() - t0)

    def extraction(i: int) -> tuple[float, float]:
        out = tmp / f"shards-{i}"
        sync()
        t0 = time.perf_counter()
        s = extract(conversations=convs_path, out=out, target=tgt, dtype=args.dtype,
                    limit=args.n, max_tokens_per_batch=args.max_tokens_per_batch,
                    samples_per_shard=samples_per_shard, progress=False)
        sync()
        return n_tokens / (time.perf_counter() - t0), s["bytes_per_token"]

    plain(False)  # warm-up
    rates: dict[str, list[float]] = {"plain": [], "plain_lm": [], "extract": []}
    bpt = 0.0
    for i in range(args.repeats):
        rates["plain"].append(plain(False))
        r, bpt = extraction(i)
        rates["extract"].append(r)
        rates["plain_lm"].append(plain(True))
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"target {tgt.name} on {tgt.device} ({args.model_dtype}), {len(convs)} conversations, "
          f"{n_tokens:,} tokens, {len(batches)} batches, {args.repeats} interleaved repeats "
          f"(median)")
    print(f"plain forward (base model)      {med['plain']:10,.0f} tok/s")
    print(f"plain forward + lm_head         {med['plain_lm']:10,.0f} tok/s")
    print(f"extraction (hooks+write+sha256) {med['extract']:10,.0f} tok/s")
    print(f"ratio extraction / plain forward          {med['extract'] / med['plain']:.3f}  "
          f"(goal >= 0.9)")
    print(f"ratio extraction / plain forward+lm_head  {med['extract'] / med['plain_lm']:.3f}")
    print(f"bytes per token on disk ({args.dtype})   {bpt:,.1f}")
    return 0


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("extract.py", main))
