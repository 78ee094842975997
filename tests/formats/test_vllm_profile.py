"""The doctor's `vllm` profile = vLLM 0.25.1 as read in its source: the speculators adapter's
flattening (an absent norm_before_residual is True), the norm variants it applies, the V1
model runner's eagle_config fallback, the training record read from eagle3lab.json, and
`load_as` serving a drafter without d2t as vLLM does (draft id i = target id i)."""

from __future__ import annotations

import json

import torch

from eagle3lab.formats.detect import parse_draft_config, read_sidecar
from eagle3lab.formats.doctor import inspect_checkpoint
from eagle3lab.formats.load_as import load_as
from eagle3lab.formats.profiles import get_profile
from eagle3lab.formats.schema import applies, num_aux, vllm_view


def by_code(report, code):
    return [f for f in report.findings if f.code == code]


def test_the_speculators_adapter_view():
    raw = {"speculators_model_type": "eagle3", "draft_vocab_size": 128,
           "transformer_layer_config": {"model_type": "llama", "hidden_size": 64},
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
           "num_aux_hidden_states": 4, "eagle_aux_hidden_state_layer_ids": []}
    cfg = parse_draft_config(raw)
    view = vllm_view(cfg)
    assert view["norm_before_residual"] is True and view["norm_before_fc"] is False
    assert "eagle_config" not in view and "num_aux_hidden_states" not in view
    assert "eagle_aux_hidden_state_layer_ids" not in view  # copied only when truthy
    vllm = get_profile("vllm")
    assert applies(vllm, cfg, "norm_before_residual")
    assert not applies(get_profile("speculators"), cfg, "norm_before_residual")
    assert num_aux(cfg, vllm) == 3  # neither the top-level count nor eagle_config reach it
    flat = parse_draft_config({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64,
                               "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]}})
    assert num_aux(flat, vllm) == 2 and not applies(vllm, flat, "norm_before_residual")


def test_fc_norm_and_norm_output_are_applied_not_unverified(plant):
    p = plant.copy("spec")
    plant.config(p, lambda c: c.update(fc_norm=True, norm_output=True))
    plant.state(p, lambda s: s.update({f"fc_norm.{k}.weight": torch.ones(64)
                                       for k in range(3)}))
    r = inspect_checkpoint(p, engine="vllm")
    assert not by_code(r, "norm-before-fc") and not by_code(r, "norm-variant"), r.table()
    off = plant.config(plant.copy("spec"), lambda c: c.update(fc_norm=False))
    plant.state(off, lambda s: s.update({"fc_norm.0.weight": torch.ones(64)}))
    [f] = by_code(inspect_checkpoint(off, engine="vllm"), "norm-before-fc")
    assert f.severity == "error" and "There is no module or parameter" in f.message


def test_training_record_from_eagle3lab_json(plant, fx):
    """Without the config's own record, the trainer's eagle3lab.json says what the shards
    were captured at: ids copied in SGLang's convention are then an error for vLLM."""
    p = plant.config(plant.copy("spec"), lambda c: (
        c.pop("eagle3lab"), c.update(eagle_aux_hidden_state_layer_ids=[0, 3, 5])))
    bare = inspect_checkpoint(p, target=fx["target"], engine="vllm", check_values=False)
    assert not [f for f in by_code(bare, "aux-layers") if f.severity == "error"]
    (p / "eagle3lab.json").write_text(json.dumps({
        "data": {"train": {"aux_layers": {"capture_points": [1, 4, 6], "num_layers": 8}}},
        "drafter": {"engine_profile": {"norm_before_residual": False}}}))
    assert read_sidecar(p)["aux_layers"]["capture_points"] == [1, 4, 6]
    [f] = by_code(inspect_checkpoint(p, target=fx["target"], engine="vllm",
                                     check_values=False), "aux-layers")
    assert f.severity == "error" and f.expected == [1, 4, 6] and f.found == [0, 3, 5]
    assert "eagle3lab.json" in f.message


def test_v1_runner_reads_eagle_configs_ids(fx):
    v2 = inspect_checkpoint(fx["sglang"], target=fx["target"], engine="vllm")
    v1 = inspect_checkpoint(fx["sglang"], target=fx["target"], engine="vllm",
                            vllm_runner="v1")
    assert v2.config["aux"]["engine_default"] and not v1.config["aux"]["engine_default"]
    assert v1.config["aux"]["engine_capture_points"] == [0, 3, 5]  # [0, 3, 5] unshifted
    assert any(f.severity == "error" for f in by_code(v1, "aux-layers"))


def test_load_as_vllm_without_d2t_maps_draft_ids_to_the_first_target_ids(plant, fx):
    p = plant.state(plant.copy("spec"), lambda s: s.pop("d2t"))
    es = load_as(p, "vllm", target=fx["target"])
    assert torch.equal(es.hot_token_ids, torch.arange(128))
    assert any("draft_id_to_target_id at zeros" in n for n in es.notes)
    assert es.applies["norm_before_residual"] is False  # stated False in the config
