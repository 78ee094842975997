"""The checkpoint doctor: good checkpoints of both formats pass; one planted fault per code
is caught with that code."""

from __future__ import annotations

import json

import pytest
import torch

from eagle3lab.formats import CODES, inspect_checkpoint
from planted import planted_problems, plants


def codes(report, severity="error"):
    return {f.code for f in report.findings if f.severity == severity}


# -- good checkpoints ----------------------------------------------------------------------
@pytest.mark.parametrize("kind,engine", [("spec", "vllm"), ("spec", "speculators"),
                                         ("sglang", "sglang"), ("sglang", "sglang-0.5.23")])
def test_good_checkpoints_pass(fx, kind, engine):
    r = inspect_checkpoint(fx[kind], target=fx["target"], engine=engine)
    assert r.ok, r.table()
    assert codes(r, "warning") <= {"dtype"}, r.table()


def test_sglang_export_on_vllm_loses_its_aux_ids(fx):
    """vLLM loads midlayer.* fine but reads aux ids from the top level only."""
    r = inspect_checkpoint(fx["sglang"], target=fx["target"], engine="vllm")
    assert codes(r) == {"aux-layers"}, r.table()


def test_default_engine_and_format(fx):
    assert inspect_checkpoint(fx["spec"]).engine == "vllm"
    r = inspect_checkpoint(fx["sglang"])
    assert (r.format, r.engine, r.key_layout) == ("eagle3", "sglang", "midlayer")
    assert inspect_checkpoint(fx["spec"]).format == "speculators"


def test_without_target_the_target_checks_say_skipped(fx):
    r = inspect_checkpoint(fx["sglang"])
    assert r.ok
    assert any("no --target" in s["reason"] for s in r.skipped)
    assert "skipped" in r.table()


def test_report_json_shape(fx):
    d = json.loads(inspect_checkpoint(fx["spec"], engine="sglang", target=fx["target"]).to_json())
    assert {"format", "engine", "ok", "findings", "tensors"} <= set(d)
    assert d["ok"] is False
    for f in d["findings"]:
        assert {"code", "severity", "message"} <= set(f) and f["code"] in CODES
    assert {"name", "shape", "dtype"} <= set(d["tensors"][0])


def test_hand_built_official_eagle_bin_checkpoint(fx, tmp_path):
    """An official-EAGLE-style release: pytorch_model.bin, no eagle_config ids."""
    from safetensors.torch import load_file

    d = tmp_path / "official"
    d.mkdir()
    torch.save(load_file(str(fx["sglang"] / "model.safetensors")), d / "pytorch_model.bin")
    cfg = json.loads((fx["sglang"] / "config.json").read_text())
    cfg.pop("eagle_config"), cfg.pop("eagle3lab")
    (d / "config.json").write_text(json.dumps(cfg))
    r = inspect_checkpoint(d, target=fx["target"])
    assert r.ok, r.table()
    assert "aux-layers" in codes(r, "warning")  # defaults, nothing records training's


# -- one planted fault per code ------------------------------------------------------------
@plants("unreadable")
def test_unreadable_truncated_safetensors(plant):
    p = plant.copy()
    f = p / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    r = inspect_checkpoint(p)
    assert "unreadable" in codes(r)
    assert any("model.safetensors" in f.message and "truncated" in f.message
               for f in r.findings)


