"""bench/train.py --draft-attn with several kernels on the CPU (random shards of a tiny
target): each kernel that can train here is timed through the loop on the same shards with
its ratio to the first; the drafter step alone is timed per kernel (forward + backward, and
forward only), flex's forward included; flex's training, which torch 2.13 cannot run on the
CPU, is reported with torch's reason; "auto" runs as what it resolves to. Results in --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "train.py"


@pytest.mark.full
@pytest.mark.slow
def test_kernels_side_by_side_on_cpu(tmp_path):
    from eagle3lab.train.model import flex_backward_problem

    out = tmp_path / "train.json"
    r = subprocess.run(
        [sys.executable, "-P", str(SCRIPT), "--hidden", "64", "--layers", "8", "--heads", "4",
         "--kv-heads", "2", "--intermediate", "128", "--vocab", "512", "--draft-vocab", "64",
         "--samples", "8", "--seq", "300", "--max-tokens", "512", "--steps", "2",
         "--warmup", "1", "--step-reps", "1", "--doc-len", "100", "--skip-speculators",
         "--draft-attn", "sdpa,simple_flex_attention,eager,auto", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    res = json.loads(out.read_text())
    loop, step = res["loop"], res["step"]["rows"]
    assert loop["sdpa"]["kernel"] == "sdpa" and loop["auto"]["kernel"] == "sdpa"
    assert loop["eager"]["ratio_to_first"] == pytest.approx(
        loop["eager"]["tokens_per_s"] / loop["sdpa"]["tokens_per_s"])
    for name in ("sdpa", "eager", "auto"):
        assert loop[name]["tokens_per_s"] > 0
        assert step[name]["train_ms"] > 0 and step[name]["forward_ms"] > 0
    flex = step["simple_flex_attention"]
    assert flex["forward_ms"] > 0  # its forward runs on the CPU (eager, unfused)
    assert flex["forward_speedup_vs_first"] == pytest.approx(
        step["sdpa"]["forward_ms"] / flex["forward_ms"])
    if flex_backward_problem("cpu"):
        assert "backward" in loop["simple_flex_attention"]["problem"]
        assert flex["train_ms"] is None and "backward" in flex["train_problem"]
    assert "ratio eager / sdpa (loop tokens/s)" in r.stdout
    assert "drafter step alone: 512 packed tokens in documents of 100" in r.stdout
