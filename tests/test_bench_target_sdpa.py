"""bench/target_sdpa.py on the CPU, a tiny target: every micro-batch goes through the
target once per setting, the settings are timed over the same micro-batches and tokens,
the ratios are the settings' means, and on the CPU (where `features` leaves the kernel to
torch either way) the two settings' states are equal, and as far from the fp32 reference
as their bf16 storage (the tiny target runs in fp32). With --compiled (dynamo's capture
with the eager backend here) a third setting whose states are the same as the eager
forward's: the capture hooks work inside the compiled model, once compiled."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3lab.workdir import WorkDir

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "target_sdpa.py"


def _run(tmp_path, sharp_data, sharp_target_dir, *extra):
    convs = WorkDir(Path(sharp_data["train"]).parent.parent).responses("train")
    cfg = tmp_path / "train.json"
    cfg.write_text(json.dumps({"online": True, "conversations": str(convs),
                               "target": str(sharp_target_dir), "out": str(tmp_path / "run"),
                               "draft_vocab_size": 64, "max_tokens_per_batch": 256,
                               "cpu_threads": 1, "progress": False}))
    r = subprocess.run([sys.executable, "-P", str(SCRIPT), "--config", str(cfg), "--steps", "3",
                        "--warmup", "1", "--out", str(tmp_path / "res.json"), *extra],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r, json.loads((tmp_path / "res.json").read_text())


def test_every_setting_timed_on_the_same_micro_batches(tmp_path, sharp_data, sharp_target_dir):
    r, res = _run(tmp_path, sharp_data, sharp_target_dir, "--fp32-reference", "--compiled",
                  "--compile-backend", "eager")
    assert res["device"] == "cpu" and res["micro_batches"] == 3 and res["tokens"] > 0
    t, e, c = (res["settings"][k] for k in ("torch", "eagle3lab", "compiled"))
    assert t["backends"] is None
    assert e["backends"] == ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"] == c["backends"]
    assert c["compiled"] is True and e["compiled"] is False is t["compiled"]
    assert all(s["host_ms"] > 0 and s["wall_ms"] >= s["host_ms"] for s in (t, e, c))
    assert res["ratios"]["host"] == pytest.approx(t["host_ms"] / e["host_ms"])
    assert c["vs_eagle3lab"]["host"] == pytest.approx(c["host_ms"] / e["host_ms"])
    assert res["max_abs_state_diff"] == 0.0 == res["relative_l1_state_diff"]
    assert res["max_abs_state"] > 0
    # the compiled forward (dynamo's capture, eager kernels) captures the same states
    assert c["vs_eagle3lab"]["max_abs_state_diff"] == 0.0
    assert c["vs_eagle3lab"]["relative_l1_state_diff"] == 0.0
    assert res["compiled"]["backend"] == "eager" and res["compiled"]["graphs"] >= 1
    # an fp32 target here: its fp32 reference is the same forwards, so each setting is as
    # far from it as rounding to the states' dtype (bf16) takes them, and no further
    floor = res["storage_relative_l1_to_fp32"]
    assert 0 < floor < 0.01
    for s in (t, e, c):
        assert s["relative_l1_to_fp32"] == pytest.approx(floor)
    assert "relative L1 from fp32" in r.stdout
    assert "torch / eagle3lab: host x" in r.stdout
    assert "compiled / eagle3lab: host x" in r.stdout
