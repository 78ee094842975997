"""Scale-out benchmark: the heavy stages on 1 GPU and on N (default 2), side by side, one run.

Prints, each measured here in this run:
  training (DDP): tokens/s of `eagle3lab train` on 1 GPU and under torchrun on N, their
      ratio (goal >= 1.8 on 2, scaling efficiency >= 0.9) and MFU on each, for the default
      target's drafter (hidden 576, vocab 49152, draft vocab 8192) and an 8B-sized drafter
      (hidden 4096, vocab 128256, draft vocab 32000), on random shards written with the
      shard writer; tokens/s after --warmup steps, from the run's metrics.jsonl;
  peak memory per GPU of the 8B-sized drafter on N GPUs, DDP vs FSDP2 (`--fsdp`);
  extraction: tokens/s of `eagle3lab extract` on 1 GPU and under torchrun on N (goal
      >= 1.8 on 2) for an 8B-shaped Llama target with random bf16 weights (config only,
      saved to --work), and of the `--device-map auto` run over all visible GPUs in one
      process, with its hidden states against the 1-GPU run's (bf16 tolerance).
Each command line is printed as it runs; results go to
WORK/scale.json.

    python bench/scale.py --work /tmp/scale                    # 2 GPUs, both parts
    python bench/scale.py --work /tmp/scale --parts extract    # one part (reuses --work)
    python bench/scale.py --tiny                               # CPU: gloo, 2 processes,
                                                                 tiny shapes (tested)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Not bench/ itself on sys.path (bench/inspect.py would shadow the stdlib module), the
# repository root instead, so that `eagle3lab` imports without an install.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SCRIPT = Path(__file__).resolve()
#: Shapes of the targets the drafters are trained for (random_shards' arguments).
DRAFTERS = {
    "default": dict(hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536,
                    vocab=49152, draft_vocab=8192),
    "8b": dict(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336,
               vocab=128256, draft_vocab=32000),
}
TINY_DRAFTERS = {
    "default": dict(hidden=64, layers=8, heads=4, kv_heads=2, intermediate=128, vocab=1024,
                    draft_vocab=256),
    "8b": dict(hidden=128, layers=8, heads=4, kv_heads=2, intermediate=256, vocab=2048,
               draft_vocab=512),
}
TARGET_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)
TINY_TARGET = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=1024)


def bench_train():
    """bench/train.py as a module (random_shards, steady_rate, flops_per_token)."""
    spec = importlib.util.spec_from_file_location("bench_train", SCRIPT.parent / "train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --- one measured run: this script as a worker, under torchrun when N > 1 ---------------

def peak_memory() -> list[int]:
    """Peak bytes of this process: allocated on each visible GPU, else host RSS."""
    import resource

    import torch

    if torch.cuda.is_available():
        return [torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count())]
    return [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024]


def worker(spec_path: str) -> int:
    """Run one stage as its spec says (the CLI's `train`, or the library's `extract`, which
    returns its tokens/s) and write this rank's result next to the spec."""
    from eagle3lab.distributed import detect

    spec = json.loads(Path(spec_path).read_text())
    if spec["kind"] == "link":
        result = {"rc": 0, "summary": link_worker(spec["kwargs"])}
    elif spec["kind"] == "train":
        from eagle3lab.cli import main as cli_main

        result = {"rc": cli_main(spec["argv"])}
    else:
        from eagle3lab.data.extract import extract

        result = {"rc": 0, "summary": extract(**spec["kwargs"])}
    result["peak_bytes"] = peak_memory()
    rank = detect().rank
    Path(f"{spec['result']}.rank{rank}.json").write_text(json.dumps(result, default=str))
    return result["rc"]


