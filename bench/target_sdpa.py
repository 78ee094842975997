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
(the largest difference beside the largest |state|, and the relative L1); with
--fp32-reference, how far each is from the same forwards in fp32 (math attention): which
kernel's states are nearer the exact ones. With --compiled, a third setting: eagle3lab's
kernels with the target's base model compiled (`Target.compile`, what online training's
`target_compile` does), its graphs and graph breaks counted: whether compiling the target's
forward takes host time off a step (session 22). The first --warmup micro-batches are not
counted (the compile happens there). The states' difference is against eagle3lab's
setting (sum |a - b| / sum |b|).

    python3 -P bench/target_sdpa.py --config TRAIN.json --steps 60      # a GPU
    python3 -P bench/target_sdpa.py --config TRAIN.json --steps 60 --compiled --fp32-reference
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
    ap.add_argument("--compiled", action="store_true",
                    help="a third setting: the target's base model compiled (torch.compile, "
                    "dynamic shapes), eagle3lab's kernels")
    ap.add_argument("--compile-backend", default="inductor",
                    help="torch.compile's backend for --compiled (eager: dynamo's capture "
                    "only, the CPU test)")
    args = ap.parse_args(argv)

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
    if args.compiled:  # the hooks registered once: what online training's target_compile does
        settings["compiled"] = list(FEATURE_SDPA)
        tgt.compile(train_set.aux_layers, backend=args.compile_backend)
    res = _measure(args, train_set, micro, settings, cuda)
    tgt.sdpa_backends = list(FEATURE_SDPA)
    if args.out:
        atomic_write_json(Path(args.out), res)
    return 0


def _measure(args, train_set, micro, settings, cuda: bool) -> dict:
    import torch

    tgt = train_set.target
    times = {k: {"host_ms": [], "wall_ms": []} for k in settings}
    # per setting, against eagle3lab's default: largest |a - b|, sum |a - b|
    diff = {k: [0.0, 0.0] for k in settings if k != "eagle3lab"}
    peak = base_l1 = 0.0  # eagle3lab's states: largest |b|, sum |b|
    # sum |setting - fp32|, sum |fp32|; "storage": the fp32 states in the states' dtype
    to_fp32 = {k: [0.0, 0.0] for k in [*settings, "storage"]}

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for n, ids in enumerate(micro):
        out = {}
        for name, backends in settings.items():
            tgt.sdpa_backends = backends
            tgt.use_compiled = name == "compiled"
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
        tgt.use_compiled = False
        for i, b in enumerate(out["eagle3lab"]):
            for key in ("hidden_states", "verifier_last_hidden_states"):
                y = b[key].float()
                peak = max(peak, float(y.abs().max()))
                base_l1 += float(y.abs().sum())
                for name, d in diff.items():
                    x = out[name][i][key].float()
                    d[0] = max(d[0], float((x - y).abs().max()))
                    d[1] += float((x - y).abs().sum())
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
    lengths = train_set.lengths()
    tokens = sum(lengths[i] for ids in micro[args.warmup:] for i in ids)
    d = diff["torch"]
    res = {"device": torch.cuda.get_device_name() if cuda else "cpu",
           "micro_batches": len(micro) - args.warmup, "tokens": tokens,
           # torch's choice against eagle3lab's kernels (the names session 21 wrote)
           "max_abs_state_diff": d[0], "max_abs_state": peak,
           "relative_l1_state_diff": d[1] / base_l1 if base_l1 else 0.0, "settings": {}}
    if "compiled" in settings:
        from torch._dynamo.utils import counters

        res["compiled"] = {"backend": args.compile_backend,
                           "graphs": int(counters["stats"]["unique_graphs"]),
                           "graph_breaks": int(sum(counters["graph_break"].values())),
                           "graph_break_reasons": sorted(counters["graph_break"])[:10]}
    print(f"{res['micro_batches']} micro-batches ({tokens:,} tokens) on {res['device']}, "
          f"each through the target once per setting (alternating):")
    for name in settings:
        h, w = (sum(times[name][k]) / max(len(times[name][k]), 1) for k in ("host_ms", "wall_ms"))
        f, r = to_fp32[name]
        res["settings"][name] = {
            "backends": settings[name], "compiled": name == "compiled", "host_ms": h,
            "wall_ms": w, "relative_l1_to_fp32": f / r if args.fp32_reference and r else None}
        print(f"  {name:<10} sdpa {settings[name] or 'torch chooses (cuDNN where it can)'}"
              f"{' compiled' if name == 'compiled' else ''}: "
              f"host {h:.2f} ms, wall {w:.2f} ms a micro-batch"
              + (f"; states {f / r:.3g} relative L1 from fp32" if args.fp32_reference and r
                 else ""))
    base = res["settings"]["eagle3lab"]
    for name, d in diff.items():
        row = res["settings"][name]
        row["vs_eagle3lab"] = {
            "host": row["host_ms"] / base["host_ms"] if base["host_ms"] else None,
            "wall": row["wall_ms"] / base["wall_ms"] if base["wall_ms"] else None,
            "max_abs_state_diff": d[0],
            "relative_l1_state_diff": d[1] / base_l1 if base_l1 else 0.0}
    if args.fp32_reference and to_fp32["storage"][1]:
        res["storage_relative_l1_to_fp32"] = to_fp32["storage"][0] / to_fp32["storage"][1]
        print(f"  (the fp32 states rounded to {train_set.store_dtype}: "
              f"{res['storage_relative_l1_to_fp32']:.3g} relative L1 from fp32)")
    v = res["settings"]["torch"]["vs_eagle3lab"]
    res["ratios"] = {"host": v["host"], "wall": v["wall"]}
    for name in diff:
        v = res["settings"][name]["vs_eagle3lab"]
        print(f"  {name} / eagle3lab: host x{v['host']:.2f}, wall x{v['wall']:.2f}; states: "
              f"largest difference {v['max_abs_state_diff']:.3g} (largest |state| {peak:.3g}),"
              f" relative L1 difference {v['relative_l1_state_diff']:.3g}")
    if "compiled" in settings:
        c = res["compiled"]
        why = ": " + "; ".join(c["graph_break_reasons"]) if c["graph_breaks"] else ""
        print(f"  compiled ({c['backend']}): {c['graphs']} graph(s), {c['graph_breaks']} "
              f"graph break(s){why}")
    return res


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("target_sdpa.py", main))