@plants("unreadable")
def test_unreadable_bad_header_and_bad_json(plant):
    p = plant.copy()
    (p / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    (p / "config.json").write_text("{broken")
    r = inspect_checkpoint(p)
    msgs = [f.message for f in r.findings if f.code == "unreadable"]
    assert any(m.startswith("config.json") for m in msgs)
    assert any(m.startswith("model.safetensors") for m in msgs)


class NotATensor:  # pickled by reference: weights_only loading refuses it
    pass


@plants("unreadable")
def test_unreadable_pickle_is_not_executed(plant):
    p = plant.copy()
    (p / "model.safetensors").unlink()
    torch.save({"fc.weight": torch.ones(2), "evil": NotATensor()}, p / "pytorch_model.bin")
    r = inspect_checkpoint(p)
    f = next(f for f in r.findings if f.code == "unreadable")
    assert "pytorch_model.bin" in f.message and "unpickle" in f.message


@plants("format-unknown")
def test_format_unknown_for_a_full_model(fx):
    r = inspect_checkpoint(fx["target"])
    assert r.format == "unknown" and "format-unknown" in codes(r)


@plants("keys-layout")
def test_keys_layout_layers0_for_sglang(plant):
    p = plant.copy()
    plant.state(p, lambda s: s.update({k.replace("midlayer.", "layers.0."): s.pop(k)
                                       for k in [k for k in s if k.startswith("midlayer.")]}))
    r = inspect_checkpoint(p, engine="sglang")
    assert "keys-layout" in codes(r)
    assert "missing-keys" not in codes(r)  # reported once, as a layout problem
    assert inspect_checkpoint(p, engine="sglang-0.5.23").ok  # that release renames both


@plants("keys-layout")
def test_keys_layout_midlayer_for_speculators(plant):
    p = plant.copy("spec")
    plant.state(p, lambda s: s.update({k.replace("layers.0.", "midlayer."): s.pop(k)
                                       for k in [k for k in s if k.startswith("layers.0.")]}))
    assert "keys-layout" in codes(inspect_checkpoint(p, engine="speculators"))


@plants("unknown-keys")
def test_unknown_keys(plant):
    p = plant.copy()
    plant.state(p, lambda s: s.update({"extra_proj.weight": torch.ones(4, 4),
                                       "midlayer.self_attn.q_proj.bias": torch.ones(64)}))
    for engine in ("sglang", "vllm"):
        r = inspect_checkpoint(p, engine=engine)
        f = next(f for f in r.findings if f.code == "unknown-keys")
        assert "extra_proj.weight" in f.found
    vllm = [f for f in inspect_checkpoint(p, engine="vllm").findings
            if f.code == "unknown-keys"]
    assert vllm[0].severity == "error" and vllm[0].found == ["extra_proj.weight"]
    assert "There is no module or parameter named" in vllm[0].message
    # vLLM 0.25.1 ignores an unexpected .bias (AutoWeightsLoader): dropped, not refused
    assert vllm[1].severity == "warning" and vllm[1].found == ["midlayer.self_attn.q_proj.bias"]
    sgl = next(f for f in inspect_checkpoint(p, engine="sglang").findings
               if f.code == "unknown-keys")
    assert "midlayer.self_attn.q_proj.bias" in sgl.found  # SGLang builds qkv without bias


@pytest.mark.parametrize("key", ["norm.weight", "midlayer.self_attn.q_proj.weight", "d2t",
                                 "lm_head.weight"])
@plants("missing-keys")
def test_missing_keys(plant, key):
    p = plant.copy()
    plant.state(p, lambda s: s.pop(key))
    r = inspect_checkpoint(p)
    f = next(f for f in r.findings if f.code == "missing-keys")
    assert key.replace("midlayer.", "layers.0.") in f.expected


@plants("shape")
def test_shape_heads(plant):
    p = plant.copy()
    plant.config(p, lambda c: c.update(num_key_value_heads=4))
    r = inspect_checkpoint(p)
    bad = {f.tensor for f in r.findings if f.code == "shape"}
    assert bad == {"midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight"}


@plants("shape")
def test_shape_lm_head(plant):
    p = plant.copy()
    plant.state(p, lambda s: s.update({"lm_head.weight": s["lm_head.weight"][:100]}))
    r = inspect_checkpoint(p)
    f = next(f for f in r.findings if f.code == "shape")
    assert f.tensor == "lm_head.weight" and f.expected == [128, 64] and f.found == [100, 64]


@plants("fc-dim")
def test_fc_dim_single_layer_features(plant, fx):
    p = plant.copy()
    plant.state(p, lambda s: s.update({"fc.weight": s["fc.weight"][:, :64].contiguous()}))
    r = inspect_checkpoint(p, target=fx["target"])
    f = next(f for f in r.findings if f.code == "fc-dim")
    assert (f.expected, f.found) == (192, 64) and "single-layer" in f.message


@plants("hidden-size")
def test_hidden_size_mismatch(plant, fx, tmp_path):
    from eagle3lab.formats.demo import make_tiny_target

    wide = make_tiny_target(tmp_path / "wide-target", hidden=96, weights=False)
    p = plant.copy()
    assert "hidden-size" in codes(inspect_checkpoint(p, target=wide))
    plant.config(p, lambda c: c.pop("target_hidden_size"))
    f = next(f for f in inspect_checkpoint(p, target=wide).findings if f.code == "hidden-size")
    assert (f.expected, f.found) == (96, 64)


@plants("hidden-size")
def test_hidden_size_null_for_sglang(plant):
    p = plant.copy()
    plant.config(p, lambda c: c.update(target_hidden_size=None))
    assert "hidden-size" in codes(inspect_checkpoint(p))


def _perm_d2t(s):
    ids = s["d2t"] + torch.arange(128)
    s["d2t"] = ids.flip(0) - torch.arange(128)


def _move_one_t2d(s):
    t2d = s["t2d"].clone()
    on, off = torch.nonzero(t2d)[0], torch.nonzero(~t2d)[0]
    t2d[on], t2d[off] = False, True
    s["t2d"] = t2d


@pytest.mark.parametrize("fault,text", [
    (lambda s: s.update(d2t=s["d2t"] + torch.arange(128)), "OFFSETS"),  # absolute ids
    (_perm_d2t, "strictly increasing"),
    (lambda s: s.update(t2d=torch.ones(256, dtype=torch.bool)), "marks 256"),
    (lambda s: s.update(d2t=s["d2t"][:100].contiguous()), "draft_vocab_size"),
    (_move_one_t2d, "disagree"),
    (lambda s: s.update(t2d=s["t2d"][:200].contiguous()), "target vocabulary"),
])
@plants("vocab-map")
def test_vocab_map(plant, fx, fault, text):
    p = plant.copy()
    plant.state(p, fault)
    r = inspect_checkpoint(p, target=fx["target"])
    assert any(f.code == "vocab-map" and text in f.message for f in r.findings), r.table()


@plants("aux-layers")
def test_aux_layers_top_level_ids_ignored_by_sglang(plant, fx):
    p = plant.copy()
    plant.config(p, lambda c: c.update(eagle_aux_hidden_state_layer_ids=c.pop(
        "eagle_config")["eagle_aux_hidden_state_layer_ids"]))
    r = inspect_checkpoint(p, target=fx["target"])
    f = next(f for f in r.findings if f.code == "aux-layers")
    assert f.severity == "error" and f.expected == [1, 4, 6] and f.found == [2, 4, 5]
    assert inspect_checkpoint(p, target=fx["target"], engine="speculators").engine


@plants("aux-layers")
def test_aux_layers_speculators_ids_read_by_sglang_are_defaults(fx):
    r = inspect_checkpoint(fx["spec"], target=fx["target"], engine="sglang")
    assert "aux-layers" in codes(r)


@plants("aux-layers")
def test_aux_layers_warning_when_defaults_happen_to_match(plant, fx):
    p = plant.copy()

    def to_defaults(c):
        c["eagle_config"].pop("eagle_aux_hidden_state_layer_ids")
        c["eagle_aux_hidden_state_layer_ids"] = [2, 4, 5]
        c["eagle3lab"]["aux_layers"]["capture_points"] = [2, 4, 5]
    plant.config(p, to_defaults)
    r = inspect_checkpoint(p, target=fx["target"])
    assert "aux-layers" in codes(r, "warning") and "aux-layers" not in codes(r)
    assert "aux-layers" in codes(inspect_checkpoint(p))  # unprovable without the target


@pytest.mark.parametrize("ids,text", [([1, 4, 7], "Out of range"), ([0, 3, 3], "repeat"),
                                      ([1, 4, 6], "without the +1/-1 shift")])
@plants("aux-layers")
def test_aux_layers_bad_ids(plant, fx, ids, text):
    p = plant.copy()
    plant.config(p, lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=ids))
    r = inspect_checkpoint(p, target=fx["target"])
    assert any(f.code == "aux-layers" and text in f.message for f in r.findings), r.table()