def link_worker(kw: dict) -> dict:
    """On every rank: seconds per all-reduce (torch.distributed, the backend training uses)
    of gradient-sized buffers, fp32 and bf16: the link the DDP step waits on."""
    import time

    import torch
    import torch.distributed as dist

    from eagle3lab.distributed import session

    out = {}
    with session(device="cuda" if torch.cuda.is_available() else "cpu", timeout=300) as d:
        for mb in kw["sizes_mb"]:
            for dt in (torch.float32, torch.bfloat16):
                n = int(mb * 2**20 // torch.empty((), dtype=torch.float32).element_size())
                t = torch.ones(n, dtype=dt, device=d.device)
                for _ in range(2):
                    dist.all_reduce(t)
                if t.is_cuda:
                    torch.cuda.synchronize()
                t0 = time.time()
                for _ in range(kw["reps"]):
                    dist.all_reduce(t)
                if t.is_cuda:
                    torch.cuda.synchronize()
                out[f"{mb}MB-fp32-grads-as-{str(dt).replace('torch.', '')}"] = \
                    (time.time() - t0) / kw["reps"]
    return out


def link_part(args, work: Path, cuda: bool) -> dict:
    """All-reduce times of the two drafters' gradient sizes on N ranks, and what they
    predict for the training ratio (1-GPU step time T, all-reduce time C, no overlap: the
    TTT backward completes every shared weight's gradient only at its end): N-GPU tok/s /
    1-GPU tok/s = N T / (T + C)."""
    sizes = [20, 1170] if not args.tiny else [1, 4]  # trainable params x 4 bytes
    ranks = launch(work, "link", args.gpus, kind="link",
                   kwargs={"sizes_mb": sizes, "reps": 5 if args.tiny else 10})
    times = ranks[0]["summary"]
    print(f"all-reduce on {args.gpus} ranks (seconds per call; algorithm bandwidth):")
    for key, sec in times.items():
        mb = float(key.split("MB")[0]) * (0.5 if key.endswith("bfloat16") else 1.0)
        print(f"  {key:<34} {sec * 1e3:>9.2f} ms  {mb / 1024 / sec:>7.1f} GiB/s")
    return times


def cli_line(kwargs: dict) -> list[str]:
    """The `eagle3lab extract` options equal to these keyword arguments."""
    out = []
    for k, v in kwargs.items():
        if k == "progress":
            out += [] if v else ["--no-progress"]
        elif v is not None and v is not False:
            out += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return out


def launch(work: Path, name: str, nproc: int, *, argv: list[str] | None = None,
           kwargs: dict | None = None, env: dict | None = None,
           kind: str | None = None) -> list[dict]:
    """Run one stage on `nproc` ranks (torchrun when > 1, a plain process otherwise: the
    one-GPU user's command) and return each rank's result."""
    spec = {"kind": kind or ("train" if argv else "extract"), "argv": argv, "kwargs": kwargs,
            "result": str(work / name)}
    path = work / f"{name}.spec.json"
    path.write_text(json.dumps(spec))
    for old in work.glob(f"{name}.rank*.json"):
        old.unlink()
    from eagle3lab.distributed import free_port

    run = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-port", str(free_port())] if nproc > 1 else [sys.executable, "-P"]
    shown = (["torchrun", "--nproc-per-node", str(nproc), "-m", "eagle3lab"] if nproc > 1
             else ["eagle3lab"]) + (argv or ["extract", *cli_line(kwargs)])
    if spec["kind"] == "link":
        shown = ["torchrun", "--nproc-per-node", str(nproc), "bench/scale.py", "(all-reduce)"]
    if FORK_RANKS:
        print(f"  $ {shlex.join(shown)}  (--tiny: {nproc} forked rank(s))", flush=True)
        run_forked(path, nproc, env or {})
    else:
        print(f"  $ {shlex.join(shown)}", flush=True)
        r = subprocess.run(run + ["--", str(SCRIPT), "--worker", str(path)],
                           capture_output=True, text=True, env={**os.environ, **(env or {})})
        if r.returncode != 0:
            raise SystemExit(f"bench/scale.py: {name} failed (exit {r.returncode}):\n"
                             f"{r.stdout[-3000:]}\n{r.stderr[-5000:]}")
    return [json.loads(Path(f"{work / name}.rank{k}.json").read_text()) for k in range(nproc)]


#: --tiny: launch() forks its ranks from this process instead of starting torchrun (or a
#: new Python) per run: the libraries are imported once, not ~8 times (a code-path check
#: on a small CPU, where each import costs more than the run it precedes).
FORK_RANKS = False


def _forked_worker(spec_path: str, rank: int) -> None:
    """One forked rank (eagle3lab.distributed.fork_ranks: torchrun's variables when there
    are several, none for the one-process run, as for the user's plain command; one
    thread; output to SPEC.rankK.log): worker(spec), a non-zero exit raised."""
    rc = worker(spec_path)
    if rc != 0:
        raise RuntimeError(f"rank {rank}: exit {rc}; its output is in "
                           f"{_rank_log(spec_path, rank)}")


def _rank_log(spec_path: str, rank: int) -> str:
    return f"{spec_path[:-len('.spec.json')]}.rank{rank}.log"


def run_forked(spec: Path, nproc: int, env: dict) -> None:
    """Run worker(spec) on nproc ranks forked from this process (the package's
    fork_ranks); a failing rank stops the benchmark with its traceback and the tail of its
    log."""
    from eagle3lab.distributed import fork_ranks as fork

    try:
        fork(lambda rank: _forked_worker(str(spec), rank), world=nproc, env=env,
             torchrun_vars=nproc > 1, logs=lambda rank: _rank_log(str(spec), rank), poll_s=1)
    except Exception as e:  # ProcessRaisedException / ProcessExitedException
        logs = sorted(spec.parent.glob(spec.name.replace(".spec.json", ".rank*.log")))
        tails = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs)
        raise SystemExit(f"bench/scale.py: {spec.name} failed: {e}\n{tails}") from None


