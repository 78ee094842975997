"""The embedded default target: converted once, verified, idempotent."""

import json
import time

import pytest

from eagle3lab.target.default import STAMP_NAME, find_gguf, prepare_target
from eagle3lab.fsutil import sha256_file


@pytest.mark.real
def test_prepared_target_is_verified_and_idempotent(default_target_dir):
    stamp = json.loads((default_target_dir / STAMP_NAME).read_text())
    gguf = find_gguf()
    assert stamp["source"]["sha256"] == sha256_file(gguf)
    assert stamp["verified"]["logits_equal"] is True and stamp["verified"]["max_abs_diff"] == 0
    cfg = json.loads((default_target_dir / "config.json").read_text())
    assert "quantization_config" not in cfg
    assert cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576
    weights = default_target_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    t0 = time.time()
    assert prepare_target(verbose=False) == default_target_dir
    assert time.time() - t0 < 5, "a second run must not convert again"
    assert weights.stat().st_mtime_ns == before


@pytest.mark.real
@pytest.mark.slow
def test_fresh_conversion_matches_gguf(tmp_path):
    """A full conversion into a new directory (GGUF load, save, reload, logits compared)."""
    dest = tmp_path / "smollm2"
    prepare_target(dest=dest, verbose=False)
    stamp = json.loads((dest / STAMP_NAME).read_text())
    assert stamp["verified"]["logits_equal"] is True
    assert not list(tmp_path.glob(".*.tmp")), "no temporary directory is left behind"
