"""The whole pipeline at GPU scale on the default target, one command, stages reused.

self-prompt (the target writes N user prompts, Magpie-style; held-out eval prompts
excluded) -> regenerate (greedy answers to those and to the shipped train prompts, plus
`--samples` sampled answers per train prompt; batched on the GPU, seeds recorded) ->
extract (train and held-out eval) -> draft vocab map -> train -> pack the drafter for
shipping (bf16, without the embedding the target already has) -> offline acceptance on the
held-out prompts (tau and speedup at 3 and --ttt-steps draft steps). Prints each stage's
throughput and the wall time, and writes summary-STAGE-TRAINNAME.json. The same library
functions as the CPU demo; only sizes and device differ. Every stage resumes where it
stopped (so a run can be spread over several time-limited calls: `--stage data`, then
`--stage train`).

    python -P bench/gpu_pipeline.py --out /tmp/gpu-run --stage data --self-prompts 16000
    python -P bench/gpu_pipeline.py --out /tmp/gpu-run --stage train --epochs 8 \
        [--train-name lmhead --train-lm-head]

With more than one GPU visible, every GPU is used (`--nproc`, default: all of them): the
data stages run again under torchrun (`--stage data` on every rank: each answers, samples
and extracts its share; rank 0 merges), and training runs as `torchrun -m eagle3lab train`
when `eagle3lab train` trains on many ranks (else on one GPU, saying so).

On a CPU, tiny sizes check the code path:
    python -P bench/gpu_pipeline.py --out /tmp/gp --device cpu --limit 4 --samples 2 \
        --self-prompts 4 --self-prompt-batch 8 --max-new-tokens 16 --epochs 1 --eval-limit 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve()


def accept_stage(*, drafter: Path, dst: Path, target: str, device: str, dtype: str,
                 limit: int, max_new_tokens: int, steps: int) -> dict:
    """Offline acceptance of the packed drafter on the held-out prompts (greedy, chains of
    3 and `steps` draft steps): the same measurement and JSON as `eagle3lab accept --json`,
    one object per setting, written to `dst`."""
    from eagle3lab.specdec.accept import measure_acceptance
    from eagle3lab.fsutil import atomic_write_json
    from eagle3lab.targets.adapter import load_target

    tgt = load_target(target, device=device, dtype=dtype)  # once, for every setting
    results, row = [], {}
    for s in sorted({3, steps}):
        r = measure_acceptance(target=tgt, draft=str(drafter), prompts="eval", limit=limit,
                               max_new_tokens=max_new_tokens, steps=s, progress=False)
        a = r["arms"][0]
        results.append(r)
        row[f"tau_{s}_steps"] = round(a["stats"]["tau"], 3)
        row[f"speedup_{s}_steps"] = round(a["speedup_measured"] or 0, 3)
        row[f"same_as_plain_{s}_steps"] = f"{a['matches_plain']}/{r['requests']}"
    atomic_write_json(dst, results)
    return {"out": str(dst), **row}


def torchrun(nproc: int, *args: str) -> None:
    """Run `args` (a script and its options, or -m MODULE ...) on nproc ranks of this node."""
    lead = ["-m"] if args[0] == "-m" else []  # "--": the rest is not torchrun's options
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(nproc), *lead, "--", *args[len(lead):]]
    print(f"$ torchrun --standalone --nproc-per-node {nproc} {' '.join(args)}", flush=True)
    rc = subprocess.run(cmd).returncode
    if rc != 0:
        raise SystemExit(f"gpu_pipeline: `{' '.join(args[:3])} ...` on {nproc} ranks failed "
                         f"(exit {rc}); its output is above. Re-running resumes.")


def train_on_ranks(cfg, nproc: int) -> dict:
    """`torchrun -m eagle3lab train --config CFG` (the same TrainConfig); its summary."""
    from eagle3lab.fsutil import atomic_write_json
    from eagle3lab.train import read_run

    path = Path(cfg.out).with_name(Path(cfg.out).name + "-config.json")
    atomic_write_json(path, cfg.model_dump())
    torchrun(nproc, "-m", "eagle3lab", "train", "--config", str(path))
    return read_run(Path(cfg.out))["summary"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="run directory (stages are reused)")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--stage", choices=["all", "data", "train"], default="all")
    ap.add_argument("--limit", type=int, default=None, help="train prompts (default: all)")
    ap.add_argument("--samples", type=int, default=12,
                    help="sampled answers per shipped train prompt (0: none)")
    ap.add_argument("--greedy-train", action=argparse.BooleanOptionalAction, default=False,
                    help="also one greedy answer per shipped train prompt")
    ap.add_argument("--self-prompts", type=int, default=0,
                    help="user prompts the target writes itself, answered greedily")
    ap.add_argument("--self-prompt-batch", type=int, default=2048,
                    help="user turns sampled together")
    ap.add_argument("--self-prompt-tokens", type=int, default=96,
                    help="length cap of a self-written prompt")
    ap.add_argument("--train-name", default="train", help="run directory name under --out")
    ap.add_argument("--train-lm-head", action="store_true", help="train the draft head too")
    ap.add_argument("--ttt-decay", type=float, default=1.0,
                    help="TTT loss weight decay per position")
    ap.add_argument("--checkpoint-every", type=int, default=200, help="steps")
    ap.add_argument("--accept-limit", type=int, default=16,
                    help="held-out prompts for the offline acceptance stage (0: skip)")
    ap.add_argument("--accept-tokens", type=int, default=128, help="new tokens per prompt")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--eval-limit", type=int, default=None, help="eval prompts (default all)")
    ap.add_argument("--draft-vocab-size", type=int, default=8192)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--ttt-steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--max-tokens-per-batch", type=int, default=16384)
    ap.add_argument("--nproc", type=int, default=None,
                    help="ranks (GPUs) of the data stages and of training, through torchrun "
                    "when > 1 (default: every visible GPU; 1 on a CPU)")
    args = ap.parse_args(argv)
    if args.stage in ("all", "data") and not (args.self_prompts or args.greedy_train
                                              or args.samples):
        ap.error("no training data: give --self-prompts, --greedy-train or --samples")

    import torch

    from eagle3lab import distributed
    from eagle3lab.data.extract import extract
    from eagle3lab.data.prompts import concat_jsonl
    from eagle3lab.data.regenerate import regenerate
    from eagle3lab.data.selfprompt import synthesize_prompts
    from eagle3lab.data.stagerun import DEFAULT_TIMEOUT_S
    from eagle3lab.data.vocab import build_shard_vocab
    from eagle3lab.targets.adapter import load_target, resolve_device
    from eagle3lab.train import TrainConfig, pack_drafter, train_run
    from eagle3lab.workdir import WorkDir

    wd = WorkDir(Path(args.out))
    wd.root.mkdir(parents=True, exist_ok=True)
    dev = resolve_device(args.device)
    cuda = dev.startswith("cuda")
    dtype = "bfloat16" if cuda else "float32"
    ranks = distributed.detect()
    nproc = args.nproc or (torch.cuda.device_count() if cuda else 1)
    summary: dict = {"args": vars(args), "device": dev, "ranks": ranks.world_size,
                     "gpu": torch.cuda.get_device_name(0) if cuda else None, "stages": {}}
    t_all = time.time()

    def stage(name, fn):
        t0 = time.time()
        r = fn()
        r = dict(r) if isinstance(r, dict) else {"result": r}
        r["wall_s"] = round(time.time() - t0, 2)
        summary["stages"][name] = r
        if ranks.main:
            print(f"[{name}] {json.dumps({k: v for k, v in r.items() if not isinstance(v, (list, dict))}, default=str)}",
                  flush=True)
        return r

    if args.stage in ("all", "data") and nproc > 1 and not ranks.many:
        # every GPU: the data stages again, on nproc ranks (this script under torchrun)
        data_args = list(argv if argv is not None else sys.argv[1:]) + ["--stage", "data"]
        torchrun(nproc, str(SCRIPT), *data_args)
        data_summary = wd.root / f"summary-data-{args.train_name}.json"
        summary["stages"].update(json.loads(data_summary.read_text())["stages"])
    elif args.stage in ("all", "data"):
        session = distributed.session(device=dev, timeout=DEFAULT_TIMEOUT_S)
        ranks = session.__enter__()  # under torchrun: one process group for every data stage
        tgt = load_target(args.target, device=ranks.device, dtype=dtype)
        parts = []
        if args.self_prompts:
            stage("self_prompt", lambda: synthesize_prompts(
                target=tgt, out=wd.self_prompts, n=args.self_prompts,
                batch_size=args.self_prompt_batch, max_new_tokens=args.self_prompt_tokens,
                seed=args.seed, progress=False))
            stage("regenerate_self", lambda: regenerate(
                target=tgt, prompts=wd.self_prompts, out=wd.responses("self"),
                max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                progress=False))
            parts.append(wd.responses("self"))
        if args.greedy_train:
            stage("regenerate_train_greedy", lambda: regenerate(
                target=tgt, prompts="train", out=wd.responses("train_greedy"),
                limit=args.limit, max_new_tokens=args.max_new_tokens,
                batch_size=args.batch_size, progress=False))
            parts.append(wd.responses("train_greedy"))
        if args.samples:
            stage("regenerate_train", lambda: regenerate(
                target=tgt, prompts="train", out=wd.responses("train_sampled"),
                limit=args.limit, samples=args.samples, temperature=args.temperature,
                seed=args.seed, max_new_tokens=args.max_new_tokens,
                batch_size=args.batch_size, progress=False))
            parts.append(wd.responses("train_sampled"))
        stage("concat", lambda: ranks.on_main(
            lambda: concat_jsonl(parts, wd.responses_train)))
        stage("regenerate_eval", lambda: regenerate(
            target=tgt, prompts="eval", out=wd.responses_eval,
            limit=args.eval_limit, max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size, progress=False))
        for split in ("train", "eval"):
            stage(f"extract_{split}", lambda split=split: extract(
                conversations=wd.responses(split), out=wd.shards(split),
                target=tgt, samples_per_shard=1024, max_tokens_per_batch=65536,
                progress=False))
        stage("vocab", lambda: ranks.on_main(lambda: build_shard_vocab(
            data=wd.shards_train, draft_vocab_size=args.draft_vocab_size)))
        del tgt
        if cuda:
            torch.cuda.empty_cache()
        session.__exit__(None, None, None)
    if args.stage in ("all", "train"):
        run = wd.run(args.train_name)
        cfg = TrainConfig(data=str(wd.shards_train), eval_data=str(wd.shards_eval),
                          out=str(run), epochs=args.epochs, lr=args.lr,
                          warmup_steps=50, schedule="cosine", ttt_steps=args.ttt_steps,
                          max_tokens_per_batch=args.max_tokens_per_batch, eval_every=100,
                          device=dev, progress=False, seed=args.seed,
                          resume=(run / "run.json").exists(),
                          train_lm_head=args.train_lm_head,
                          ttt_step_loss_decay=args.ttt_decay,
                          checkpoint_every=args.checkpoint_every)
        many = nproc > 1
        stage("train", lambda: train_on_ranks(cfg, nproc) if many else train_run(cfg))
        stage("pack", lambda: pack_drafter(wd.final_of(args.train_name),
                                           wd.packed(args.train_name)))
        if args.accept_limit:
            stage("accept", lambda: accept_stage(
                drafter=wd.packed(args.train_name),
                dst=wd.accept_record(args.train_name), target=args.target, device=dev,
                dtype=dtype, limit=args.accept_limit, max_new_tokens=args.accept_tokens,
                steps=args.ttt_steps))
    summary["wall_s"] = round(time.time() - t_all, 2)
    if not ranks.main:
        return 0
    summary_path = wd.root / f"summary-{args.stage}-{args.train_name}.json"
    summary_path.write_text(json.dumps(summary, indent=2, default=str))
    print(f"wall time {summary['wall_s']} s; summary in {summary_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
