"""How long opening a large SpecForge hidden-state directory takes: the reader lists the
samples from the directory entries and loads no tensor but the first sample's (for the
width check), so opening costs file-system metadata, not data.

Builds OUT/rows_{g}-{g+2000}/data_{i}.ckpt for N samples (one real SpecForge-format sample,
hard-linked within each group: the listing cannot tell) and a config-only tiny target, then times
the first open (lists, stats every file, synthesises eagle3lab.manifest.json) and a
second open (lists, reads the recorded manifest), and one sample read.

    .venv/bin/python -P bench/foreign_open.py [--samples 100000] [--out DIR]
(-P keeps bench/ off sys.path.)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def build(out: Path, n: int) -> Path:
    import torch
    from transformers import LlamaConfig

    target = out / "target"
    LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                num_attention_heads=4, num_key_value_heads=2).save_pretrained(target)
    data = out / "specforge"
    first = data / "rows_0-2000" / "data_0.ckpt"
    first.parent.mkdir(parents=True)
    torch.save({"input_ids": torch.arange(256), "loss_mask": torch.ones(256, dtype=torch.long),
                "aux_hidden_state": torch.randn(1, 256, 192, dtype=torch.bfloat16),
                "hidden_state": torch.randn(1, 256, 64, dtype=torch.bfloat16)}, first)
    import shutil

    src = first
    for i in range(1, n):
        g = (i // 2000) * 2000
        d = data / f"rows_{g}-{g + 2000}"
        if i == g:  # one copy per group (a file takes at most ~65000 links)
            d.mkdir()
            src = Path(shutil.copy(first, d / f"data_{i}.ckpt"))
            continue
        os.link(src, d / f"data_{i}.ckpt")
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--out", default=None, help="directory to build in (default: a temp dir)")
    args = ap.parse_args(argv)
    from eagle3lab.data.foreign import open_shards

    out = Path(args.out or tempfile.mkdtemp(prefix="eagle3lab-bench-foreign-"))
    t0 = time.perf_counter()
    data = build(out, args.samples)
    print(f"built {args.samples:,} samples in {time.perf_counter() - t0:.1f} s ({data})")
    t0 = time.perf_counter()
    s = open_shards(data, target=str(out / "target"))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    s = open_shards(data)
    second = time.perf_counter() - t0
    t0 = time.perf_counter()
    x = s[len(s) - 1]
    one = time.perf_counter() - t0
    print(f"open, first (list + stat + synthesise manifest): {first:.2f} s for {len(s):,} "
          f"samples\nopen, again (list + recorded manifest): {second:.2f} s\n"
          f"one sample read: {one * 1000:.1f} ms ({tuple(x['hidden_states'].shape)})")
    return 0


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("foreign_open.py", main))