@plants("architecture")
def test_architecture(plant):
    p = plant.copy()
    plant.config(p, lambda c: c.update(architectures=["Qwen3ForCausalLM"]))
    f = next(f for f in inspect_checkpoint(p).findings if f.code == "architecture")
    assert f.found == ["Qwen3ForCausalLM"]


@plants("architecture")
def test_architecture_speculators_config_for_sglang(fx):
    assert "architecture" in codes(inspect_checkpoint(fx["spec"], engine="sglang"))


@pytest.mark.parametrize("name", ["fc.weight", "midlayer.input_layernorm.weight"])
@plants("nonfinite")
def test_nonfinite(plant, name):
    p = plant.copy()

    def poison(s):
        s[name].view(-1)[7] = float("nan") if name == "fc.weight" else float("inf")
    plant.state(p, poison)
    f = next(f for f in inspect_checkpoint(p).findings if f.code == "nonfinite")
    assert f.tensor == name and f.found == 1


@plants("max-position")
def test_max_position_warning(plant, fx):
    p = plant.copy()
    plant.config(p, lambda c: c.update(max_position_embeddings=256))
    r = inspect_checkpoint(p, target=fx["target"])
    assert "max-position" in codes(r, "warning") and r.ok


@plants("norm-before-fc")
def test_norm_before_fc_served_by_sglang(fx, tmp_path):
    from eagle3lab.formats.demo import make_speculators_draft

    p = make_speculators_draft(tmp_path / "nbf", target=fx["target"], aux_ids=[1, 4, 6],
                               norm_before_fc=True)
    assert inspect_checkpoint(p, engine="vllm", target=fx["target"]).ok
    assert "norm-before-fc" in codes(inspect_checkpoint(p, engine="sglang"))


