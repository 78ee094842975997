"""Hook capture against output_hidden_states, and load errors (aux-layer resolution:
test_auxlayers.py)."""

import pytest
import torch

from eagle3lab.errors import UserError
from eagle3lab.targets.adapter import load_target


def test_missing_target_path(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_target(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no config.json"):
        load_target(str(tmp_path / "empty"))


def test_unreadable_target_weights(tmp_path, tiny_target_dir):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(tiny_target_dir, bad)
    (bad / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(UserError, match="Could not load the target"):
        load_target(str(bad))


def _check_capture(tgt, aux):
    tok = tgt.tokenizer
    ids = tok("Speculative decoding drafts tokens that the target verifies.",
              return_tensors="pt").input_ids
    fused, last = tgt.features(ids, None, aux)
    with torch.no_grad():
        hs = tgt.model(ids, output_hidden_states=True).hidden_states
    H = tgt.hidden_size
    assert fused.shape == (1, ids.shape[1], len(aux.capture_points) * H)
    for j, p in enumerate(aux.capture_points):
        assert torch.equal(fused[..., j * H:(j + 1) * H], hs[p]), f"capture point {p}"
    # `last` is the final norm's INPUT; HF's hidden_states[-1] is already normed.
    assert torch.equal(tgt.model.model.norm(last), hs[-1])
    assert not torch.equal(last, hs[-1])


def test_capture_matches_output_hidden_states_tiny(tiny_target):
    _check_capture(tiny_target, tiny_target.aux_layers())
    _check_capture(tiny_target, tiny_target.aux_layers([0, 3, 6], "sglang"))


@pytest.mark.real
def test_capture_matches_output_hidden_states_real(real_target):
    tgt = real_target
    assert (tgt.num_layers, tgt.hidden_size, tgt.vocab_size) == (30, 576, 49152)
    assert "<|im_start|>" in tgt.chat_template
    aux = tgt.aux_layers()
    assert list(aux.capture_points) == [2, 15, 27]
    _check_capture(tgt, aux)
    _check_capture(tgt, tgt.aux_layers([3, 10, 20], "vllm"))


def test_hooks_are_removed(tiny_target):
    aux = tiny_target.aux_layers()
    tiny_target.features(torch.tensor([[1, 2, 3]]), None, aux)
    for layer in tiny_target.model.model.layers:
        assert not layer._forward_pre_hooks
    assert not tiny_target.model.model.norm._forward_pre_hooks


def test_features_keep_the_attention_off_cudnn_on_cuda_only(tiny_target):
    """On CUDA `features` runs inside sdpa_kernel(FEATURE_SDPA): cuDNN's kernel disabled,
    the others allowed, torch's flags restored after; on the CPU, or with sdpa_backends
    None, torch chooses. The record names both."""
    from eagle3lab.targets.adapter import FEATURE_SDPA

    cuda = torch.backends.cuda
    before = cuda.cudnn_sdp_enabled()
    with tiny_target._sdpa(True):
        assert not cuda.cudnn_sdp_enabled()
        assert cuda.flash_sdp_enabled() and cuda.mem_efficient_sdp_enabled()
        assert cuda.math_sdp_enabled()
    assert cuda.cudnn_sdp_enabled() == before
    with tiny_target._sdpa(False):
        assert cuda.cudnn_sdp_enabled() == before
    assert tiny_target.attention() == {"implementation": "sdpa",
                                       "sdpa_backends_on_cuda": list(FEATURE_SDPA)}
    tiny_target.sdpa_backends = None
    try:
        with tiny_target._sdpa(True):
            assert cuda.cudnn_sdp_enabled() == before
        assert tiny_target.attention()["sdpa_backends_on_cuda"] is None
    finally:
        tiny_target.sdpa_backends = list(FEATURE_SDPA)


def test_a_compiled_target_keeps_its_hooks_and_refuses_a_bad_compile(tiny_target_dir):
    """`compile` registers the capture hooks once and keeps them (a compiled forward must
    not see them change); the compiled aux layers' states are the eager ones (dynamo's
    eager backend), other aux layers run eager; an unknown backend or a second compile is
    one line; the record says compiled only when it is."""
    tgt = load_target(str(tiny_target_dir), device="cpu")
    aux, other = tgt.aux_layers(), tgt.aux_layers([0, 3, 6], "sglang")
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    eager = tgt.features(ids, mask, aux)
    assert "compiled" not in tgt.attention()
    with pytest.raises(UserError, match="torch.compile has no backend 'nope'"):
        tgt.compile(aux, backend="nope")
    tgt.compile(aux, backend="eager")
    with pytest.raises(UserError, match="already compiled"):
        tgt.compile(aux, backend="eager")
    for a, b in zip(tgt.features(ids, mask, aux), eager):
        assert torch.equal(a, b)
    assert any(layer._forward_pre_hooks for layer in tgt.model.model.layers)
    assert tgt.features(ids, mask, other)[0].shape[-1] == 3 * tgt.hidden_size
    assert tgt.attention()["compiled"] == "eager"
