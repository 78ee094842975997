"""Regeneration in-process: transformers' generate (engine hf) vs eagle3lab's static-cache
engine (engine static), tokens/s side by side in one run, on the same prompts.

Prevents choosing the data stage's engine from a guess: on an H200 hf's `generate` ran at
15.6k tokens/s greedy at batch 2048 (it copies its growing cache every step), and the
study's 20M+ answer tokens must fit a 30-minute device budget. Loads the target once,
runs `eagle3lab.data.regenerate` with each engine into fresh files (same prompts, same
settings, `--batch-size` prompts per hf batch / rows in flight for static), and prints
one JSON object: per engine the records, new tokens, wall seconds and tokens/s, the
static/hf ratio, and how many records are identical between the engines (fp32: all of
them; bf16: answers part after a near-tie).

    .venv/bin/python -P bench/regen_static.py                 # CPU, fp32, tiny sizes
    python3 -P bench/regen_static.py --device cuda --dtype bfloat16 --batch-size 2048 \\
        --prompts train --limit 0 --copies 16 --max-new-tokens 256   # on the H200

`--copies K` answers every prompt K times (ids PROMPT~k; greedy copies answer alike):
enough prompts to keep a large batch full from the shipped sets. The static engine's
time includes its CUDA-graph captures (once per attention-length bucket, ~0.1 s each).
(-P keeps bench/ off sys.path.)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def write_copies(prompts: str, copies: int, limit: int | None, dst: Path) -> Path:
    """A prompts JSONL with each prompt `copies` times (ids PROMPT~k, k-major order)."""
    from eagle3lab.data.prompts import load_prompts

    plist = load_prompts(prompts, limit=limit)
    with open(dst, "w", encoding="utf-8") as f:
        for k in range(copies):
            for p in plist:
                f.write(json.dumps({"id": f"{p.id}~{k}", "prompt": p.prompt}) + "\n")
    return dst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", default="eval", help="train, eval or a prompts JSONL")
    ap.add_argument("--limit", type=int, default=6, help="prompts taken (before copies; 0: "
                    "all of them)")
    ap.add_argument("--copies", type=int, default=1, help="answers per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--engines", nargs="+", choices=("hf", "static"), default=["hf", "static"])
    ap.add_argument("--work", default=None, help="where the files go (default: a temp dir)")
    args = ap.parse_args(argv)
    if args.copies < 1:
        from eagle3lab.errors import UserError

        raise UserError(f"--copies must be at least 1, got {args.copies}.")

    from eagle3lab.data.prompts import read_conversations
    from eagle3lab.data.regenerate import regenerate
    from eagle3lab.specdec.batched import BatchedEngine
    from eagle3lab.targets.adapter import load_target

    work = Path(args.work or tempfile.mkdtemp(prefix="regen-static-"))
    work.mkdir(parents=True, exist_ok=True)
    prompts = write_copies(args.prompts, args.copies, args.limit or None,
                           work / "prompts.jsonl")
    tgt = load_target(args.target, device=args.device, dtype=args.dtype)
    result: dict = {"target": args.target, "device": str(tgt.device), "dtype": args.dtype,
                    "prompts": None,
                    "batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens,
                    "temperature": args.temperature, "engines": {}}
    records = {}
    for engine in args.engines:
        out = work / f"{engine}.jsonl"
        for p in (out, out.with_name(out.name + ".meta.json")):
            p.unlink(missing_ok=True)
        t0 = time.perf_counter()
        s = regenerate(target=tgt, prompts=str(prompts), out=out, engine=engine,
                       engine_class=BatchedEngine, batch_size=args.batch_size,
                       max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                       progress=False)
        wall = time.perf_counter() - t0
        records[engine] = {r["id"]: r["input_ids"] for r in read_conversations(out)}
        result["engines"][engine] = {"records": s["records"], "new_tokens": s["new_tokens"],
                                     "wall_s": round(wall, 3),
                                     "tokens_per_s": round(s["new_tokens"] / wall, 1)}
        result["prompts"] = s["records"]
    if set(records) == {"hf", "static"}:
        hf, st = records["hf"], records["static"]
        result["identical_records"] = f"{sum(hf[k] == st.get(k) for k in hf)}/{len(hf)}"
        result["static_over_hf"] = round(result["engines"]["static"]["tokens_per_s"]
                                         / max(result["engines"]["hf"]["tokens_per_s"], 1e-9), 2)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("regen_static.py", main))
