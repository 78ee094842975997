"""The embedded default target: converted once, verified (the difference compared is the one
recorded), idempotent (a second run converts nothing)."""

import json

import pytest

from eagle3lab.fsutil import sha256_file
from eagle3lab.targets.default import STAMP_NAME, find_gguf, prepare_target


@pytest.mark.real
def test_prepared_target_is_verified_and_idempotent(default_target_dir, monkeypatch):
    import transformers

    stamp = json.loads((default_target_dir / STAMP_NAME).read_text())
    gguf = find_gguf()
    assert stamp["source"]["sha256"] == sha256_file(gguf)
    assert stamp["verified"]["max_abs_diff"] == 0.0 and stamp["verified"]["logits_equal"] is True
    cfg = json.loads((default_target_dir / "config.json").read_text())
    assert "quantization_config" not in cfg
    assert cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576
    weights = default_target_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    loads = []  # a second run must not convert again: no model is loaded at all
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: loads.append(a) or pytest.fail("converts again"))
    assert prepare_target(verbose=False) == default_target_dir
    assert loads == [] and weights.stat().st_mtime_ns == before


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.full
def test_fresh_conversion_matches_gguf(tmp_path):
    """A full conversion into a new directory (GGUF load, save, reload, logits compared)."""
    dest = tmp_path / "smollm2"
    prepare_target(dest=dest, verbose=False)
    stamp = json.loads((dest / STAMP_NAME).read_text())
    assert stamp["verified"]["max_abs_diff"] == 0.0 and stamp["verified"]["logits_equal"] is True
    assert not list(tmp_path.glob(".*.tmp")), "no temporary directory is left behind"


@pytest.mark.parametrize("shift", [0.0, 1e-6])
def test_the_stamp_records_the_difference_it_compared(tmp_path, tiny_target_dir, monkeypatch,
                                                      shift):
    """prepare_target on a stand-in GGUF (transformers' loaders answer with the tiny target;
    nothing real is converted): a faithful copy is stamped with the difference compared
    (0.0) and `logits_equal` derived from it; a copy whose logits differ at all, even by
    rounding (`shift` added to one final-norm weight of the reloaded copy), is refused naming
    the difference, and nothing is written."""
    import torch
    import transformers

    auto, tok = transformers.AutoModelForCausalLM, transformers.AutoTokenizer

    class StandInModel:
        @staticmethod
        def from_pretrained(path, gguf_file=None, **kw):
            if gguf_file:  # "the GGUF"
                return auto.from_pretrained(str(tiny_target_dir), **kw)
            model = auto.from_pretrained(path, **kw)  # the copy just written, reloaded
            with torch.no_grad():
                model.model.norm.weight[0] += shift
            return model

    class StandInTokenizer:
        @staticmethod
        def from_pretrained(path, gguf_file=None, **kw):
            return tok.from_pretrained(str(tiny_target_dir), **kw)

    monkeypatch.setattr(transformers, "AutoModelForCausalLM", StandInModel)
    monkeypatch.setattr(transformers, "AutoTokenizer", StandInTokenizer)
    gguf = tmp_path / "stand-in.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    dest = tmp_path / "converted"
    if shift == 0.0:
        # the module's own function: the `real` guard (tests/markers.py) stands in for it
        # in tests that are not marked `real`; this one converts the stand-in only
        prepare_target(dest=dest, gguf=gguf, verbose=False)
        verified = json.loads((dest / STAMP_NAME).read_text())["verified"]
        assert verified["max_abs_diff"] == 0.0 and verified["logits_equal"] is True
        return
    with pytest.raises(RuntimeError, match=r"does not reproduce the GGUF's logits \(max abs "
                                           r"diff [1-9][0-9.e-]*\)") as e:
        prepare_target(dest=dest, gguf=gguf, verbose=False)
    assert "nothing was written" in str(e.value) and not dest.exists()
