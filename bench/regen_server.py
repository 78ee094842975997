"""Regeneration through a server: tokens/s at concurrency 1 vs N, and the concurrency
sweep of the benchmark client, on one machine, in one run.

Starts the reference server (`eagle3lab serve`, CPU) on the target with the launcher and
its watchdog, runs `eagle3lab.data.regenerate(server=...)` over the same prompts once per
concurrency (fresh output files, greedy), checks that every run wrote the same records,
and runs `loadgen.sweep` at the same levels. Prints one JSON object.

    .venv/bin/python -P bench/regen_server.py [--target smollm2-135m-instruct]
        [--limit 16] [--max-new-tokens 48] [--levels 1 8] [--draft CKPT]

The reference server decodes one request at a time (requests queue; it is not a
production server), so concurrency there buys overlap of HTTP, templating and the queue,
not batched decoding: expect ~1x. Against SGLang or vLLM (`--server URL` of a real GPU
server in `eagle3lab regenerate`) the same client keeps N requests in the engine's batch.
(-P keeps bench/ off sys.path.)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--draft", default=None, help="serve speculatively with this drafter")
    ap.add_argument("--prompts", default="eval")
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 8])
    args = ap.parse_args(argv)

    from eagle3lab.data.prompts import chat_prompt_ids, load_prompts
    from eagle3lab.data.regenerate import regenerate
    from eagle3lab.data.remote import TargetInfo
    from eagle3lab.engines.argv import LaunchConfig
    from eagle3lab.measure.loadgen import sweep
    from eagle3lab.serving.launch import start

    work = Path(tempfile.mkdtemp(prefix="regen-server-"))
    cfg = LaunchConfig(engine="reference", target=args.target, draft=args.draft, port=0,
                       device="cpu")
    h = start(cfg, run_dir=work / "run", name="server", force=True)
    result: dict = {"target": args.target, "draft": args.draft, "prompts": args.limit,
                    "max_new_tokens": args.max_new_tokens, "regenerate": [], "sweep": []}
    try:
        st = h.watchdog(silence_s=120).wait(600)
        if st["verdict"] != "ready":
            raise SystemExit(f"server {st['verdict']}: {st.get('reason')}")
        files = []
        for c in args.levels:
            out = work / f"c{c}.jsonl"
            t0 = time.perf_counter()
            s = regenerate(target=args.target, prompts=args.prompts, out=out,
                           limit=args.limit, max_new_tokens=args.max_new_tokens,
                           server=h.url, concurrency=c, progress=False)
            wall = time.perf_counter() - t0
            files.append(out.read_text())
            result["regenerate"].append({"concurrency": c, "records": s["records"],
                                         "new_tokens": s["new_tokens"], "wall_s": round(wall, 2),
                                         "tokens_per_s": round(s["new_tokens"] / wall, 2)})
        result["same_records_at_every_level"] = len(set(files)) == 1
        tok = TargetInfo(args.target).tokenizer
        reqs = [{"prompt_id": p.id, "input_ids": chat_prompt_ids(tok, p.prompt)}
                for p in load_prompts(args.prompts, limit=args.limit)]
        levels, _ = sweep(h.url, reqs, levels=args.levels, arm="reference",
                          max_new_tokens=args.max_new_tokens, log=lambda s: None)
        result["sweep"] = levels[["concurrency", "throughput_tok_s", "ttft_mean_s",
                                  "itl_mean_s", "accept_length",
                                  "metrics_accept_length"]].round(4).to_dict("records")
    finally:
        h.stop()
    print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("regen_server.py", main))