# --- training -----------------------------------------------------------------------------

def train_part(args, work: Path, cuda: bool) -> dict:
    bt = bench_train()
    n = args.gpus
    peak = args.peak_flops or (989e12 if cuda else None)
    rows: dict = {}
    print(f"training, DDP: `eagle3lab train`, {args.max_tokens} tokens/step per rank, TTT "
          f"{args.ttt}, {args.warmup} warm-up + {args.steps} timed steps")
    for name, shape in (TINY_DRAFTERS if args.tiny else DRAFTERS).items():
        data = shards_for(args, work, bt, name, shape)
        rows[name] = {k: train_once(args, work, bt, data, name, k, cuda, fsdp=False)
                      for k in (1, n)}
        one, many = rows[name][1], rows[name][n]
        if many["tokens_per_step"] < 0.75 * n * one["tokens_per_step"]:
            many["tokens_per_s"] *= n  # metrics count one rank's tokens: all ranks' instead
            many["note"] = "metrics count one rank's tokens; scaled by the ranks"
        for k, r in rows[name].items():
            r["mfu"] = r["tokens_per_s"] * r["flops_per_token"] / (peak * k) if peak else None
        rows[name]["ratio"] = many["tokens_per_s"] / one["tokens_per_s"]
    big = next(iter(reversed(rows)))
    if not args.skip_fsdp:
        fsdp = train_once(args, work, bt, work / f"shards-{big}" / "shards", big, n, cuda,
                          fsdp=True)
        rows["memory"] = {"drafter": big, "ddp": rows[big][n]["peak_bytes"],
                          "fsdp2": fsdp["peak_bytes"]}
    print_train(rows, n, cuda)
    return rows


def train_once(args, work: Path, bt, data: Path, name: str, nproc: int, cuda: bool, *,
               fsdp: bool, extra: list[str] | None = None, tag: str = "") -> dict:
    from eagle3lab.train import read_run

    out = work / f"train-{name}-{nproc}{'-fsdp' if fsdp else ''}{tag}"
    shutil.rmtree(out, ignore_errors=True)
    argv = ["train", "--data", str(data), "--out", str(out),
            "--max-steps", str(args.steps + args.warmup), "--epochs", "1000",
            "--max-tokens-per-batch", str(args.max_tokens), "--ttt-steps", str(args.ttt),
            "--eval-every", "0", "--no-eval-at-start", "--schedule", "constant",
            "--device", "auto" if cuda else "cpu", "--no-progress"]
    argv += ["--pad-batches"] if cuda else []
    argv += ["--fsdp"] if fsdp else []
    argv += ["--grad-accum", str(args.grad_accum)] if args.grad_accum > 1 else []
    argv += ["--grad-reduce-dtype", args.grad_reduce_dtype] if nproc > 1 and \
        args.grad_reduce_dtype != "float32" else []
    argv += extra or []
    ranks = launch(work, out.name, nproc, argv=argv)
    rate = bt.steady_rate(out, args.warmup)
    layer_cfg = json.loads((out / "final" / "config.json").read_text())[
        "transformer_layer_config"]
    fpt = bt.flops_per_token(read_run(out), layer_cfg, args.ttt, min(args.seq, args.max_tokens))
    return {**rate, "flops_per_token": fpt, "peak_bytes": [max(r["peak_bytes"]) for r in ranks]}


