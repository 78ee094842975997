"""bench/regen_static.py at tiny sizes on the CPU (the code path of the H200 run): both
engines answer the same prompts (copies included) in one run, in fp32 identically, and the
tokens/s of each and their ratio come back as one JSON object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "regen_static.py"


@pytest.mark.slow
@pytest.mark.full
def test_tiny_side_by_side(tiny_target_dir, tmp_path):
    r = subprocess.run([sys.executable, "-P", str(SCRIPT), "--target", str(tiny_target_dir),
                        "--limit", "3", "--copies", "2", "--max-new-tokens", "6",
                        "--batch-size", "4", "--work", str(tmp_path)],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["prompts"] == 6 and out["identical_records"] == "6/6"
    for engine in ("hf", "static"):
        e = out["engines"][engine]
        assert e["records"] == 6 and 6 <= e["new_tokens"] <= 36 and e["tokens_per_s"] > 0
    assert out["static_over_hf"] > 0
    ids = [json.loads(line)["id"] for line in (tmp_path / "static.jsonl").open()]
    base = [i.removesuffix("~0") for i in ids[:3]]
    assert ids == [f"{p}~{k}" for k in (0, 1) for p in base]


def test_bad_copies_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-P", str(SCRIPT), "--copies", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "bench/regen_static.py: error: --copies must be at least 1, got 0."]
