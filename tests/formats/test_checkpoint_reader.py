"""Lazy reading (sharded index, .bin with weights_only) and the inspect CLI contract."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file, save_file

from eagle3lab.cli import main as cli
from eagle3lab.formats import inspect_checkpoint
from eagle3lab.formats.reader import Checkpoint


def test_sharded_index_is_read(fx, tmp_path):
    d = tmp_path / "sharded"
    d.mkdir()
    state = load_file(str(fx["sglang"] / "model.safetensors"))
    names = sorted(state)
    halves = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    wm = {}
    for f, keys in halves.items():
        save_file({k: state[k] for k in keys}, str(d / f), metadata={"format": "pt"})
        wm.update({k: f for k in keys})
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    (d / "config.json").write_text((fx["sglang"] / "config.json").read_text())
    r = inspect_checkpoint(d, target=fx["target"])
    assert r.ok and len(r.tensors) == len(state)
    wm[names[0]] = "model-00002-of-00002.safetensors" if wm[names[0]].startswith(
        "model-00001") else "model-00001-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    assert "unreadable" in {f.code for f in inspect_checkpoint(d).findings}


def test_bin_is_loaded_weights_only_and_streamed(fx, tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    state = load_file(str(fx["sglang"] / "model.safetensors"))
    torch.save(state, d / "pytorch_model.bin")
    (d / "config.json").write_text((fx["sglang"] / "config.json").read_text())
    ck = Checkpoint(d)
    assert not ck.problems and set(ck.tensors) == set(state)
    blocks = list(ck.chunks("embed_tokens.weight", max_bytes=4096))
    assert len(blocks) > 1 and torch.equal(torch.cat(blocks), state["embed_tokens.weight"])


def test_chunks_of_safetensors(fx):
    ck = Checkpoint(fx["sglang"])
    blocks = list(ck.chunks("embed_tokens.weight", max_bytes=4096))
    assert len(blocks) == 16 and torch.equal(torch.cat(blocks), ck.tensor("embed_tokens.weight"))


def test_cli_exit_codes_and_json(fx, tmp_path, capsys):
    assert cli(["inspect", str(tmp_path / "nope")]) == 2
    assert cli(["inspect", str(fx["sglang"] / "config.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli(["inspect", str(fx["sglang"]), "--target", str(fx["target"])]) == 0
    assert "OK: 0 error(s)" in capsys.readouterr().out
    assert cli(["inspect", str(fx["spec"]), "--engine", "sglang", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["ok"] is False and "keys-layout" in {f["code"] for f in d["findings"]}
    assert cli(["inspect", str(fx["spec"]), "--engine", "sglang", "--tensors"]) == 1
    out = capsys.readouterr().out
    assert "SEVERITY" in out and "layers.0.self_attn.q_proj.weight" in out


def test_cli_help_explains_every_option(capsys):
    import pytest

    with pytest.raises(SystemExit):
        cli(["inspect", "--help"])
    text = capsys.readouterr().out
    for opt in ("--target", "--engine", "--json", "--tensors", "--no-values"):
        assert opt in text
    assert "sglang-0.5.23" in text and "preset" in text
