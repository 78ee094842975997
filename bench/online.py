"""Online training vs extraction + offline training: tokens/s and bytes, side by side, one run.

Prevents choosing between online training and shards from a guess: both paths run here on
the same conversations and process the same tokens (asserted), so the ratios compare like
with like.

On one target and one conversations JSONL, in this process, one after the other:
  extract          `eagle3lab extract` of every conversation: tokens/s, bytes written
  vocab            `eagle3lab vocab` on those shards (seconds)
  train offline    `eagle3lab train --data SHARDS` for --epochs: tokens/s (steady, after
                   --warmup steps, from metrics.jsonl) and the call's wall time
  train online     `eagle3lab train --online` on the same conversations, same settings:
                   without the states cache, and with it (its second epoch runs no target
                   forward: that epoch's tokens/s is shown beside the uncached run's)
after one untimed offline step (imports, first calls). Then the ratios: online / offline
training tokens/s, and end to end (extract + vocab + offline training vs online training,
the same tokens processed: the same steps of the same batches). Bytes written: the shards
+ vocab map (offline) vs the run's vocab map (online); both runs write the same
checkpoints and final/. Results: WORK/online.json.

--draft-attn K1,K2,... (TrainConfig.draft_attn values): the rows above use the first
kernel that can train here; each other one then trains offline and online on the same
shards and conversations (no states-cache run), and its steady tokens/s are shown beside
the first's with their ratios ("draft_attn" in online.json). A kernel that cannot train
here (flex on the CPU) is listed with the reason.

    .venv/bin/python bench/online.py --tiny                     # CPU, a tiny random target
    .venv/bin/python bench/online.py --n 48                     # CPU, the default target
    python3 -P bench/online.py --device cuda --conversations R.jsonl --epochs 2 \
        --max-tokens-per-batch 16384 --model-dtype bfloat16    # an H200
        [--draft-attn sdpa,simple_flex_attention]              # + the kernels
(--tiny checks the code path; its figures measure nothing.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

# Not bench/ itself on sys.path (bench/inspect.py would shadow the stdlib module), the
# repository root instead, so that `eagle3lab` imports without an install.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BENCH = Path(__file__).resolve().parent
#: --tiny: bench/scale.py's tiny target shape (random weights, one-word tokenizer).
TINY = dict(n=24, length=96, epochs=2, max_tokens=256, forward_tokens=1024,
            draft_vocab=128, warmup=1)


def _bench(name: str):
    """Another bench/ script as a module (its helpers, not its main)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rates(out: Path, warmup: int) -> dict:
    """A run's tokens/s: steady (bench/train.py's, after `warmup` steps) and over its last
    epoch (the rows after the first epoch ended), both from metrics.jsonl."""
    from eagle3lab.train.counts import read_metrics

    if not warmup:  # the untimed first run, or --warmup 0: no steady window
        return {"steady_tokens_per_s": None, "epoch2_tokens_per_s": None}
    df = read_metrics(out)
    df = df[df["train_loss_0"].notna()].reset_index(drop=True)
    steady = (_bench("train").steady_rate(out, warmup) if len(df) > warmup
              else {"tokens_per_s": None})  # too few steps for a steady window
    first = df[df["epoch"] <= 1.0 + 1e-9]
    last_epoch = None
    if len(first) and len(first) < len(df):
        a, b = first.iloc[-1], df.iloc[-1]
        last_epoch = (b["tokens"] - a["tokens"]) / (b["wall_s"] - a["wall_s"])
    return {"steady_tokens_per_s": steady["tokens_per_s"], "epoch2_tokens_per_s": last_epoch}


def _run(kw: dict, out: Path, warmup: int) -> dict:
    from eagle3lab.train import train

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    summary = train(out=str(out), **kw)
    wall = time.perf_counter() - t0
    return {"tokens": summary["tokens"], "steps": summary["steps"], "seconds": wall,
            "tokens_per_s": summary["tokens"] / wall, **_rates(out, warmup)}


