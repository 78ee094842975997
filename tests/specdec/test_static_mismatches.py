"""The static engine keeps the rejected drafts as the eager engine does (`mismatches`:
[position, refused drafts, target id] per verify step that refused one), so weak-spots
shows the drafts next to what the target said with either engine. CPU, fp32, the tiny
target and a drafter built to be right about half the time (refusals after accepted
drafts, in chains and trees, ragged rows refilled in a batch)."""

from __future__ import annotations

from collections import Counter

import pytest

from eagle3lab.specdec.accept import Arm, measure_acceptance, prompt_ids
from testutil import eager_and_static


@pytest.fixture(scope="module")
def half_right(tmp_path_factory, tiny_target, tiny_target_dir):
    """A drafter whose head is zero but for four rows: +v and -v on the draft ids of the
    token the tiny target says (T: its greedy text repeats one token) and of another, +u
    and -u on two more. It drafts T where v.h > 0; its state h after the target's
    features (a chain's first draft) differs from its state after its own (the later
    drafts), so for a suitable v it is right about its first draft and wrong about a later
    one: the target accepts drafts and refuses others. The first seeded v that gives both
    (eager engine, two prompts) is kept. With top-k 2 the runner-up is the other positive
    row (no ties among the candidates)."""
    import torch
    from safetensors.torch import load_file, save_file

    from eagle3lab.formats.demo import make_speculators_draft, zipf_counts
    from eagle3lab.specdec.load import load_engine

    prompts = [ids for _, ids in prompt_ids(tiny_target.tokenizer, "eval", 2, 1000)]
    plain = load_engine(target=tiny_target)
    said = Counter(t for ids in prompts
                   for t in plain.generate(ids, max_new_tokens=8).output_ids)
    T = said.most_common(1)[0][0]
    counts = zipf_counts(tiny_target.vocab_size)
    counts[T] = counts.max() + 1  # T in the draft vocabulary
    path = make_speculators_draft(tmp_path_factory.mktemp("half") / "draft",
                                  target=tiny_target_dir, draft_vocab=512, counts=counts)
    w = load_file(str(path / "model.safetensors"))
    hot = torch.arange(512) + w["d2t"]
    a = int((hot == T).nonzero()[0, 0])
    b, c, d = [i for i in range(512) if i != a][:3]
    for seed in range(64):
        g = torch.Generator().manual_seed(seed)
        head = torch.zeros_like(w["lm_head.weight"])
        v, u = (torch.randn(head.shape[1], generator=g) for _ in range(2))
        head[a], head[b], head[c], head[d] = v, -v, u, -u
        save_file({**w, "lm_head.weight": head}, str(path / "model.safetensors"),
                  metadata={"format": "pt"})
        eng = load_engine(target=tiny_target, draft=str(path), steps=3)
        hist = [sum(h) for h in zip(*(eng.generate(ids, max_new_tokens=12).accept_histogram
                                      for ids in prompts))]
        if hist[0] and sum(hist[1:3]):
            return path
    pytest.fail("no seeded head gives both accepted and refused drafts")


@pytest.mark.parametrize("steps,topk,draft_tokens", [(3, 1, None), (3, 2, 5)])
def test_static_mismatches_equal_eager(tiny_target, half_right, steps, topk, draft_tokens):
    prompts = [ids for _, ids in prompt_ids(tiny_target.tokenizer, "eval", 5, 1000)]
    old, new = eager_and_static(tiny_target, str(half_right), prompts, steps=steps,
                                topk=topk, draft_tokens=draft_tokens, max_new_tokens=24,
                                batch_size=2)
    assert [r.output_ids for r in new] == [r.output_ids for r in old]
    assert [r.accept_histogram for r in new] == [r.accept_histogram for r in old]
    assert [r.mismatches for r in new] == [r.mismatches for r in old]
    hist = [sum(h) for h in zip(*(r.accept_histogram for r in new))]
    # drafts refused at step 0, and after one or more accepted ones (a refusal inside
    # the chain, or under a tree's accepted path)
    assert hist[0] > 0 and sum(hist[1:steps]) > 0, hist
    for r in new:
        for pos, drafts, target in r.mismatches:
            assert 0 < pos < len(r.output_ids) and r.output_ids[pos] == target
            assert drafts and target not in (drafts[:1] if topk == 1 else drafts)


def test_weak_spots_drafts_from_the_static_engine(tiny_target, half_right):
    """accept's per-request records (what weak-spots shows) are the same from both
    engines, batched or not."""
    kw = dict(target=tiny_target, arms=[Arm("a", str(half_right))], limit=4,
              max_new_tokens=16, steps=3, progress=False)
    eager = measure_acceptance(**kw)["arms"][0]["per_request"]
    static = measure_acceptance(**kw, engine="static", batch_size=3)["arms"][0]["per_request"]
    assert [p["mismatches"] for p in static] == [p["mismatches"] for p in eager]
    assert [p["mismatches_shown"] for p in static] == [p["mismatches_shown"] for p in eager]
    assert any(p["mismatches_shown"] for p in static)



@pytest.mark.parametrize("steps,topk,draft_tokens", [(3, 1, None), (3, 2, 5)])
def test_limits_inside_accepted_drafts_equal_eager(tiny_target, half_right, steps,
                                                   topk, draft_tokens):
    """The pipelined path accounts a whole batch at once (`_HostRows`): the token limit
    met inside a step's accepted drafts cuts that row there, the rest of the batch goes
    on, rows finish at different steps and are refilled; outputs, finish reasons, counts
    and rejected drafts as the eager engine's, one prompt at a time. (The tiny target
    repeats one token, so a stop on the accepted draft stops at the first token: stops
    inside accepted drafts are tests/specdec/test_batched.py's.)"""
    from eagle3lab.specdec.load import load_engine

    prompts = [ids for _, ids in prompt_ids(tiny_target.tokenizer, "eval", 9, 1000)]
    shape = dict(steps=steps, topk=topk, draft_tokens=draft_tokens)
    eager = load_engine(target=tiny_target, draft=str(half_right), **shape)
    accepted = Counter()  # the drafts the target accepted, over every step

    def seen(tokens, acc):
        accepted.update(tokens[:acc or 0])

    for p in prompts:
        eager.generate(p, max_new_tokens=20, on_step=seen)
    cuts = []  # steps whose accepted drafts the limit cut short

    def cut(tokens, acc):
        cuts.append(acc is not None and len(tokens) < acc + 1)

    # limits of 2, 7 and 20 tokens; the accepted draft as a stop token (the tiny target
    # repeats one token: answers end at their first)
    for max_new, stop in ((2, None), (7, None), (20, None), (20, {accepted.most_common(1)[0][0]})):
        old = [eager.generate(p, max_new_tokens=max_new, stop_token_ids=stop, on_step=cut)
               for p in prompts]
        for batch in (4, 9):
            static = load_engine(target=tiny_target, draft=str(half_right), **shape,
                                 engine="static", batch_size=batch)
            new = static.generate_many(prompts, max_new_tokens=max_new, stop_token_ids=stop)
            for f in ("output_ids", "finish_reason", "verify_ct", "accept_histogram",
                      "mismatches"):
                assert [getattr(r, f) for r in new] == [getattr(r, f) for r in old], f
    assert any(cuts)
