"""Offline speculative-decoding benchmark on one machine, in one run.

For a target and a drafter (default: the default target and its shipped drafter), on
held-out eval prompts: chains of 3 and 5 draft steps and one tree setting. Prints, per
setting: tau (accept length incl. the bonus token), cumulative acceptance per position,
plain and speculative decode tokens/s measured side by side on the same prompts
(interleaved, batch 1), their ratio, the speedup predicted from tau and the measured step
costs, measured/predicted, and the ceiling speedup (perfect acceptance at the measured
costs). Then, side by side in the same run:

- `--hf-baseline`: HF transformers' own `generate` with a static cache (which compiles its
  decode step with torch.compile on a GPU) on the same target and prompts: the engine's
  plain decoding over it (the engine must not be the bottleneck).
- `--batch-size B` (B > 1): the same settings with B prompts in flight: acceptance
  measured over the batch, throughput (tok/s, prompts/min) of plain and speculative
  decoding, their batch-B speedup.
- `--compare-eager N`: the eager engine (HF forwards, one prompt at a time: the CPU path)
  on the first N prompts at the same settings: acceptance-measurement throughput in
  prompts per minute (whole measurement: plain + speculative, loading included) of the
  engine chosen vs the eager one.
- on a GPU, every figure against the bandwidth limit: bytes of weights read per step
  (the target's, plus the drafter's per draft forward) / `--hbm-gbs`.

    .venv/bin/python -P bench/accept.py [--draft CKPT] [--limit 24] [--max-new-tokens 128]
        [--settings 3,1,4 5,1,6 4,4,12] [--dtype bfloat16 --threads 1] [--device cuda]
        [--engine auto|eager|static] [--batch-size 16] [--hf-baseline] [--compare-eager 4]
        [--shape 8b]

`--shape 8b`: a Llama-3.1-8B-shaped target (32 layers, hidden 4096, GQA 32/8, vocab
128256) with random bf16 weights built in memory, and a random speculators drafter for it
(draft vocab 32000), with the preset's tokenizer: speed figures only (tau is that of a
random drafter, ~1).

On a CPU with native bf16 (avx512_bf16 / AMX), `--dtype bfloat16 --threads 1` is the
fastest configuration for plain decoding as well (measured on a 2-core EPYC: plain step
28-30 ms vs 45-48 ms in fp32). In bf16 a multi-token verify rounds differently from
one-token steps, so outputs may leave plain greedy after a near tie ("same" column); fp32
is exact. (-P keeps bench/ off sys.path.)

Results are reported as they come, so that a run stopped part-way (`timeout`) keeps what
it measured: each line is printed (and flushed) when it is known; within a setting, plain
and speculative decoding are interleaved prompt by prompt, and the cumulative counts so
far (tokens and decode seconds of each side, their ratio from those counts, the warm-up)
are printed to stderr after the first prompt and then every SAVE_EVERY_S seconds. With
`--json`, the file is rewritten whole (a temporary file, then renamed over it) at the
start, at each such point and after each section, with `"complete": false` and the
setting under way in `"in_progress"`; at the end `"complete": true`. Warm-up: the seconds
the static engine spent capturing step graphs (torch.compile included: a slow compile
shows here), left out of the timed decode, per setting (`warmup` in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: within a setting, the counts so far are printed and saved at most this often (seconds;
#: and always after the first prompt and the last)
SAVE_EVERY_S = 10.0


def save_json(path: str | os.PathLike, obj: dict) -> None:
    """Write `obj` to `path` whole or not at all (`atomic_write_text`: a temporary file
    beside it, renamed over it; a run killed mid-write leaves the previous version)."""
    from eagle3lab.fsutil import atomic_write_text

    atomic_write_text(path, json.dumps(obj, indent=2, default=str))


SHAPES = {
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
               max_position_embeddings=8192, rope_theta=500000.0),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=49152,
                 max_position_embeddings=8192, rope_theta=500000.0),
}


def shaped_target(shape: str, tokenizer_from: str, dtype: str, device: str, work: Path):
    """A Target of this shape with random weights (in memory) and the preset's tokenizer;
    its directory holds config + tokenizer (what the drafter's fit check reads)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from eagle3lab.targets.adapter import Target, resolve_device, resolve_dtype, resolve_target_path

    tok = AutoTokenizer.from_pretrained(resolve_target_path(tokenizer_from))
    cfg = LlamaConfig(**SHAPES[shape], tie_word_embeddings=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    with torch.device(resolve_device(device)):
        model = AutoModelForCausalLM.from_config(cfg, dtype=resolve_dtype(dtype),
                                                 attn_implementation="sdpa")
    model.eval()
    path = work / f"target-{shape}"
    cfg.save_pretrained(path)
    tok.save_pretrained(path)
    model.generation_config.save_pretrained(path)
    return Target(model, tok, str(path), f"random {shape}-shaped Llama")


def weight_bytes(module) -> int:
    """Bytes of the weights one forward reads: every parameter once (tied ones once), an
    embedding table not (a lookup reads a few rows) unless it is also the output head."""
    seen, total = set(), 0
    head = getattr(module, "lm_head", None)
    tied = {head.weight.data_ptr()} if head is not None else set()
    for name, p in module.named_parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        if "embed_tokens" in name and p.data_ptr() not in tied:
            continue
        total += p.numel() * p.element_size()
    return total


def drafter_bytes(model) -> int:
    """What one drafter forward reads: fc, the first layer, the final norm, the draft head
    (the verifier's own head and norm, kept for training, are not read)."""
    parts = [model.fc, model.layers[0], model.norm, model.lm_head]
    return sum(weight_bytes(p) for p in parts)


def hf_generate_rate(target, prompts: list[list[int]], max_new_tokens: int) -> dict:
    """HF `generate`, greedy, static cache (transformers compiles the decode step with
    torch.compile on a GPU), on the same prompts: decode tokens/s from the difference of a
    full and a one-token generation (prefill cancels out); one warm-up run first."""
    import torch

    model, dev = target.model, target.device

    def gen(ids, n):
        x = torch.tensor([ids], device=dev)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                       cache_implementation="static", pad_token_id=0)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    warm = gen(prompts[0], max_new_tokens)  # warm-up (and compilation)
    warm += gen(prompts[0], 1)
    full = one = 0.0
    for ids in prompts:
        full += gen(ids, max_new_tokens)
        one += gen(ids, 1)
    tokens = len(prompts) * (max_new_tokens - 1)
    return {"prompts": len(prompts), "decode_s": full - one,
            "tokens_per_s": tokens / (full - one) if full > one else 0.0, "warmup_s": warm}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None,
                    help="random-weight target of this shape (the --target's tokenizer)")
    ap.add_argument("--draft", default=None, help="default: eagle3lab.workdir.default_drafter()")
    ap.add_argument("--prompts", default="eval")
    ap.add_argument("--limit", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--settings", nargs="+", default=["3,1,4", "5,1,6", "4,4,12"],
                    help="steps,topk,draft_tokens triples")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    ap.add_argument("--engine", default="auto", choices=["auto", "eager", "static"])
    ap.add_argument("--batch-size", type=int, default=1,
                    help="also measure each setting with this many prompts in flight")
    ap.add_argument("--hf-baseline", action="store_true",
                    help="HF generate (static cache, compiled decode step) plain tok/s")
    ap.add_argument("--hf-prompts", type=int, default=4, help="prompts for --hf-baseline")
    ap.add_argument("--compare-eager", type=int, default=0, metavar="N",
                    help="the eager engine on N prompts: acceptance-measurement prompts/min")
    ap.add_argument("--compile", action="store_true",
                    help="static engine: torch.compile each captured step (fused kernels)")
    ap.add_argument("--hbm-gbs", type=float, default=4800.0,
                    help="memory bandwidth in GB/s for the limit (H200: 4800)")
    ap.add_argument("--json", default=None, help="also write all results to this file")
    args = ap.parse_args(argv)
    if args.json and Path(args.json).is_dir():
        ap.error(f"--json {args.json}: a directory; give the file to write")

    import torch

    from eagle3lab.specdec.accept import Arm, measure_acceptance, prompt_ids
    from eagle3lab.specdec.load import resolve_engine
    from eagle3lab.targets.adapter import load_target
    from eagle3lab.workdir import drafter_or_default

    work = Path(tempfile.mkdtemp(prefix="bench-accept-"))
    if args.shape:
        from eagle3lab.formats.demo import make_speculators_draft

        tgt = shaped_target(args.shape, args.target, args.dtype, args.device, work)
        t = time.perf_counter()
        draft = args.draft or str(make_speculators_draft(
            work / "draft", target=tgt.path, draft_vocab=min(32000, tgt.vocab_size // 4)))
        print(f"random drafter for the {args.shape} shape written in "
              f"{time.perf_counter() - t:.0f} s")
    else:
        draft = drafter_or_default(args.draft, args.target)
        tgt = load_target(args.target, device=args.device, dtype=args.dtype)
    gpu = tgt.device.type == "cuda"
    engine = resolve_engine(args.engine, tgt)
    print(f"target {tgt.name} on {tgt.device} ({args.dtype}, "
          f"{args.threads or torch.get_num_threads()} threads); drafter {draft}; engine "
          f"{engine}; {args.limit} {args.prompts} prompts x {args.max_new_tokens} new tokens, "
          f"greedy", flush=True)
    t_bytes = weight_bytes(tgt.model)
    everything: dict = {"target": tgt.describe(), "engine": engine, "settings": [],
                        "target_weight_bytes": t_bytes, "complete": False}

    def save() -> None:
        if args.json:
            save_json(args.json, everything)

    save()
    bw = args.hbm_gbs * 1e9
    if gpu:
        from eagle3lab.specdec.load import load_engine

        # the drafter as the engines hold it (same for every setting)
        d_bytes = drafter_bytes(load_engine(target=tgt, draft=str(draft)).drafter.model)
        print(f"bandwidth limit: target weights {t_bytes / 1e9:.2f} GB per step -> plain "
              f"<= {bw / t_bytes:.0f} tok/s at {args.hbm_gbs:.0f} GB/s", flush=True)
    if args.hf_baseline:
        plist = [ids for _, ids in prompt_ids(tgt.tokenizer, args.prompts, args.hf_prompts,
                                              4096)][:args.hf_prompts]
        hf = hf_generate_rate(tgt, plist, args.max_new_tokens)
        everything["hf_static_generate"] = hf
        print(f"HF generate, static cache{' + compiled decode' if gpu else ''}: "
              f"{hf['tokens_per_s']:.1f} tok/s plain ({hf['prompts']} prompts; warm-up "
              f"{hf['warmup_s']:.1f} s)", flush=True)
        save()
    common = dict(target=tgt, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                  threads=args.threads, progress=False)
    fast = dict(engine=engine, compile=args.compile)
    print(f"{'S,K,D':>8} {'tau':>6} {'plain tok/s':>11} {'spec tok/s':>10} {'ratio':>6} "
          f"{'predicted':>9} {'meas/pred':>9} {'ceiling':>7} {'same':>5}  "
          f"cumulative acceptance by position", flush=True)
    for s in args.settings:
        steps, topk, d = (int(x) for x in s.split(","))
        shape = dict(steps=steps, topk=topk, draft_tokens=d)
        arm = [Arm("draft", str(draft))]
        t_setting = time.perf_counter()
        everything["in_progress"] = {"setting": s, "section": "batch1", "prompts_done": 0,
                                     "elapsed_s": 0.0}
        save()
        last_save = [0.0]

        def on_progress(c: dict, s=s, t_setting=t_setting, last_save=last_save) -> None:
            now = time.perf_counter()
            done, n = c["prompts_done"], c["prompts"]
            if not (done == 1 or done == n or now - last_save[0] >= SAVE_EVERY_S):
                return
            last_save[0] = now
            p, a = c["plain"], c["arms"][0]
            everything["in_progress"] = {"setting": s, "section": "batch1",
                                         "elapsed_s": now - t_setting, **c}
            ratio = a["speedup_measured"] or 0.0
            print(f"{s:>8} {done}/{n} prompts: plain {p['completion_tokens']} tokens in "
                  f"{p['decode_s']:.2f} s ({p['tokens_per_s']:.1f} tok/s), spec "
                  f"{a['completion_tokens']} in {a['decode_s']:.2f} s ({a['tokens_per_s']:.1f}"
                  f" tok/s), ratio {ratio:.2f}, tau {a['tau']:.2f}; warm-up (graph captures"
                  f" + compiles) {p['capture_s'] + a['capture_s']:.1f} s; "
                  f"{now - t_setting:.0f} s since the setting began", file=sys.stderr,
                  flush=True)
            save()

        r = measure_acceptance(arms=arm, limit=args.limit, **fast, **shape, **common,
                               on_progress=on_progress)
        a = r["arms"][0]
        st = a["stats"]
        cum = " ".join(f"{v:.2f}" for v in st["acceptance_cumulative"])
        ratio = a["speedup_measured"] or 0.0
        print(f"{s:>8} {st['tau']:6.2f} {r['plain']['tokens_per_s']:11.2f} "
              f"{st['tokens_per_s']:10.2f} {ratio:6.2f} {a['speedup_predicted']:9.2f} "
              f"{ratio / a['speedup_predicted'] if a['speedup_predicted'] else 0:9.2f} "
              f"{a['speedup_ceiling']:7.2f} {a['matches_plain']:>2}/{r['requests']:<2}  {cum}",
              flush=True)
        print(f"{'':>8} step costs: plain {r['plain']['step_s'] * 1e3:.2f} ms/token, verify "
              f"{a['verify_step_s'] * 1e3:.2f} ms, drafting {a['draft_per_verify_s'] * 1e3:.2f}"
              f" ms per verify step; histogram {st['accept_histogram']}", flush=True)
        pl = r["plain"]
        warm = {"plain_capture_s": pl["capture_s"], "plain_captures": pl["captures"],
                "spec_capture_s": a["capture_s"], "spec_captures": a["captures"],
                "plain_decode_s": pl["decode_s"], "spec_decode_s": st["decode_s"],
                "wall_s": time.perf_counter() - t_setting}
        print(f"{'':>8} warm-up (graph captures + compiles, left out of tok/s): "
              f"{pl['capture_s'] + a['capture_s']:.1f} s (plain {pl['capture_s']:.1f} s, "
              f"{pl['captures']} graphs; spec {a['capture_s']:.1f} s, {a['captures']} "
              f"graphs); timed decode: plain {pl['decode_s']:.1f} s, spec "
              f"{st['decode_s']:.1f} s; setting wall {warm['wall_s']:.0f} s", flush=True)
        row = {"setting": s, "batch1": r, "warmup": warm}
        everything["settings"].append(row)
        everything["in_progress"] = {"setting": s, "section": "done", "elapsed_s":
                                     time.perf_counter() - t_setting}
        save()
        if gpu:
            plain_lim = bw / t_bytes
            spec_lim = st["tau"] * bw / (t_bytes + steps * d_bytes)
            row["limits"] = {"drafter_weight_bytes": d_bytes, "plain_tokens_per_s": plain_lim,
                             "spec_tokens_per_s": spec_lim}
            print(f"{'':>8} vs the bandwidth limit: plain {r['plain']['tokens_per_s']:.0f} of "
                  f"{plain_lim:.0f} tok/s ({r['plain']['tokens_per_s'] / plain_lim:.0%}), spec "
                  f"{st['tokens_per_s']:.0f} of {spec_lim:.0f} ({st['tokens_per_s'] / spec_lim:.0%}"
                  f"; drafter {d_bytes / 1e6:.0f} MB x {steps} forwards per verify)", flush=True)
            save()
        if args.batch_size > 1:
            everything["in_progress"]["section"] = "batch"
            save()
            rb = measure_acceptance(arms=arm, limit=args.limit, batch_size=args.batch_size,
                                    **fast, **shape, **common)
            runs = {x["name"]: x for x in rb["batch"]["runs"]}
            sb = rb["arms"][0]["stats"]
            print(f"{'':>8} batch {args.batch_size}: tau {sb['tau']:.2f}, plain "
                  f"{runs['plain']['tokens_per_s']:.0f} tok/s, spec "
                  f"{runs['draft']['tokens_per_s']:.0f} tok/s, x{runs['draft']['speedup']:.2f};"
                  f" acceptance measured at {60 * rb['requests'] / rb['seconds']:.1f} "
                  f"prompts/min ({rb['seconds']:.1f} s for {rb['requests']}; graph captures "
                  f"{runs['plain']['capture_s']:.1f} s plain, {runs['draft']['capture_s']:.1f}"
                  f" s spec, left out of tok/s)", flush=True)
            row["batch"] = rb
            save()
        if args.compare_eager:
            everything["in_progress"]["section"] = "eager"
            save()
            re_ = measure_acceptance(arms=arm, limit=args.compare_eager, engine="eager",
                                     **shape, **common)
            rate_e = 60 * re_["requests"] / re_["seconds"]
            src = row.get("batch", r)
            rate_s = 60 * src["requests"] / src["seconds"]
            print(f"{'':>8} acceptance measurement: {engine} "
                  f"{'batch ' + str(args.batch_size) if 'batch' in row else 'batch 1'} "
                  f"{rate_s:.1f} prompts/min vs eager {rate_e:.2f} prompts/min "
                  f"({re_['requests']} prompts): x{rate_s / rate_e:.1f}; eager tau "
                  f"{re_['arms'][0]['stats']['tau']:.2f}, plain {re_['plain']['tokens_per_s']:.1f}"
                  f" tok/s, spec {re_['arms'][0]['stats']['tokens_per_s']:.1f} tok/s",
                  flush=True)
            row["eager"] = re_
            save()
    everything.pop("in_progress", None)
    everything["complete"] = True
    save()
    return 0


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("accept.py", main))
