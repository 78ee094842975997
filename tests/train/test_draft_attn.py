"""The draft attention kernels (TrainConfig.draft_attn, train/model.py): speculators' dense
mask (sdpa) and its block-sparse BlockMask (simple_flex_attention) compute the same losses
and metrics on the same packed batch (same init, same data, fp32); flex needs lengths in
whole 128-token blocks (an unpadded length fails at TTT step 1, a padded one gives the
unpadded batch's numbers); "auto" resolves to flex on CUDA only, flex that cannot train
is refused in one line, and a run records the kernel it used.

Tolerance: fp32 on the CPU, the per-position loss sums agree to 1e-5 relative (measured
~2e-7: flex's eager path and SDPA sum in another order) and every accuracy count exactly;
moving one document boundary changes them by > 1e-3 relative, so the check can fail.
Training (backward) with flex runs only where torch implements it: not on the CPU in torch
2.13 (`flex_backward_problem` says so), so that test skips there with that reason."""

from __future__ import annotations

import json

import pytest

from eagle3lab.errors import UserError
from eagle3lab.train.model import (FLEX, FLEX_BLOCK, build_drafter, flex_backward_problem,
                                   resolve_draft_attn)
from testutil import make_tiny_llama

TTT = 3
VOCAB = 49152  # make_tiny_llama's (the SmolLM2 tokenizer's size)
DRAFT_VOCAB = 64


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    """A random 8-layer hidden-64 Llama (no tokenizer: the drafter needs none)."""
    path = tmp_path_factory.mktemp("attn-target")
    return make_tiny_llama(path, path)


def _drafter(target_dir, attn: str, device: str = "cpu"):
    import torch

    from eagle3lab.targets.auxlayers import resolve_aux_layers

    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[torch.arange(0, 4 * DRAFT_VOCAB, 4)] = True  # every 4th id: d2t offsets 3 * i
    d2t = torch.arange(DRAFT_VOCAB) * 3
    torch.manual_seed(0)
    return build_drafter(target_path=str(target_dir), aux=resolve_aux_layers(8), d2t=d2t,
                         t2d=t2d, ttt_steps=TTT, attn=attn).to(device)


def _batch(lengths: list[int], width: int, device: str = "cpu", seed: int = 1) -> dict:
    """A packed batch as CollateFn makes it: documents one after another, each with its
    own positions, then padding (document id -1, no loss) up to `width`."""
    import torch

    g = torch.Generator().manual_seed(seed)
    doc = torch.full((1, width), -1)
    pos = torch.zeros(1, width, dtype=torch.long)
    o = 0
    for i, n in enumerate(lengths):
        doc[0, o:o + n], pos[0, o:o + n] = i, torch.arange(n)
        o += n
    real = sum(lengths)
    hs = torch.zeros(1, width, 3 * 64)
    hs[:, :real] = torch.randn(1, real, 3 * 64, generator=g)
    last = torch.zeros(1, width, 64)
    last[:, :real] = torch.randn(1, real, 64, generator=g) * 4
    ids = torch.zeros(1, width, dtype=torch.long)
    ids[:, :real] = torch.randint(0, VOCAB, (1, real), generator=g)
    b = {"hidden_states": hs, "input_ids": ids, "document_ids": doc,
         "loss_mask": (doc != -1).long(), "position_ids": pos,
         "verifier_last_hidden_states": last}
    return {k: v.to(device) for k, v in b.items()}


def _metrics(model, batch, grad: bool = False):
    import torch
    from speculators.losses import resolve_loss_config

    kw = {"ttt_steps": TTT, "ttt_step_loss_decay": 1.0,
          "loss_config": resolve_loss_config("kl_div", "eager")}
    with torch.set_grad_enabled(grad):
        _, loss, m = model(**batch, **kw)
    if grad:
        loss.backward()
    losses = [float(m[f"loss_{i}_sum"]) for i in range(TTT)]
    counts = [float(m[f"{k}_{i}_sum"]) for k in ("full_acc", "cond_acc") for i in range(TTT)]
    return float(loss), losses, counts


def test_flex_forward_matches_sdpa_fp32(target_dir):
    """Three documents and padding in 256 tokens (2 blocks): the same per-position losses
    (1e-5 relative) and accuracy counts (exactly) from both kernels."""
    batch = _batch([100, 90, 40], 2 * FLEX_BLOCK)
    _, sdpa, sdpa_counts = _metrics(_drafter(target_dir, "sdpa"), batch)
    _, flex, flex_counts = _metrics(_drafter(target_dir, FLEX), batch)
    assert flex == pytest.approx(sdpa, rel=1e-5)
    assert flex_counts == sdpa_counts
    # the tolerance can fail: one boundary moved (100|90 -> 120|70) changes the losses
    _, moved, _ = _metrics(_drafter(target_dir, "sdpa"), _batch([120, 70, 40], 256))
    assert max(abs(a - b) / abs(b) for a, b in zip(moved, sdpa)) > 1e-3