def _resolved(run: Path) -> str | None:
    """The kernel a run trained with (run.json's drafter.draft_attn: "auto" resolved)."""
    return json.loads((run / "run.json").read_text())["drafter"].get("draft_attn")


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true",
                    help="CPU, a tiny random target and random conversations (a code-path "
                    "check, not a measurement)")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--conversations", default=None,
                    help="JSONL from `eagle3lab regenerate` (default: shipped prompts answered "
                    "by 160 tokens of another prompt, bench/extract.py's)")
    ap.add_argument("--n", type=int, default=48, help="synthetic conversations")
    ap.add_argument("--limit", type=int, default=None, help="use the first N conversations")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--model-dtype", default=None,
                    help="dtype the target runs in (default: bfloat16 on CUDA, else float32)")
    ap.add_argument("--states-dtype", default="bfloat16", help="shard / states dtype")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-tokens-per-batch", type=int, default=None,
                    help="packed tokens per step (default 2048, CUDA 8192)")
    ap.add_argument("--forward-tokens", type=int, default=16384,
                    help="padded tokens per target forward (extract and online alike)")
    ap.add_argument("--draft-vocab-size", type=int, default=8192)
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps of the steady rate")
    ap.add_argument("--work", default=None, help="work directory (default: a new temporary "
                    "one); the shards and runs are removed at the end unless --keep")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--ttt", type=int, default=3, help="TTT steps of every training run")
    ap.add_argument("--draft-attn", nargs="+", default=["sdpa"], help="draft attention "
                    "kernel(s), comma- or space-separated, measured side by side (sdpa, eager, "
                    "simple_flex_attention, auto)")
    args = ap.parse_args(argv)
    attns = _bench("train").parse_attns(",".join(args.draft_attn))

    import torch

    from eagle3lab.data.extract import extract
    from eagle3lab.data.prompts import read_conversations
    from eagle3lab.data.vocab import build_shard_vocab
    from eagle3lab.targets.adapter import load_target, resolve_device

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-online-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.tiny:
        scale = _bench("scale")
        target = str(scale.random_llama(work / "target-tiny", scale.TINY_TARGET, False)
                     if not (work / "target-tiny" / "config.json").exists()
                     else work / "target-tiny")
        convs = scale.random_conversations(work / "conversations.jsonl",
                                           vocab=scale.TINY_TARGET["vocab_size"],
                                           n=TINY["n"], length=TINY["length"])
        args.device, args.epochs, args.warmup = "cpu", TINY["epochs"], TINY["warmup"]
        args.max_tokens_per_batch = TINY["max_tokens"]
        args.forward_tokens, args.draft_vocab_size = TINY["forward_tokens"], TINY["draft_vocab"]
    else:
        target = args.target
    device = resolve_device(args.device)
    cuda = device.startswith("cuda")
    model_dtype = args.model_dtype or ("bfloat16" if cuda else "float32")
    max_tokens = args.max_tokens_per_batch or (8192 if cuda else 2048)
    tgt = load_target(target, device=device, dtype=model_dtype)
    if not args.tiny:
        convs = (Path(args.conversations) if args.conversations else
                 _bench("extract").synthetic_conversations(work / "conversations.jsonl",
                                                           tgt.tokenizer, args.n))
    if args.limit:  # one file for both paths: the first N conversations
        # bytes split at "\n" only: str.splitlines would also cut inside a JSON string at
        # U+2028 / U+0085 (regenerate writes ensure_ascii=False), leaving torn records
        lines = Path(convs).read_bytes().splitlines(keepends=True)[:args.limit]
        convs = work / "conversations-limit.jsonl"
        convs.write_bytes(b"".join(lines))
    n_convs = len(read_conversations(convs))
    from eagle3lab.errors import UserError
    from eagle3lab.train.model import resolve_draft_attn

    problems: dict[str, str | None] = {}
    for a in attns:  # before any work: which kernels can train here
        try:
            resolve_draft_attn(a, device=device, max_tokens=max_tokens)
            problems[a] = None
        except UserError as e:
            problems[a] = str(e).splitlines()[0]
    base = next((a for a in attns if problems[a] is None), None)
    if base is None:
        raise UserError(f"None of --draft-attn {' '.join(args.draft_attn)} can train on "
                        f"{device}: " + "; ".join(f"{a}: {p}" for a, p in problems.items()))
    where = (torch.cuda.get_device_name(0) if cuda else "CPU") + (
        " (--tiny: a code-path check, not a measurement)" if args.tiny else "")
    print(f"bench/online.py: {where}; target {tgt.name} ({model_dtype}); {n_convs} "
          f"conversations ({convs}); states {args.states_dtype}; {args.epochs} epochs of "
          f"{max_tokens} tokens a step; {args.forward_tokens} padded tokens a target forward; "
          f"draft attention {', '.join(attns)}; work {work}")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    shards = work / "shards"
    shutil.rmtree(shards, ignore_errors=True)
    sync()
    t0 = time.perf_counter()
    ex = extract(conversations=convs, out=shards, target=tgt, dtype=args.states_dtype,
                 model_dtype=model_dtype, max_tokens_per_batch=args.forward_tokens,
                 progress=False)
    sync()
    extract_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    build_shard_vocab(data=shards, draft_vocab_size=args.draft_vocab_size)
    vocab_s = time.perf_counter() - t0
    shard_bytes = _dir_bytes(shards)
    del tgt
    if cuda:
        torch.cuda.empty_cache()

    common = dict(epochs=args.epochs, max_tokens_per_batch=max_tokens, eval_every=0,
                  eval_at_start=False, schedule="constant", device=device, progress=False,
                  pad_batches=cuda, cpu_threads=1 if args.tiny else 0, draft_attn=base,
                  ttt_steps=args.ttt)
    online = dict(online=True, conversations=str(convs), target=target,
                  model_dtype=model_dtype, states_dtype=args.states_dtype,
                  forward_tokens=args.forward_tokens, draft_vocab_size=args.draft_vocab_size,
                  **common)
    # untimed: one offline step first, so that no timed run pays the first call's costs
    # (imports, kernels chosen, allocator warmed)
    _run(dict(data=str(shards), **{**common, "max_steps": 1}), work / "run-warmup", 0)
    rows = {"offline": _run(dict(data=str(shards), **common), work / "run-offline",
                            args.warmup),
            "online": _run(online, work / "run-online", args.warmup),
            "online_cache": _run({**online, "states_cache": True}, work / "run-online-cache",
                                 args.warmup)}
    by_attn: dict[str, dict] = {}
    for a in attns:  # the other kernels, the same data, one after the other
        if a == base or problems[a]:
            by_attn[a] = ({"offline": rows["offline"], "online": rows["online"]}
                          if a == base else {"problem": problems[a]})
            continue
        by_attn[a] = {
            "offline": _run(dict(data=str(shards), **{**common, "draft_attn": a}),
                            work / f"run-offline-{a}", args.warmup),
            "online": _run({**online, "draft_attn": a}, work / f"run-online-{a}",
                           args.warmup)}
        for kind in ("offline", "online"):
            by_attn[a][kind]["draft_attn"] = _resolved(work / f"run-{kind}-{a}")
            if not args.keep:
                shutil.rmtree(work / f"run-{kind}-{a}", ignore_errors=True)
    for kind in ("offline", "online"):
        by_attn[base][kind]["draft_attn"] = _resolved(work / f"run-{kind}")
    online_vocab_bytes = (work / "run-online" / "vocab_map.safetensors").stat().st_size
    off, on, cached = rows["offline"], rows["online"], rows["online_cache"]
    assert off["tokens"] == on["tokens"] == cached["tokens"], "not the same tokens"
    assert all(r[k]["tokens"] == off["tokens"] for r in by_attn.values() if "problem" not in r
               for k in ("offline", "online")), "not the same tokens"
    attn_ratios = {}
    for a, r in by_attn.items():
        if a != base and "problem" not in r:
            attn_ratios[a] = {k: (r[k]["steady_tokens_per_s"] / by_attn[base][k][
                "steady_tokens_per_s"] if r[k]["steady_tokens_per_s"]
                and by_attn[base][k]["steady_tokens_per_s"] else None)
                for k in ("offline", "online")}
    e2e_off = extract_s + vocab_s + off["seconds"]
    res = {
        "where": where, "target": target, "conversations": str(convs),
        "settings": {"model_dtype": model_dtype, "states_dtype": args.states_dtype,
                     "epochs": args.epochs, "max_tokens_per_batch": max_tokens,
                     "forward_tokens": args.forward_tokens, "device": device,
                     "draft_vocab_size": args.draft_vocab_size, "ttt_steps": args.ttt},
        "extract": {"tokens": ex["tokens"], "seconds": extract_s,
                    "tokens_per_s": ex["tokens"] / extract_s, "bytes": shard_bytes,
                    "bytes_per_token": ex["bytes_per_token"]},
        "vocab": {"seconds": vocab_s}, **rows,
        "end_to_end": {"offline_seconds": e2e_off, "online_seconds": on["seconds"],
                       "online_cache_seconds": cached["seconds"], "tokens": on["tokens"]},
        "bytes_written": {"offline": shard_bytes, "online": online_vocab_bytes},
        "draft_attn": {"first": base, "kernels": by_attn, "ratios_to_first": attn_ratios},
        "ratios": {
            "online_vs_offline_train": (on["steady_tokens_per_s"] / off["steady_tokens_per_s"]
                                        if on["steady_tokens_per_s"]
                                        and off["steady_tokens_per_s"] else None),
            "online_vs_extract_plus_offline": e2e_off / on["seconds"],
            "online_cache_vs_extract_plus_offline": e2e_off / cached["seconds"],
            "cache_epoch2_vs_offline": (cached["epoch2_tokens_per_s"] /
                                        off["epoch2_tokens_per_s"]
                                        if cached["epoch2_tokens_per_s"]
                                        and off["epoch2_tokens_per_s"] else None)},
    }

    def rate(x):
        return f"{x:12,.0f}" if x else f"{'-':>12}"

    print(f"{'':34}{'tokens':>12}{'seconds':>10}{'tok/s (call)':>14}{'tok/s steady':>14}"
          f"{'tok/s epoch 2':>15}{'bytes written':>15}")
    print(f"{'extract':34}{ex['tokens']:12,}{extract_s:10.2f}"
          f"{rate(ex['tokens'] / extract_s):>14}{'':14}{'':15}{shard_bytes:15,}")
    print(f"{'vocab (shards)':34}{'':12}{vocab_s:10.2f}")
    for name, r, b in (("train offline (shards)", off, 0), ("train online", on,
                                                           online_vocab_bytes),
                       ("train online, states cache", cached, online_vocab_bytes)):
        print(f"{name:34}{r['tokens']:12,}{r['seconds']:10.2f}{rate(r['tokens_per_s']):>14}"
              f"{rate(r['steady_tokens_per_s']):>14}{rate(r['epoch2_tokens_per_s']):>15}"
              f"{b:15,}")
    print(f"{'end to end: extract+vocab+offline':34}{on['tokens']:12,}{e2e_off:10.2f}"
          f"{rate(on['tokens'] / e2e_off):>14}{'':14}{'':15}{shard_bytes:15,}")
    rt = {k: v if v is not None else float("nan") for k, v in res["ratios"].items()}
    print(f"ratio online / offline training (steady tok/s)            "
          f"{rt['online_vs_offline_train']:.3f}")
    print(f"ratio end to end: (extract+vocab+offline) s / online s    "
          f"{rt['online_vs_extract_plus_offline']:.3f}  (> 1: online is faster)")
    print(f"ratio end to end: (extract+vocab+offline) s / online+cache s "
          f"{rt['online_cache_vs_extract_plus_offline']:.3f}")
    if res["ratios"]["cache_epoch2_vs_offline"] is not None:
        print(f"ratio epoch 2 tok/s: online with cache / offline          "
              f"{rt['cache_epoch2_vs_offline']:.3f}")
    if len(attns) > 1:
        print(f"{'draft attention, side by side (steady tok/s)':58}{'offline':>12}"
              f"{'online':>14}")
        for a, r in by_attn.items():
            if "problem" in r:
                print(f"  {a:56}cannot train here: {r['problem']}")
                continue
            name = a if r["offline"]["draft_attn"] == a else f"{a} = {r['offline']['draft_attn']}"
            print(f"  {name:56}{rate(r['offline']['steady_tokens_per_s'])}"
                  f"{rate(r['online']['steady_tokens_per_s']):>14}")
        for a, r in attn_ratios.items():
            cells = "".join(f"{x:14.3f}" if x else f"{'-':>14}" for x in r.values())
            print(f"  {'ratio ' + a + ' / ' + base:56}{cells}")
    (work / "online.json").write_text(json.dumps(res, indent=2, default=str))
    print(f"results: {work / 'online.json'}")
    if not args.keep:
        for p in ("shards", "run-warmup", "run-offline", "run-online", "run-online-cache"):
            shutil.rmtree(work / p, ignore_errors=True)
    return 0


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("online.py", main))
