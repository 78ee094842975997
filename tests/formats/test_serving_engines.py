"""`serving_engines`: which engines serve a drafter as trained, from the doctor's own checks,
on drafts written by speculators itself (formats/demo.py) and their conversions; the
verdict for an unsaved drafter (`serving_engines_of_config`, train's warning) equals the
saved one's; a norm-variant finding offers SGLang 0.5.23 only for a variant it applies."""

from __future__ import annotations

import json

import pytest

from eagle3lab.formats.doctor import (SERVING_ENGINES, serving_engines,
                                      serving_engines_of_config, serving_line)


def _stops(verdicts):
    return {e: v.codes for e, v in verdicts.items()}


def test_a_plain_drafter_is_served_everywhere(fx):
    v = serving_engines(fx["spec"], target=fx["target"])
    assert list(v) == list(SERVING_ENGINES) and all(x.serves for x in v.values()), _stops(v)
    assert v["vllm"].via == "as is" and "--to sglang --engine sglang" in v["sglang"].via
    assert serving_line(v) == "served by vllm, sglang, sglang-0.5.23"


def test_the_sglang_export_serves_sglang_as_is_and_vllm_after_conversion(fx):
    """vLLM reads the flat config but not its eagle_config aux ids: judged as it would be
    after `convert --to speculators`, which moves them."""
    v = serving_engines(fx["sglang"], target=fx["target"])
    assert all(x.serves for x in v.values()), _stops(v)
    assert v["sglang"].via == "as is" and v["sglang-0.5.23"].via == "as is"
    assert "--to speculators --engine vllm" in v["vllm"].via


def test_norm_before_fc(fx, tmp_path):
    from eagle3lab.formats.demo import make_speculators_draft

    p = make_speculators_draft(tmp_path / "nbf", target=fx["target"], aux_ids=[1, 4, 6],
                               norm_before_fc=True)
    v = serving_engines(p, target=fx["target"])
    assert _stops(v) == {"vllm": [], "sglang": ["norm-before-fc"], "sglang-0.5.23": []}
    msg = v["sglang"].findings[0].message
    assert "SGLang 0.5.23, which applies it" in msg and "03d5a77" in msg
    assert serving_line(v) == ("not served by sglang (norm-before-fc: norm_before_fc); "
                               "served by vllm, sglang-0.5.23")


def test_norm_before_residual_is_served_by_no_sglang(fx, tmp_path):
    from eagle3lab.formats.demo import make_speculators_draft

    p = make_speculators_draft(tmp_path / "nbr", target=fx["target"], aux_ids=[1, 4, 6],
                               norm_before_residual=True)
    v = serving_engines(p, target=fx["target"])
    assert _stops(v) == {"vllm": [], "sglang": ["norm-variant"],
                         "sglang-0.5.23": ["norm-variant"]}
    for engine in ("sglang", "sglang-0.5.23"):
        msg = v[engine].findings[0].message
        assert "llama_eagle3.py:99-100" in msg and "0.5.23, which applies" not in msg, msg


def test_unsaved_verdict_equals_the_saved_one(fx, tmp_path):
    """What `train` judges before its first step (the model's config and tensor names) is
    what the doctor says of the saved drafter, for every flag combination speculators
    allows (norm_before_fc and fc_norm exclude each other)."""
    import itertools

    from safetensors import safe_open

    from eagle3lab.formats.demo import make_speculators_draft

    for i, (nbr, nbf, out) in enumerate(itertools.product([False, True], repeat=3)):
        p = make_speculators_draft(tmp_path / f"d{i}", target=fx["target"],
                                   aux_ids=[1, 4, 6], norm_before_fc=nbf,
                                   norm_before_residual=nbr)
        cfg = json.loads((p / "config.json").read_text())
        cfg["norm_output"] = out  # no tensor of its own: the config is the whole variant
        (p / "config.json").write_text(json.dumps(cfg))
        with safe_open(str(p / "model.safetensors"), "pt") as f:
            names = list(f.keys())
        saved = {e: x.codes for e, x in serving_engines(p, target=fx["target"]).items()}
        unsaved = {e: x.codes for e, x in serving_engines_of_config(cfg, names).items()}
        assert saved == unsaved, (nbr, nbf, out)
        assert (saved["sglang"] == []) == (not (nbr or nbf or out))
        assert (saved["sglang-0.5.23"] == []) == (not nbr)
        assert saved["vllm"] == []


@pytest.mark.parametrize("engine", ["vllm", "sglang", "sglang-0.5.23"])
def test_a_second_decoder_layer(fx, engine, tmp_path):
    """convert exports one decoder layer; vLLM loads several."""
    import shutil

    p = tmp_path / "two"
    shutil.copytree(fx["spec"], p)
    cfg = json.loads((p / "config.json").read_text())
    cfg["transformer_layer_config"]["num_hidden_layers"] = 2
    (p / "config.json").write_text(json.dumps(cfg))
    v = serving_engines(p, engines=[engine], check_values=False)[engine]
    if engine == "vllm":  # the layer-1 tensors it needs are absent, not the layer count
        assert v.codes == ["missing-keys"] and "layers.1." in v.findings[0].message
    else:
        assert "keys-layout" in v.codes and not v.serves