def print_train(rows: dict, n: int, cuda: bool) -> None:
    print(f"  {'drafter':<10} {'1 GPU tok/s':>12} {f'{n} GPUs tok/s':>13} {'ratio':>6} "
          f"{'eff.':>5} {'MFU 1':>6} {f'MFU {n}':>6}")
    for name, r in rows.items():
        if name == "memory":
            continue
        mfu = [f"{r[k]['mfu']:.1%}" if r[k]["mfu"] is not None else "-" for k in (1, n)]
        print(f"  {name:<10} {r[1]['tokens_per_s']:>12,.0f} {r[n]['tokens_per_s']:>13,.0f} "
              f"{r['ratio']:>6.2f} {r['ratio'] / n:>5.2f} {mfu[0]:>6} {mfu[1]:>6}"
              + (f"  ({r[n]['note']})" if r[n].get("note") else ""))
    if "memory" in rows:
        m = rows["memory"]
        what = "GPU memory allocated" if cuda else "host RSS"
        ddp, fsdp = max(m["ddp"]), max(m["fsdp2"])
        print(f"  peak {what} per rank, {m['drafter']} drafter on {n}: DDP "
              f"{ddp / 2**30:,.2f} GiB, FSDP2 {fsdp / 2**30:,.2f} GiB (FSDP2 / DDP "
              f"{fsdp / ddp:.2f})")


def shards_for(args, work: Path, bt, name: str, shape: dict) -> Path:
    root = work / f"shards-{name}"
    if not (root / "shards" / "manifest.json").exists():
        shutil.rmtree(root, ignore_errors=True)
        bt.random_shards(root, **shape, samples=args.samples, seq=args.seq)
    return root / "shards"


def loader_part(args, work: Path, cuda: bool) -> dict:
    """One GPU (no torchrun): tokens/s with the next steps read and collated in-process
    between steps (--data-workers 0) vs by 2 DataLoader processes while the GPU computes."""
    bt = bench_train()
    rows: dict = {}
    print(f"one device, data loading: `eagle3lab train --data-workers 0` vs 2, "
          f"{args.max_tokens} tokens/step")
    for name, shape in (TINY_DRAFTERS if args.tiny else DRAFTERS).items():
        data = shards_for(args, work, bt, name, shape)
        rows[name] = {w: train_once(args, work, bt, data, name, 1, cuda, fsdp=False,
                                    extra=["--data-workers", str(w)], tag=f"-w{w}")
                      for w in (0, 2)}
        rows[name]["ratio"] = rows[name][2]["tokens_per_s"] / rows[name][0]["tokens_per_s"]
    print(f"  {'drafter':<10} {'workers 0 tok/s':>16} {'workers 2 tok/s':>16} {'ratio':>6}")
    for name, r in rows.items():
        print(f"  {name:<10} {r[0]['tokens_per_s']:>16,.0f} {r[2]['tokens_per_s']:>16,.0f} "
              f"{r['ratio']:>6.2f}")
    return rows


# --- extraction ---------------------------------------------------------------------------

def random_llama(path: Path, shape: dict, cuda: bool) -> Path:
    """A Llama of this shape with random bf16 weights and a one-word tokenizer (extraction
    reads ids, not text), saved as a Hugging Face directory."""
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    from eagle3lab.fsutil import atomic_dir

    torch.manual_seed(0)
    cfg = LlamaConfig(**shape, max_position_embeddings=8192, rope_theta=500000.0,
                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=1)
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(
        {"<unk>": 0}, unk_token="<unk>")), unk_token="<unk>")
    with atomic_dir(path) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    del model
    if cuda:
        torch.cuda.empty_cache()
    return path


