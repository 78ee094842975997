"""pack_drafter: the shipping copy of a trained drafter (how data/drafters/ was made) has
no embedding, bf16 weights equal to the trained ones rounded, loads with the target's
embedding and passes the checkpoint doctor."""

from __future__ import annotations

import json

import pytest

from eagle3lab.errors import UserError
from eagle3lab.train import load_drafter, pack_drafter


@pytest.fixture(scope="module")
def packed(trained_run, tmp_path_factory):
    dst = tmp_path_factory.mktemp("pack") / "drafter"
    return pack_drafter(trained_run / "final", dst), dst


def test_packed_drafter_has_no_embedding_and_is_bf16(trained_run, packed):
    import torch
    from safetensors.torch import load_file

    facts, dst = packed
    trained = load_file(str(trained_run / "final" / "model.safetensors"))
    w = load_file(str(dst / "model.safetensors"))
    assert "embed_tokens.weight" in trained and "embed_tokens.weight" not in w
    assert set(w) == set(trained) - {"embed_tokens.weight"}
    for k, v in w.items():
        if trained[k].is_floating_point():
            assert v.dtype == torch.bfloat16, k
            assert torch.equal(v, trained[k].to(torch.bfloat16)), k
        else:
            assert torch.equal(v, trained[k]), k  # d2t / t2d kept exactly
    assert facts["params"] == sum(v.numel() for v in w.values())
    assert facts["bytes"] == (dst / "model.safetensors").stat().st_size
    for name in ("config.json", "eagle3lab.json"):
        assert json.loads((dst / name).read_text()) == json.loads(
            (trained_run / "final" / name).read_text())
    assert sorted(p.name for p in dst.iterdir()) == ["config.json", "eagle3lab.json",
                                                     "model.safetensors"]


def test_packed_drafter_loads_with_the_target_embedding(packed, sharp_target_dir):
    from speculators.utils.loading import load_model_layers

    model = load_drafter(packed[1], target=str(sharp_target_dir))
    want = load_model_layers(["embed_tokens.weight"], str(sharp_target_dir))
    assert model.embed_tokens.weight.abs().sum() > 0
    assert (model.embed_tokens.weight.float() == want["embed_tokens.weight"].float()).all()


def test_packed_drafter_passes_the_doctor(packed, sharp_target_dir):
    from eagle3lab.formats.doctor import inspect_checkpoint

    report = inspect_checkpoint(packed[1], target=str(sharp_target_dir), engine="vllm")
    assert report.ok, report.to_json()
    assert report.format == "speculators" and report.engine == "vllm"


def test_packing_something_else_is_refused(tmp_path, trained_run):
    with pytest.raises(UserError, match=r"is not a trained drafter.*final/"):
        pack_drafter(trained_run, tmp_path / "x")  # the run dir, not its final/
    assert not (tmp_path / "x").exists()
