"""The offline engines decode a drafter trained with speculators' eagle3 defaults (the
EAGLE-3.1 flags norm_before_fc and norm_output, and norm_before_residual) exactly as
speculators' own `Eagle3DraftModel.forward` computes it: the draft logits of the first
step (every position) and of the second (fed the first step's post-norm state, as
norm_output asks) are equal, in fp32 on the CPU, for the eager `Drafter` and the static
engine's `DrafterForward`, both loaded the way `accept` loads a drafter (`load_engine`).
The recipe arm's live tau is measured with the static engine, so this is what makes it the
drafter that was trained."""

from __future__ import annotations

import pytest
import torch

from eagle3lab.specdec.load import load_engine
from testutil import eager_and_static

FLAGS = {"norm_before_fc": True, "norm_output": True, "norm_before_residual": True}
L, T = 12, 7  # tokens in the test sequence; the position whose second step is compared


@pytest.fixture(scope="module")
def variant_draft(tmp_path_factory, tiny_target_dir):
    """A speculators-format drafter with FLAGS, saved by speculators itself with every
    parameter seeded (formats/demo.py; norm weights away from 1, so a skipped or misplaced
    norm shows); norm_output, which has no tensor of its own, set in its config."""
    import json

    from eagle3lab.formats.demo import make_speculators_draft

    path = make_speculators_draft(tmp_path_factory.mktemp("variant") / "draft",
                                  target=tiny_target_dir, draft_vocab=512, norm_before_fc=True,
                                  norm_before_residual=True)
    cfg = json.loads((path / "config.json").read_text())
    cfg["norm_output"] = True
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module")
def case(variant_draft, tiny_target):
    """Inputs (target ids, fused aux features, positions) and speculators' own draft
    logits for TTT steps 0 and 1 (its forward, the saved drafter from_pretrained)."""
    from eagle3lab.train import load_drafter

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, tiny_target.vocab_size, (L,), generator=g)
    feats = 2.0 * torch.randn(L, 3 * tiny_target.hidden_size, generator=g)
    pos = torch.arange(L) + 5
    ref = load_drafter(variant_draft).eval()
    assert all(getattr(ref.config, k) == v for k, v in FLAGS.items())
    logits = []
    hook = ref.lm_head.register_forward_hook(lambda m, i, o: logits.append(o[0].detach()))
    with torch.no_grad():
        ref(hidden_states=feats[None], input_ids=ids[None],
            document_ids=torch.zeros(1, L, dtype=torch.long), position_ids=pos[None],
            ttt_steps=2)
    hook.remove()
    return {"ids": ids, "feats": feats, "pos": pos, "step0": logits[0], "step1": logits[1]}


def _eager(drafter, c):
    """Step 0 over the whole sequence; step 1 at T fed the token after T (speculators'
    teacher forcing) and step 0's output state at T, after a cache of positions <= T."""
    with torch.no_grad():
        drafter.reset()
        step0, out = drafter.forward(c["ids"], drafter.project(c["feats"]), c["pos"])
        drafter.reset()
        drafter.forward(c["ids"][:T + 1], drafter.project(c["feats"][:T + 1]),
                        c["pos"][:T + 1])
        step1, _ = drafter.forward(c["ids"][T + 1:T + 2], out[T:T + 1], c["pos"][T:T + 1] + 1)
    return step0, step1[0]


def _static(engine, c):
    """The same two steps through the static engine's DrafterForward and cache."""
    df, hot = engine.df, engine.hot
    ids, feats, pos = c["ids"][None], c["feats"][None], c["pos"][None]
    tril = torch.ones(L, L, dtype=torch.bool).tril()[None]
    zero = torch.zeros(1, dtype=torch.long)
    with torch.no_grad():
        kv = df.new_cache(batch=1, max_len=L + 1, dtype=torch.float32, device="cpu")
        step0, out, _ = df(kv.data, ids, feats, pos, zero, torch.arange(L)[None], tril, hot,
                           kv_len=L, project=True)
        q = T + 1
        kv = df.new_cache(batch=1, max_len=L + 1, dtype=torch.float32, device="cpu")
        df(kv.data, ids[:, :q], feats[:, :q], pos[:, :q], zero, torch.arange(q)[None],
           tril[:, :q, :q], hot, kv_len=q, project=True)
        step1, _, _ = df(kv.data, ids[:, q:q + 1], out[:, T:T + 1], pos[:, T:T + 1] + 1, zero,
                         torch.tensor([[q]]), torch.ones(1, 1, q + 1, dtype=torch.bool), hot,
                         kv_len=q + 1)
    return step0[0], step1[0, 0]


@pytest.mark.parametrize("kind", ["eager", "static"])
def test_draft_logits_equal_speculators_forward(variant_draft, tiny_target, case, kind):
    engine = load_engine(target=tiny_target, draft=variant_draft, steps=3, engine=kind)
    m = engine.drafter.model
    assert m.input_norm is not None and m.layers[0].norm_before_residual
    assert m.config.norm_output
    step0, step1 = (_eager(engine.drafter, case) if kind == "eager"
                    else _static(engine, case))
    torch.testing.assert_close(step0, case["step0"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step1, case["step1"][T], rtol=1e-5, atol=1e-5)
    # each flag matters here: an engine that ignored one would draft something else
    layer, saved = m.layers[0], (m.config.norm_output, m.layers[0].norm_before_residual,
                                 m.input_norm)
    for flag in FLAGS:
        m.config.norm_output = flag != "norm_output"
        layer.norm_before_residual = flag != "norm_before_residual"
        m.input_norm = None if flag == "norm_before_fc" else saved[2]
        try:
            _, wrong = _eager(engine.drafter, case) if kind == "eager" else _static(engine,
                                                                                    case)
            assert not torch.allclose(wrong, case["step1"][T], atol=1e-3), flag
        finally:
            m.config.norm_output, layer.norm_before_residual, m.input_norm = saved


def test_static_engine_decodes_like_the_eager_one(variant_draft, tiny_target):
    """Whole generations (chain and tree): same tokens, same acceptance counts."""
    from eagle3lab.data.prompts import chat_prompt_ids

    prompts = [chat_prompt_ids(tiny_target.tokenizer, q) for q in
               ("Name a colour.", "Count to five.", "What is a drafter?")]
    for steps, topk, tokens in ((3, 1, None), (3, 2, 6)):
        old, new = eager_and_static(tiny_target, variant_draft, prompts, steps=steps,
                                    topk=topk, draft_tokens=tokens, max_new_tokens=12)
        assert [r.output_ids for r in new] == [r.output_ids for r in old]
        assert [r.accept_histogram for r in new] == [r.accept_histogram for r in old]