def random_conversations(path: Path, *, vocab: int, n: int, length: int) -> Path:
    """n conversations of random ids, length//2..length tokens, the last 3/4 trained on."""
    rng = random.Random(0)
    with open(path, "w") as f:
        for i in range(n):
            size = rng.randint(length // 2, length)
            keep = size // 4
            f.write(json.dumps({"id": f"r{i}", "input_ids": [rng.randrange(vocab)
                                                             for _ in range(size)],
                                "loss_mask": [0] * keep + [1] * (size - keep)}) + "\n")
    return path


def compare_shards(a: Path, b: Path, samples: int) -> dict:
    """Sample by sample (evenly spread picks): ids and masks equal, and how far the hidden
    states are apart (bf16 tolerance: |x - y| <= 2^-6 (|x| + rms(x)))."""
    import torch

    from eagle3lab.data.shards import ShardSet

    sa, sb = ShardSet(a), ShardSet(b)
    if len(sa) != len(sb):
        return {"samples": [len(sa), len(sb)], "same_samples": False}
    picks = sorted({round(i * (len(sa) - 1) / max(samples - 1, 1)) for i in range(samples)})
    same, worst, within = True, 0.0, True
    for i in picks:
        x, y = sa[i], sb[i]
        same &= torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(
            x["loss_mask"], y["loss_mask"])
        for key in ("hidden_states", "verifier_last_hidden_states"):
            p, q = x[key].float(), y[key].float()
            diff = (p - q).abs()
            worst = max(worst, float(diff.max() / p.abs().max()))
            within &= bool((diff <= 2 ** -6 * (p.abs() + p.pow(2).mean().sqrt())).all())
    return {"compared": len(picks), "same_ids_and_masks": same, "max_rel_diff": worst,
            "within_bf16_tolerance": within}


def extract_inputs(args, work: Path, cuda: bool) -> tuple[dict, dict]:
    """(target shape, the extract keyword arguments every run shares): the random-weight
    target and conversations, written once into --work."""
    shape = TINY_TARGET if args.tiny else TARGET_8B
    tdir = work / ("target-tiny" if args.tiny else "target-8b")
    if not (tdir / "config.json").exists():
        print(f"extraction: writing a random-weight Llama {shape} to {tdir} ...", flush=True)
        random_llama(tdir, shape, cuda)
    convs = work / f"extract-{args.extract_convs}x{args.extract_len}.jsonl"
    if not convs.exists():
        random_conversations(convs, vocab=shape["vocab_size"], n=args.extract_convs,
                             length=args.extract_len)
    return shape, dict(conversations=str(convs), target=str(tdir), model_dtype="bfloat16",
                       dtype="bfloat16", device="auto" if cuda else "cpu",
                       samples_per_shard=args.samples_per_shard,
                       max_tokens_per_batch=args.extract_batch_tokens,
                       max_seq_len=args.extract_len, progress=False)


def batching_part(args, work: Path, cuda: bool) -> dict:
    """One process, the same conversations batched two ways (--max-tokens-per-batch B and
    B/8): how far apart are the hidden states when only the batch composition differs?
    In bf16 a matmul's rounding depends on the kernel chosen for the batch's shape and the
    padding; a 2-rank run batches its share differently from the 1-GPU run, so its states
    can differ from the 1-GPU ones by as much as this, and no more."""
    shape, base = extract_inputs(args, work, cuda)
    runs, outs = {}, {}
    small = max(args.extract_batch_tokens // 8, args.extract_len)
    print(f"extraction batching (one process): --max-tokens-per-batch "
          f"{args.extract_batch_tokens} vs {small}, model dtype bf16"
          + (" and fp32" if args.batching_fp32 else ""))
    dtypes = ["bfloat16"] + (["float32"] if args.batching_fp32 else [])
    for dt in dtypes:
        for budget in (args.extract_batch_tokens, small):
            key = f"{dt}-{budget}"
            outs[key] = work / f"extract-batching-{key}"
            shutil.rmtree(outs[key], ignore_errors=True)
            ranks = launch(work, f"extract-batching-{key}", 1,
                           kwargs={**base, "model_dtype": dt, "dtype": dt,
                                   "max_tokens_per_batch": budget, "out": str(outs[key])})
            runs[key] = {"tokens_per_s": ranks[0]["summary"]["tokens_per_s"]}
            print(f"    {runs[key]['tokens_per_s']:,.0f} tok/s", flush=True)
        big, little = (outs[f"{dt}-{b}"] for b in (args.extract_batch_tokens, small))
        runs[dt] = compare_shards(big, little, args.compare_samples)
        print(f"  model {dt:<9} ids/masks "
              f"{'same' if runs[dt].get('same_ids_and_masks') else 'DIFFER'}, max rel diff "
              f"{runs[dt].get('max_rel_diff', float('nan')):.2e}, within bf16 tolerance: "
              f"{'yes' if runs[dt].get('within_bf16_tolerance') else 'NO'}")
        if not args.keep:
            shutil.rmtree(big)
            shutil.rmtree(little)
    return runs


def extract_part(args, work: Path, cuda: bool) -> dict:
    shape, base = extract_inputs(args, work, cuda)
    n = args.gpus
    print(f"extraction: {args.extract_convs} random conversations of up to "
          f"{args.extract_len} tokens through the {shape['num_hidden_layers']}-layer, "
          f"hidden-{shape['hidden_size']} target (bf16)")
    runs, outs = {}, {}
    for key, nproc, extra in (("1", 1, {}), (str(n), n, {}),
                              ("device_map", 1, {"device": "auto", "device_map": "auto"})):
        outs[key] = work / f"extract-out-{key}"
        shutil.rmtree(outs[key], ignore_errors=True)
        ranks = launch(work, f"extract-{key}", nproc,
                       kwargs={**base, "out": str(outs[key]), **extra})
        runs[key] = {"tokens_per_s": ranks[0]["summary"]["tokens_per_s"],
                     "tokens": ranks[0]["summary"]["tokens"],
                     "peak_bytes": [max(r["peak_bytes"]) for r in ranks]}
        if key == str(n):  # the N-rank set reads like the 1-GPU one
            runs[key]["vs_1"] = compare_shards(outs["1"], outs[key], args.compare_samples)
            if not args.keep:
                shutil.rmtree(outs[key])
    runs["device_map"]["vs_1"] = compare_shards(outs["1"], outs["device_map"],
                                                args.compare_samples)
    if not args.keep:
        for key in ("1", "device_map"):
            shutil.rmtree(outs[key])
    runs["ratio"] = runs[str(n)]["tokens_per_s"] / runs["1"]["tokens_per_s"]
    one = runs["1"]["tokens_per_s"]
    print(f"  {'run':<34} {'tok/s':>10} {'vs 1':>6}  hidden states vs the one-rank run")
    labels = (("1", "1 GPU" if cuda else "1 process"), (str(n), f"{n} ranks (torchrun)"),
              ("device_map", "--device-map auto, 1 process"))
    for key, label in labels:
        r = runs[key]
        cmp = r.get("vs_1")
        note = "" if not cmp else (
            f"ids/masks {'same' if cmp.get('same_ids_and_masks') else 'DIFFER'}, max rel "
            f"diff {cmp.get('max_rel_diff', float('nan')):.2e}, within bf16 tolerance: "
            f"{'yes' if cmp.get('within_bf16_tolerance') else 'NO'}")
        print(f"  {label:<34} {r['tokens_per_s']:>10,.0f} {r['tokens_per_s'] / one:>6.2f}  "
              f"{note}")
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true",
                    help="CPU, gloo, tiny shapes: checks the code path (not a measurement)")
    ap.add_argument("--gpus", type=int, default=2, help="ranks of the N-GPU runs")
    ap.add_argument("--parts", default="train,extract",
                    help="comma-separated: train, extract (1 vs N GPUs); link (all-reduce "
                    "times of gradient-sized buffers on N); loader, batching (one GPU: data "
                    "workers 0 vs 2; extraction batched two ways)")
    ap.add_argument("--grad-reduce-dtype", default="float32", choices=("float32", "bfloat16"),
                    help="the N-GPU training runs' --grad-reduce-dtype")
    ap.add_argument("--batching-fp32", action="store_true",
                    help="batching: also extract with an fp32 model (the tolerance check)")
    ap.add_argument("--work", default=None, help="work directory (targets and shards are "
                    "reused; default: a new temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the extracted shards")
    ap.add_argument("--peak-flops", type=float, default=None,
                    help="peak FLOP/s per GPU for MFU (default on CUDA: 989e12, H100/H200 "
                    "dense bf16)")
    ap.add_argument("--steps", type=int, default=None, help="timed training steps")
    ap.add_argument("--warmup", type=int, default=None, help="untimed training steps first")
    ap.add_argument("--max-tokens", type=int, default=None, help="tokens per step per rank")
    ap.add_argument("--ttt", type=int, default=3, help="TTT steps")
    ap.add_argument("--grad-accum", type=int, default=1,
                    help="micro-batches per optimizer step (eagle3lab train --grad-accum)")
    ap.add_argument("--skip-fsdp", action="store_true", help="no FSDP2 memory run")
    ap.add_argument("--samples", type=int, default=None, help="random training samples")
    ap.add_argument("--seq", type=int, default=None, help="tokens per random training sample")
    ap.add_argument("--extract-convs", type=int, default=None, help="conversations extracted")
    ap.add_argument("--extract-len", type=int, default=None, help="longest conversation")
    ap.add_argument("--extract-batch-tokens", type=int, default=None,
                    help="padded tokens per extraction forward")
    ap.add_argument("--samples-per-shard", type=int, default=None)
    ap.add_argument("--compare-samples", type=int, default=8,
                    help="samples whose hidden states are compared")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    sizes = dict(steps=3, warmup=1, max_tokens=256, samples=16, seq=64, extract_convs=12,
                 extract_len=48, extract_batch_tokens=256, samples_per_shard=4) if args.tiny \
        else dict(steps=30, warmup=5, max_tokens=8192, samples=64, seq=2048,
                  extract_convs=256, extract_len=2048, extract_batch_tokens=32768,
                  samples_per_shard=64)
    for k, v in sizes.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    known = {"train", "extract", "loader", "batching", "link"}
    if args.gpus < 2 and parts & {"train", "extract", "link"}:
        ap.error("--gpus: at least 2 (the runs on 1 GPU are the baseline)")
    if not parts <= known:
        ap.error(f"--parts: unknown part(s) {sorted(parts - known)}")

    import torch

    cuda = torch.cuda.is_available() and not args.tiny
    if not cuda and not args.tiny:
        ap.error("no GPU is visible: run on a machine with GPUs, or with --tiny (CPU, gloo)")
    if cuda and parts & {"train", "extract", "link"} and torch.cuda.device_count() < args.gpus:
        ap.error(f"--gpus {args.gpus} but {torch.cuda.device_count()} GPU(s) are visible")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    where = (f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if cuda else
             f"CPU, gloo, {args.gpus} processes, tiny shapes (a code-path check, not figures)")
    print(f"bench/scale.py: {where}; work dir {work}")
    env_threads = {} if cuda else {"OMP_NUM_THREADS": "1"}
    os.environ.update(env_threads)  # every rank of a CPU run: one thread, as is fair
    if args.tiny:
        global FORK_RANKS
        FORK_RANKS = True
        torch.set_num_threads(1)  # before any work here: the forked ranks inherit its state
        # what the ranks import (training: speculators, ~10 s of CPU), imported once here:
        # they are forked from this process
        for mod in ("eagle3lab.cli", "eagle3lab.cli.train", "eagle3lab.train",
                    "eagle3lab.data.extract", "eagle3lab.targets.adapter",
                    "transformers.modeling_utils", "speculators.losses", "speculators.config",
                    "speculators.models.eagle3", "speculators.models.eagle3.data",
                    "speculators.train.cli", "speculators.train.data",
                    "speculators.train.distributed_batch_sampler"):
            importlib.import_module(mod)
    results: dict = {"where": where, "gpus": args.gpus, "args": vars(args)}
    if "link" in parts:
        results["link"] = link_part(args, work, cuda)
    if "train" in parts:
        results["train"] = train_part(args, work, cuda)
    if "extract" in parts:
        results["extract"] = extract_part(args, work, cuda)
    if "loader" in parts:
        results["loader"] = loader_part(args, work, cuda)
    if "batching" in parts:
        results["batching"] = batching_part(args, work, cuda)
    (work / "scale.json").write_text(json.dumps(results, indent=2, default=str))
    print(f"results: {work / 'scale.json'}")
    return 0


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("scale.py", main))