@plants("norm-before-fc")
def test_norm_before_fc_flat_config(plant, fx):
    p = plant.copy()
    plant.state(p, lambda s: s.update({"input_norm.weight": torch.ones(192)}))
    plant.config(p, lambda c: c["eagle_config"].update(norm_before_fc=True))
    assert "norm-before-fc" in codes(inspect_checkpoint(p, target=fx["target"]))
    assert inspect_checkpoint(p, target=fx["target"], engine="sglang-0.5.23").ok
    plant.config(p, lambda c: c["eagle_config"].pop("norm_before_fc"))  # weights, no flag
    r = inspect_checkpoint(p, target=fx["target"], engine="sglang-0.5.23")
    assert "norm-before-fc" in codes(r)


@plants("norm-variant")
def test_norm_variant(plant):
    p = plant.copy()
    plant.config(p, lambda c: c.update(norm_before_residual=True))
    assert "norm-variant" in codes(inspect_checkpoint(p))


@plants("dtype")
def test_dtype_mixed(plant):
    p = plant.copy()
    plant.state(p, lambda s: s.update({"fc.weight": s["fc.weight"].to(torch.bfloat16)}))
    r = inspect_checkpoint(p)
    assert any(f.code == "dtype" and "Mixed" in f.message for f in r.findings) and r.ok


def test_every_code_has_a_planted_fault_test():
    """Each code maps to the tests marked @plants(code), which check a finding with it
    (tests/planted.py); preflight's own codes are tests/preflight/'s."""
    import sys

    from eagle3lab.formats.findings import LAUNCH_CODES

    codes = [c for c in CODES if c not in LAUNCH_CODES]
    assert planted_problems(sys.modules[__name__], codes) == []


def test_preset_target_uses_prepared_config_only(fx, tmp_path, monkeypatch):
    from eagle3lab.config import DEFAULT_TARGET

    monkeypatch.setenv("EAGLE3LAB_DATA", str(tmp_path / "data"))
    from eagle3lab.errors import UserError

    with pytest.raises(UserError, match="prepare-target"):
        inspect_checkpoint(fx["sglang"], target=DEFAULT_TARGET)
    d = tmp_path / "data" / "models" / DEFAULT_TARGET
    d.mkdir(parents=True)
    (d / "config.json").write_text((fx["target"] / "config.json").read_text())
    r = inspect_checkpoint(fx["sglang"], target=DEFAULT_TARGET)
    assert r.ok and r.target["name"] == DEFAULT_TARGET
