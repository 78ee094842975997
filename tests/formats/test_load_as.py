"""Serving-path emulation: the state each engine ends up with, including its silent drops."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from eagle3lab.formats.load_as import EngineRefusal, build_model, load_as


def test_sglang_loads_its_export_and_swaps_in_the_target_embedding(fx):
    es = load_as(fx["sglang"], "sglang", target=fx["target"])
    saved = load_file(str(fx["sglang"] / "model.safetensors"))
    assert es.fresh == [] and es.dropped == []
    assert torch.equal(es.state["layers.0.self_attn.q_proj.weight"],
                       saved["midlayer.self_attn.q_proj.weight"])
    assert es.sources["embed_tokens.weight"] == "target"
    target_embed = load_file(str(fx["target"] / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(es.state["embed_tokens.weight"], target_embed)
    assert torch.equal(es.hot_token_ids, saved["d2t"] + torch.arange(128))
    assert es.capture_points == [1, 4, 6]  # eagle_config ids [0, 3, 5] + 1


def test_layers0_keys_are_dropped_by_portable_sglang_but_loaded_by_0_5_23(plant):
    p = plant.copy()
    plant.state(p, lambda s: s.update({k.replace("midlayer.", "layers.0."): s.pop(k)
                                       for k in [k for k in s if k.startswith("midlayer.")]}))
    old = load_as(p, "sglang")
    assert len(old.dropped) == 10 and all(k.startswith("layers.0.") for k in old.dropped)
    assert "layers.0.self_attn.q_proj.weight" in old.fresh
    assert torch.equal(old.state["layers.0.input_layernorm.weight"], torch.ones(64))
    new = load_as(p, "sglang-0.5.23")
    assert new.fresh == [] and new.dropped == []


def test_vllm_refuses_unknown_keys(plant):
    p = plant.state(plant.copy(), lambda s: s.update({"extra.weight": torch.ones(2)}))
    with pytest.raises(EngineRefusal, match="There is no module or parameter"):
        load_as(p, "vllm")
    assert load_as(p, "sglang").dropped == ["extra.weight"]


def test_sglang_cannot_load_a_speculators_config(fx):
    with pytest.raises(EngineRefusal, match="architectures"):
        load_as(fx["spec"], "sglang")


def test_input_norm_dropped_unless_the_engine_applies_it(plant):
    p = plant.state(plant.copy(), lambda s: s.update({"input_norm.weight": 2 * torch.ones(192)}))
    plant.config(p, lambda c: c["eagle_config"].update(norm_before_fc=True))
    assert "input_norm.weight" not in load_as(p, "sglang").state
    es = load_as(p, "sglang-0.5.23")
    assert es.applies["norm_before_fc"] and torch.equal(es.state["input_norm.weight"],
                                                         2 * torch.ones(192))


def test_own_embedding_kept_when_hidden_sizes_differ(plant, fx):
    p = plant.config(plant.copy(), lambda c: c.update(target_hidden_size=96))
    with pytest.raises(EngineRefusal, match=r"fc.weight as \[64, 288\]"):
        load_as(p, "sglang")  # SGLang builds fc from target_hidden_size
    plant.state(p, lambda s: s.update({"fc.weight": torch.ones(64, 288)}))
    es = load_as(p, "sglang", target=fx["target"])
    assert es.sources["embed_tokens.weight"].startswith("checkpoint:")


def test_vllm_keeps_own_embedding_and_shares_the_target_one_when_absent(plant, fx):
    assert load_as(fx["spec"], "vllm", target=fx["target"]).sources[
        "embed_tokens.weight"] == "checkpoint:embed_tokens.weight"
    p = plant.state(plant.copy("spec"), lambda s: s.pop("embed_tokens.weight"))
    assert load_as(p, "vllm", target=fx["target"]).sources["embed_tokens.weight"] == "target"


def test_shape_mismatch_is_a_refusal(plant):
    p = plant.state(plant.copy(), lambda s: s.update({"norm.weight": torch.ones(65)}))
    with pytest.raises(EngineRefusal, match="norm.weight"):
        load_as(p, "sglang")


def test_build_model_runs_what_each_engine_serves(fx, plant):
    """Same drafter, two engines: identical when both load it; different when SGLang drops
    the decoder layer."""
    h = torch.randn(1, 6, 192, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(1))
    docs = torch.zeros(1, 6, dtype=torch.long)
    with torch.no_grad():
        a = build_model(load_as(fx["sglang"], "sglang", target=fx["target"]))(
            h, ids, docs, ttt_steps=2)
        b = build_model(load_as(fx["spec"], "vllm", target=fx["target"]))(
            h, ids, docs, ttt_steps=2)
        p = plant.copy()
        plant.state(p, lambda s: s.update({k.replace("midlayer.", "layers.0."): s.pop(k)
                                           for k in [k for k in s if k.startswith("midlayer.")]}))
        c = build_model(load_as(p, "sglang", target=fx["target"]))(h, ids, docs, ttt_steps=2)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))