def test_flex_needs_whole_blocks_and_padding_keeps_the_numbers(target_dir):
    """300 tokens (not a multiple of 128): speculators' flex path fails at TTT step 1 (its
    BlockMask grows by whole blocks), why the loop pads every flex batch, eval too; the
    same documents padded to 384 give the unpadded sdpa batch's numbers."""
    docs = [130, 120, 50]
    with pytest.raises(ValueError, match="block_mask was created for"):
        _metrics(_drafter(target_dir, FLEX), _batch(docs, 300))
    _, sdpa, sdpa_counts = _metrics(_drafter(target_dir, "sdpa"), _batch(docs, 300))
    _, flex, flex_counts = _metrics(_drafter(target_dir, FLEX), _batch(docs, 3 * FLEX_BLOCK))
    assert flex == pytest.approx(sdpa, rel=1e-5)
    assert flex_counts == sdpa_counts


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def test_flex_training_step_matches_sdpa(target_dir):
    """One forward + backward per kernel (fp32): the same loss and the same gradient of fc
    and of the attention's q_proj. Runs where flex has a backward (CUDA; speculators
    compiles the forward there), skips elsewhere naming torch's reason."""
    device = _device()
    problem = flex_backward_problem(device)
    if problem:
        pytest.skip(f"flex attention cannot train on {device}: {problem}")
    batch = _batch([300, 280, 200, 150], 8 * FLEX_BLOCK, device)
    grads = {}
    for attn in ("sdpa", FLEX):
        model = _drafter(target_dir, attn, device)
        loss, losses, counts = _metrics(model, batch, grad=True)
        grads[attn] = (loss, losses, counts, model.fc.weight.grad.clone(),
                       model.layers[0].self_attn.q_proj.weight.grad.clone())
    (ls, ps, cs, fs, qs), (lf, pf, cf, ff, qf) = grads["sdpa"], grads[FLEX]
    assert lf == pytest.approx(ls, rel=1e-4) and pf == pytest.approx(ps, rel=1e-4)
    assert cf == cs
    for a, b in ((ff, fs), (qf, qs)):
        assert float((a - b).norm() / b.norm()) < 1e-3


def test_resolve_draft_attn():
    assert resolve_draft_attn("sdpa", device="cuda", max_tokens=16384) == "sdpa"
    assert resolve_draft_attn("eager", device="cpu", max_tokens=100) == "eager"
    assert resolve_draft_attn("auto", device="cpu", max_tokens=16384) == "sdpa"
    assert resolve_draft_attn("auto", device="cuda:1", max_tokens=16384) == FLEX
    assert resolve_draft_attn(FLEX, device="cuda", max_tokens=8192) == FLEX
    # not whole blocks: auto falls back, flex itself is refused saying why
    assert resolve_draft_attn("auto", device="cuda", max_tokens=1000) == "sdpa"
    with pytest.raises(UserError, match="1000 is not a multiple of 128"):
        resolve_draft_attn(FLEX, device="cuda", max_tokens=1000)
    problem = flex_backward_problem("cpu")
    if problem:  # torch 2.13: no flex backward on the CPU
        assert "backward" in problem
        with pytest.raises(UserError, match="cannot train on cpu: .*backward"):
            resolve_draft_attn(FLEX, device="cpu", max_tokens=2048)
    else:
        assert resolve_draft_attn(FLEX, device="cpu", max_tokens=2048) == FLEX


def test_run_records_the_resolved_kernel(tmp_path, sharp_data):
    """draft_attn 'auto' on the CPU trains with sdpa: run.json keeps the config as given
    and records the kernel used; flex asked for on the CPU is refused before any step."""
    from eagle3lab.train import train

    kw = dict(data=sharp_data["train"], eval_data=sharp_data["eval"], max_steps=1,
              max_tokens_per_batch=256, eval_at_start=False, progress=False)
    train(out=str(tmp_path / "auto"), draft_attn="auto", **kw)
    run = json.loads((tmp_path / "auto" / "run.json").read_text())
    assert run["config"]["draft_attn"] == "auto"
    assert run["drafter"]["draft_attn"] == "sdpa"
    if flex_backward_problem("cpu"):
        with pytest.raises(UserError, match="draft_attn 'simple_flex_attention' cannot train"):
            train(out=str(tmp_path / "flex"), draft_attn=FLEX, **kw)
        assert not (tmp_path / "flex" / "run.json").exists()
