"""The target's forward in online training, attention by cuDNN vs without it: side by side.

Prevents keeping (or dropping) an attention kernel on a guess. Online training computes a
micro-batch's states in `OnlineSet.samples` (the target's padded forwards, the loop's
"batch" region); on an H100 its host time, not the GPU, set the pace (docs/study.md,
session 21: cuDNN's SDPA took 0.67 ms of host time a call). This runs the first --steps
micro-batches of a train config's online data through `samples` twice each, alternating,
once with `Target.sdpa_backends` = None (torch's choice: cuDNN where it takes the shape)
and once with eagle3lab's default (`FEATURE_SDPA`: every kernel but cuDNN's), and prints
per micro-batch the host milliseconds until `samples` returns and the wall milliseconds
until the device has finished, their ratios, and how far the two kernels' states differ
(the largest difference beside the largest |state|, and sum |a - b| / sum |a|); with
--fp32-reference, how far each is from the same forwards in fp32 (math attention): which
kernel's states are nearer the exact ones. The first --warmup micro-batches are not counted.

    python3 -P bench/target_sdpa.py --config TRAIN.json --steps 60      # a GPU
    .venv/bin/python bench/target_sdpa.py --config TRAIN.json --steps 4 --warmup 1 # CPU: the
        # path only (on the CPU both settings are the same kernels)
Writes --out (JSON) if given.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="an online train config JSON "
                    "(`eagle3lab train --config`; its conversations, target and batch size)")
    ap.add_argument("--steps", type=int, default=60, help="micro-batches timed")
    ap.add_argument("--warmup", type=int, default=5, help="micro-batches not counted")
    ap.add_argument("--device", default=None, help="overrides the config's device")
    ap.add_argument("--out", default=None, help="write the figures here (JSON)")
    ap.add_argument("--fp32-reference", action="store_true",
                    help="also run each micro-batch in fp32 (math attention) and say how far "
                    "each setting's states are from it (not timed)")
    args = ap.parse_args(argv)

    import torch

    from eagle3lab.distributed import Ranks
    from eagle3lab.fsutil import atomic_write_json, read_json_object
    from eagle3lab.targets.adapter import FEATURE_SDPA, resolve_device
    from eagle3lab.train.config import TrainConfig
    from eagle3lab.train.online import prepare_online

    raw = read_json_object(Path(args.config), what="train config",
                           fix="Give an online train config (`eagle3lab train --config`).")
    if args.device:
        raw["device"] = args.device
    raw["states_cache"] = False  # every call computes its states
    cfg = TrainConfig.from_dict(raw, args.config)
    dev = resolve_device(cfg.device)
    train_set, data, *_ = prepare_online(cfg, dist=Ranks(device=dev), verbose=True)
    tgt = train_set.target
    cuda = dev.startswith("cuda")
    micro = [[int(i) for i in m] for step in data.steps(cfg.seed, 0, rank=0, world_size=1,
                                                        grad_accum=cfg.grad_accum)
             for m in step][:args.warmup + args.steps]
    settings = {"torch": None, "eagle3lab": list(FEATURE_SDPA)}
    times = {k: {"host_ms": [], "wall_ms": []} for k in settings}
    worst = peak = 0.0
    l1 = [0.0, 0.0]  # sum |torch - eagle3lab|, sum |torch|
    # sum |setting - fp32|, sum |fp32|; "storage": the fp32 states in the states' dtype
    to_fp32 = {k: [0.0, 0.0] for k in [*settings, "storage"]}

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for n, ids in enumerate(micro):
        out = {}
        for name, backends in settings.items():
            tgt.sdpa_backends = backends
            sync()
            t0 = time.perf_counter()
            got = train_set.samples(ids)
            t1 = time.perf_counter()
            sync()
            t2 = time.perf_counter()
            out[name] = got
            if n >= args.warmup:
                times[name]["host_ms"].append((t1 - t0) * 1e3)
                times[name]["wall_ms"].append((t2 - t0) * 1e3)
        for a, b in zip(out["torch"], out["eagle3lab"]):
            for key in ("hidden_states", "verifier_last_hidden_states"):
                x, y = a[key].float(), b[key].float()
                worst = max(worst, float((x - y).abs().max()))
                peak = max(peak, float(x.abs().max()))
                l1[0] += float((x - y).abs().sum())
                l1[1] += float(x.abs().sum())
        if args.fp32_reference:  # the same forwards in fp32 (math attention), kept fp32
            dtype, store = tgt.dtype, train_set.store_dtype
            tgt.model.float()
            tgt.sdpa_backends, train_set.store_dtype = ["MATH"], torch.float32
            try:
                ref = train_set.samples(ids)
            finally:
                tgt.model.to(dtype)  # bf16 -> fp32 -> bf16 is exact
                train_set.store_dtype = store
            for name in [*settings, "storage"]:
                for a, r in zip(out.get(name, ref), ref):
                    for key in ("hidden_states", "verifier_last_hidden_states"):
                        y = r[key]
                        # "storage": fp32 rounded to the states' dtype, the floor of both
                        x = (a[key] if name != "storage" else y.to(store)).float()
                        to_fp32[name][0] += float((x - y).abs().sum())
                        to_fp32[name][1] += float(y.abs().sum())
    tgt.sdpa_backends = list(FEATURE_SDPA)
    lengths = train_set.lengths()
    tokens = sum(lengths[i] for ids in micro[args.warmup:] for i in ids)
    res = {"device": torch.cuda.get_device_name() if cuda else "cpu",
           "micro_batches": len(micro) - args.warmup, "tokens": tokens,
           "max_abs_state_diff": worst, "max_abs_state": peak,
           "relative_l1_state_diff": l1[0] / l1[1] if l1[1] else 0.0, "settings": {}}
    print(f"{res['micro_batches']} micro-batches ({tokens:,} tokens) on {res['device']}, "
          f"each through the target twice (alternating):")
    for name in settings:
        h, w = (sum(times[name][k]) / max(len(times[name][k]), 1) for k in ("host_ms", "wall_ms"))
        d, r = to_fp32[name]
        res["settings"][name] = {"backends": settings[name], "host_ms": h, "wall_ms": w,
                                 "relative_l1_to_fp32": d / r if args.fp32_reference and r
                                 else None}
        print(f"  {name:<10} sdpa {settings[name] or 'torch chooses (cuDNN where it can)'}: "
              f"host {h:.2f} ms, wall {w:.2f} ms a micro-batch"
              + (f"; states {d / r:.3g} relative L1 from fp32" if args.fp32_reference and r
                 else ""))
    if args.fp32_reference and to_fp32["storage"][1]:
        res["storage_relative_l1_to_fp32"] = to_fp32["storage"][0] / to_fp32["storage"][1]
        print(f"  (the fp32 states rounded to {train_set.store_dtype}: "
              f"{res['storage_relative_l1_to_fp32']:.3g} relative L1 from fp32)")
    t, e = res["settings"]["torch"], res["settings"]["eagle3lab"]
    res["ratios"] = {"host": t["host_ms"] / e["host_ms"] if e["host_ms"] else None,
                     "wall": t["wall_ms"] / e["wall_ms"] if e["wall_ms"] else None}
    print(f"  torch / eagle3lab: host x{res['ratios']['host']:.2f}, wall "
          f"x{res['ratios']['wall']:.2f}; states: largest difference {worst:.3g} (largest "
          f"|state| {peak:.3g}), relative L1 difference {res['relative_l1_state_diff']:.3g}")
    if args.out:
        atomic_write_json(Path(args.out), res)
    return 0


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("target_sdpa.py", main))
