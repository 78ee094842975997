"""Converters: rename tables + checks, config translation, refusals, bit-exact round trip,
and the result loads in speculators' own classes."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from eagle3lab.cli import main as cli
from eagle3lab.formats import inspect_checkpoint
from eagle3lab.formats.convert import ConversionError, convert_checkpoint


def test_round_trip_is_bit_exact(fx, tmp_path):
    back = convert_checkpoint(fx["sglang"], tmp_path / "back", to="speculators",
                              target=fx["target"]).path
    a = load_file(str(fx["spec"] / "model.safetensors"))
    b = load_file(str(back / "model.safetensors"))
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        assert a[k].contiguous().view(torch.uint8).equal(b[k].contiguous().view(torch.uint8)), k
    orig = json.loads((fx["spec"] / "config.json").read_text())
    new = json.loads((back / "config.json").read_text())
    for key in ("eagle_aux_hidden_state_layer_ids", "draft_vocab_size", "norm_before_fc",
                "transformer_layer_config", "speculators_model_type", "architectures"):
        assert new[key] == orig[key], key


def test_sglang_config_translation(fx):
    cfg = json.loads((fx["sglang"] / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["draft_vocab_size"] == 128 and cfg["target_hidden_size"] == 64
    assert cfg["hidden_size"] == 64 and cfg["num_hidden_layers"] == 1
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 3, 5]  # vLLM ids - 1
    assert "eagle_aux_hidden_state_layer_ids" not in cfg  # SGLang would ignore it anyway
    rec = cfg["eagle3lab"]["aux_layers"]
    assert rec["capture_points"] == [1, 4, 6] and rec["convention"] == "sglang"
    keys = set(load_file(str(fx["sglang"] / "model.safetensors")))
    assert "midlayer.self_attn.q_proj.weight" in keys and not any(
        k.startswith("layers.") for k in keys)


def test_outputs_pass_inspect_for_their_engines(fx, tmp_path):
    back = convert_checkpoint(fx["sglang"], tmp_path / "back", to="speculators").path
    for engine in ("vllm", "speculators"):
        assert inspect_checkpoint(back, target=fx["target"], engine=engine).ok
    assert inspect_checkpoint(fx["sglang"], target=fx["target"], engine="sglang").ok


def test_converted_checkpoint_loads_in_speculators_classes(fx, tmp_path):
    """speculators' own Eagle3DraftModel.from_pretrained loads the sglang -> speculators
    output (weights and vocab map intact; aux ids as training recorded them)."""
    from speculators.models.eagle3 import Eagle3DraftModel

    back = convert_checkpoint(fx["sglang"], tmp_path / "back", to="speculators",
                              target=fx["target"]).path
    model = Eagle3DraftModel.from_pretrained(str(back))
    state = load_file(str(fx["spec"] / "model.safetensors"))
    got = model.state_dict()
    for k, v in state.items():
        assert torch.equal(got[k], v), k
    assert model.config.eagle_aux_hidden_state_layer_ids == [1, 4, 6]
    assert model.config.transformer_layer_config.hidden_size == 64


def test_sglang_export_is_what_speculators_own_converter_reads(fx, tmp_path):
    """speculators' Eagle3Converter (EAGLE/SpecForge -> speculators) takes our SGLang export
    and gives back exactly the tensors speculators saved in the first place."""
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    out = tmp_path / "by-speculators"
    Eagle3Converter().convert(str(fx["sglang"]), str(out), base_model=str(fx["target"]),
                              validate=True, eagle_aux_hidden_state_layer_ids=[1, 4, 6])
    a = load_file(str(out / "model.safetensors"))
    b = load_file(str(fx["spec"] / "model.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert inspect_checkpoint(out, target=fx["target"], engine="vllm").ok


def _nothing_written(tmp_path, name="out"):
    return not (tmp_path / name).exists() and not list(tmp_path.glob(f".{name}.*"))


def test_refuses_norm_before_fc_for_sglang(fx, tmp_path, capsys):
    from eagle3lab.formats.demo import make_speculators_draft

    src = make_speculators_draft(tmp_path / "nbf", target=fx["target"], aux_ids=[1, 4, 6],
                                 norm_before_fc=True)
    rc = cli(["convert", str(src), str(tmp_path / "out"), "--to", "sglang"])
    err = capsys.readouterr().err
    assert rc == 1 and "[norm-before-fc]" in err and "Options" in err
    assert _nothing_written(tmp_path)
    # SGLang 0.5.23 applies it: allowed there, with the flag where that release reads it
    out = convert_checkpoint(src, tmp_path / "out", to="sglang", engine="sglang-0.5.23",
                             target=fx["target"]).path
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_config"]["norm_before_fc"] is True
    assert "input_norm.weight" in load_file(str(out / "model.safetensors"))


def test_refuses_norm_before_residual_for_every_sglang(fx, tmp_path):
    from eagle3lab.formats.demo import make_speculators_draft

    src = make_speculators_draft(tmp_path / "nbr", target=fx["target"],
                                 norm_before_residual=True)
    for engine in ("sglang", "sglang-0.5.23"):
        with pytest.raises(ConversionError) as e:
            convert_checkpoint(src, tmp_path / "out", to="sglang", engine=engine)
        assert e.value.code == "norm-variant"
    assert _nothing_written(tmp_path)


@pytest.mark.parametrize("fault,code", [
    (lambda s: s.update({"extra.weight": torch.ones(3)}), "unknown-keys"),
    (lambda s: s.pop("layers.0.mlp.up_proj.weight"), "missing-keys"),
    (lambda s: s.pop("t2d"), "missing-keys"),
    (lambda s: s.update({"layers.1.mlp.up_proj.weight": torch.ones(3)}), "unknown-keys"),
    (lambda s: s["fc.weight"].view(-1).__setitem__(0, float("nan")), "nonfinite"),
    (lambda s: s["norm.weight"].zero_(), "missing-keys"),
])
def test_refusals_write_nothing(plant, tmp_path, fault, code):
    src = plant.state(plant.copy("spec"), fault)
    with pytest.raises(ConversionError) as e:
        convert_checkpoint(src, tmp_path / "out", to="sglang")
    assert e.value.code == code
    assert _nothing_written(tmp_path)


def test_refuses_wrong_direction_and_existing_dst(fx, tmp_path):
    with pytest.raises(ConversionError, match="--to sglang converts from speculators"):
        convert_checkpoint(fx["sglang"], tmp_path / "out", to="sglang")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    assert cli(["convert", str(fx["spec"]), str(tmp_path / "full"), "--to", "sglang"]) == 1
    assert (tmp_path / "full" / "x").read_text() == "keep me"


def test_refuses_aux_ids_the_engine_cannot_capture(plant, fx, tmp_path):
    src = plant.copy("spec")
    plant.config(src, lambda c: (c.update(eagle_aux_hidden_state_layer_ids=[1, 4, 8]),
                                 c["eagle3lab"]["aux_layers"].update(capture_points=[1, 4, 8])))
    with pytest.raises(ConversionError) as e:  # id 8 = the final output: no SGLang capture
        convert_checkpoint(src, tmp_path / "out", to="sglang", target=fx["target"])
    assert e.value.code == "aux-layers"


def test_cli_convert_prints_summary(fx, tmp_path, capsys):
    rc = cli(["convert", str(fx["spec"]), str(tmp_path / "o"), "--to", "sglang",
              "--target", str(fx["target"])])
    out = capsys.readouterr().out
    assert rc == 0 and "aux ids [0, 3, 5] (sglang convention" in out
    assert inspect_checkpoint(tmp_path / "o", target=fx["target"]).ok


@pytest.mark.real
def test_real_default_target_preset(default_target_dir, tmp_path):
    """A drafter for SmolLM2-135M (30 layers, hidden 576, vocab 49152), checked and converted
    against the preset by name; SGLang's default capture points for it are [2, 15, 27]."""
    from eagle3lab.config import DEFAULT_TARGET
    from eagle3lab.formats.demo import make_speculators_draft
    from eagle3lab.formats.load_as import load_as

    spec = make_speculators_draft(tmp_path / "spec", target=default_target_dir,
                                  draft_vocab=2048)
    assert inspect_checkpoint(spec, target=DEFAULT_TARGET).ok
    r = inspect_checkpoint(spec, target=DEFAULT_TARGET, engine="sglang")
    assert "aux-layers" in {f.code for f in r.findings}  # speculators' top-level ids
    out = convert_checkpoint(spec, tmp_path / "sgl", to="sglang", target=DEFAULT_TARGET).path
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    es = load_as(out, "sglang", target=DEFAULT_TARGET)
    assert es.capture_points == [2, 15, 27] and es.sources["embed_tokens.weight"] == "target"
