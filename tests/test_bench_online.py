"""bench/online.py --tiny on the CPU (a tiny random target, random conversations): every row
is measured (extraction, vocab, offline training, online training with and without the
states cache), the three runs process the same tokens, the ratios are the rows' and the
bytes written are the shards' (offline) and the vocab map's (online); results in
online.json, the shards and runs removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "online.py"


@pytest.mark.full
@pytest.mark.slow
def test_tiny_runs_on_cpu(tmp_path):
    r = subprocess.run([sys.executable, "-P", str(SCRIPT), "--tiny", "--work", str(tmp_path)],
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    res = json.loads((tmp_path / "online.json").read_text())
    off, on, cached = res["offline"], res["online"], res["online_cache"]
    assert off["tokens"] == on["tokens"] == cached["tokens"] > res["extract"]["tokens"] > 0
    for row in (off, on, cached):
        assert row["steady_tokens_per_s"] > 0 and row["epoch2_tokens_per_s"] > 0
    ratios = res["ratios"]
    assert ratios["online_vs_offline_train"] == pytest.approx(
        on["steady_tokens_per_s"] / off["steady_tokens_per_s"])
    e2e = res["extract"]["seconds"] + res["vocab"]["seconds"] + off["seconds"]
    assert ratios["online_vs_extract_plus_offline"] == pytest.approx(e2e / on["seconds"])
    assert res["end_to_end"]["offline_seconds"] == pytest.approx(e2e)
    # the shards' bytes (bf16 states of 3 + 1 layers of hidden 64, ids, mask) vs a vocab map
    assert res["bytes_written"]["offline"] >= res["extract"]["tokens"] * (4 * 64 * 2 + 5)
    assert 0 < res["bytes_written"]["online"] < res["bytes_written"]["offline"] / 10
    assert "ratio end to end: (extract+vocab+offline) s / online s" in r.stdout
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(("shards", "run-"))]


@pytest.mark.full
@pytest.mark.slow
def test_tiny_draft_attn_side_by_side(tmp_path):
    """--draft-attn with several kernels: each that can train here trains offline and online
    on the same tokens, its steady tokens/s beside the first's with their ratio, the kernel
    used read from its run.json ("auto" resolved); one that cannot train here (flex on the
    CPU: no backward) is listed with torch's reason, the others still measured."""
    from eagle3lab.train.model import flex_backward_problem

    r = subprocess.run([sys.executable, "-P", str(SCRIPT), "--tiny", "--work", str(tmp_path),
                        "--draft-attn", "sdpa,simple_flex_attention,eager,auto"],
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    res = json.loads((tmp_path / "online.json").read_text())
    attn = res["draft_attn"]
    assert attn["first"] == "sdpa"
    kernels = attn["kernels"]
    assert kernels["sdpa"]["offline"] == res["offline"]  # the first kernel's rows are the table's
    for name, used in (("sdpa", "sdpa"), ("eager", "eager"), ("auto", "sdpa")):
        for kind in ("offline", "online"):
            row = kernels[name][kind]
            assert row["draft_attn"] == used and row["tokens"] == res["offline"]["tokens"]
            assert row["steady_tokens_per_s"] > 0
            if name != "sdpa":
                assert attn["ratios_to_first"][name][kind] == pytest.approx(
                    row["steady_tokens_per_s"] / kernels["sdpa"][kind]["steady_tokens_per_s"])
    problem = flex_backward_problem("cpu")
    if problem:
        assert "backward" in kernels["simple_flex_attention"]["problem"]
        assert "simple_flex_attention" not in attn["ratios_to_first"]
    assert "draft attention, side by side (steady tok/s)" in r.stdout
    assert "ratio eager / sdpa" in r.stdout
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(("shards", "run-"))]
