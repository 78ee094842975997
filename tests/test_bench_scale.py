"""bench/scale.py --tiny on the CPU (gloo, 2 ranks forked from the script's process): the
code path of the 2-GPU benchmark, every part: every row measured, the shard sets of 2 ranks
and of a device-mapped target equal to the one-process set, all-reduce times, data workers
0 vs 2, extraction batched two ways; results in scale.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "scale.py"


@pytest.mark.slow
@pytest.mark.full
def test_tiny_runs_on_cpu(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--work", str(tmp_path),
                        "--parts", "train,extract,link,loader,batching"],
                       capture_output=True, text=True, timeout=1200,
                       env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert "$ torchrun --nproc-per-node 2 -m eagle3lab extract " in r.stdout
    assert "(--tiny: 2 forked rank(s))" in r.stdout  # ranks forked, not new interpreters
    res = json.loads((tmp_path / "scale.json").read_text())
    ex = res["extract"]
    for key in ("2", "device_map"):
        assert ex[key]["vs_1"]["same_ids_and_masks"] is True
        assert ex[key]["vs_1"]["within_bf16_tolerance"] is True
        assert ex[key]["tokens"] == ex["1"]["tokens"] > 0
    assert ex["ratio"] == pytest.approx(ex["2"]["tokens_per_s"] / ex["1"]["tokens_per_s"])
    assert not list(tmp_path.glob("extract-out-*"))  # shards removed unless --keep
    tr = res["train"]
    if "skipped" in tr:  # no distributed training in this checkout: said, not faked
        assert "no --fsdp" in r.stdout
    else:
        for name in ("default", "8b"):
            assert tr[name]["ratio"] > 0 and tr[name]["2"]["tokens_per_s"] > 0
        assert len(tr["memory"]["ddp"]) == len(tr["memory"]["fsdp2"]) == 2
    link = res["link"]  # all-reduce of 1 and 4 MB, sent as fp32 and as bf16
    assert len(link) == 4 and all(sec > 0 for sec in link.values())
    for name in ("default", "8b"):  # one process, --data-workers 0 vs 2
        lo = res["loader"][name]
        assert lo["0"]["tokens_per_s"] > 0 and lo["2"]["tokens_per_s"] > 0
        assert lo["ratio"] == pytest.approx(lo["2"]["tokens_per_s"] / lo["0"]["tokens_per_s"])
    bf = res["batching"]["bfloat16"]  # the same conversations batched two ways
    assert bf["same_ids_and_masks"] is True and bf["compared"] > 0 and bf["max_rel_diff"] >= 0
    assert not [p for p in tmp_path.glob("extract-batching-*") if p.is_dir()]  # removed
