"""BatchedEngine.swap_drafter: an engine built for one drafter decodes with another one
copied into it exactly as an engine built for that one does (outputs, counts, rejected
drafts), its vocabulary map included; a drafter of another architecture is refused with
the reason; the study's live_tau, which reuses one engine per shape, gives the rows that
fresh engines give."""

from __future__ import annotations

import pytest

from eagle3lab.errors import UserError
from eagle3lab.specdec.accept import prompt_ids
from eagle3lab.specdec.load import load_drafter, load_engine

FIELDS = ("output_ids", "accept_histogram", "verify_ct", "finish_reason", "mismatches")


@pytest.fixture(scope="module")
def drafters(tmp_path_factory, tiny_target_dir):
    from eagle3lab.formats.demo import make_speculators_draft, zipf_counts

    import json

    root = tmp_path_factory.mktemp("swap")
    vocab = json.loads((tiny_target_dir / "config.json").read_text())["vocab_size"]
    # different weights (seed) and different vocabulary maps (counts), one architecture
    a = make_speculators_draft(root / "a", target=tiny_target_dir, draft_vocab=512, seed=1)
    b = make_speculators_draft(root / "b", target=tiny_target_dir, draft_vocab=512, seed=2,
                               counts=zipf_counts(vocab, seed=5))
    other = make_speculators_draft(root / "c", target=tiny_target_dir, draft_vocab=512,
                                   norm_before_fc=True)
    return a, b, other


def _rows(res):
    return [tuple(getattr(r, f) for f in FIELDS) for r in res]


@pytest.mark.parametrize("steps,topk,d", [(3, 1, None), (2, 3, 6)])
def test_swapped_engine_decodes_as_a_fresh_one(tiny_target, drafters, steps, topk, d):
    a, b, _ = drafters
    prompts = [ids for _, ids in prompt_ids(tiny_target.tokenizer, "eval", 4, 1000)]
    kw = dict(target=tiny_target, steps=steps, topk=topk, draft_tokens=d, engine="static",
              batch_size=3)
    fresh = load_engine(draft=b, **kw).generate_many(prompts, max_new_tokens=12)
    eng = load_engine(draft=a, **kw)
    first = eng.generate_many(prompts, max_new_tokens=12)
    eng.swap_drafter(*load_drafter(b, target=tiny_target))
    swapped = eng.generate_many(prompts, max_new_tokens=12)
    assert _rows(swapped) == _rows(fresh)
    assert _rows(first) != _rows(fresh)  # the drafters do differ


def test_another_architecture_is_refused(tiny_target, drafters):
    a, _, other = drafters
    eng = load_engine(target=tiny_target, draft=a, engine="static", batch_size=2)
    loaded = load_drafter(other, target=tiny_target)
    assert "weights differ in name" in eng.swap_problem(*loaded)
    with pytest.raises(UserError, match="cannot swap in this drafter: its weights differ"):
        eng.swap_drafter(*loaded)
    assert "capture points" in eng.swap_problem(loaded[0], [1, 2, 3])


def test_live_tau_reuses_engines_and_matches_fresh_ones(tiny_target, drafters, monkeypatch):
    """Three drafters (the third of another architecture) at two shapes: two engines built
    for the first, swapped for the second, one more for the third; the rows are those of
    an engine built per drafter and shape."""
    import eagle3lab.specdec.load as load_mod
    from eagle3lab.study.atscale import live_tau

    a, b, other = drafters
    ds = [{"path": str(p), "tag": i} for i, p in enumerate((a, b, other))]
    built = []
    real = load_mod.load_engine

    def counting(**kw):
        built.append(kw["draft"])
        return real(**kw)

    monkeypatch.setattr(load_mod, "load_engine", counting)
    kw = dict(target=tiny_target, settings=["3,1,4", "2,3,6"], limit=3, max_new_tokens=10,
              dtype="float32", device="cpu", batch_size=2)
    rows = live_tau(drafters=ds, **kw)
    assert built == [str(a), str(a), str(other), str(other)]
    fresh = [r for d in ds for r in live_tau(drafters=[d], **kw)]
    keys = ("tag", "setting", "tau", "completion_tokens", "verify_ct", "accept_histogram",
            "per_prompt_tokens", "per_prompt_verify")
    assert [[r[k] for k in keys] for r in rows] == [[r[k] for k in keys] for r in fresh]
