"""Plain decoding with the rows refilled at once prefilled together (`prefill_rows`,
left-padded to the longest prompt) decodes exactly as the eager engine: same outputs and
finish reasons per request, greedy and sampled, with prompts of different lengths, rows
refilled many times and answers that end at their first token; the pads leave nothing in
the cache that a later token could see (a NaN there would spread to every output)."""

import pytest
import torch

from eagle3lab.specdec.accept import prompt_ids
from eagle3lab.specdec.batched import BatchedEngine
from eagle3lab.specdec.load import load_engine


def _prompts(target, n):
    ids = [ids for _, ids in prompt_ids(target.tokenizer, "eval", n, 1000)]
    # lengths that differ a lot: a short one pads most of a group
    return [p[: 5 + 7 * (i % 4)] if i % 3 == 0 else p for i, p in enumerate(ids)]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_grouped_prefill_equals_eager(tiny_target, temperature):
    prompts = _prompts(tiny_target, 7)
    assert len({len(p) for p in prompts}) > 3
    plain = load_engine(target=tiny_target)
    for max_new in (1, 9):
        old = [plain.generate(p, max_new_tokens=max_new, temperature=temperature, seed=3 + i)
               for i, p in enumerate(prompts)]
        eng = BatchedEngine(tiny_target, None, batch_size=3, prefill_rows=3)
        new = eng.generate_many(prompts, max_new_tokens=max_new, temperature=temperature,
                                seeds=[3 + i for i in range(len(prompts))])
        assert [r.output_ids for r in new] == [r.output_ids for r in old]
        assert [r.finish_reason for r in new] == [r.finish_reason for r in old]
        assert all(r.prefill_s > 0 for r in new)
        assert eng.kv_t.data.isfinite().all()


def test_grouped_prefill_fills_each_rows_cache_as_one_row_prefill(tiny_target):
    """The keys/values each prompt leaves in its own row (positions, slots, rotation):
    what a later token reads, beyond what a few tokens of a random model show."""
    prompts = _prompts(tiny_target, 3)
    one, grouped = (BatchedEngine(tiny_target, None, batch_size=3, prefill_rows=k)
                    for k in (1, 3))
    for eng in (one, grouped):
        eng.generate_many(prompts, max_new_tokens=2)
    for b, p in enumerate(prompts):  # rows 0, 1, 2 took prompts 0, 1, 2 in both
        a, g = (e.kv_t.data[:, :, b, :, :len(p)] for e in (one, grouped))
        assert (a - g).abs().max() < 1e-5


def test_a_group_stays_within_the_padded_token_bound(tiny_target, monkeypatch):
    from eagle3lab.specdec import batched

    prompts = _prompts(tiny_target, 7)
    bound = 2 * max(len(p) for p in prompts)  # a long prompt pairs with one more at most
    monkeypatch.setattr(batched, "PREFILL_TOKENS", bound)
    eng = BatchedEngine(tiny_target, None, batch_size=4, prefill_rows=4)
    groups = []
    grouped = eng._prefill_rows
    monkeypatch.setattr(eng, "_prefill_rows", lambda group, sample: (
        groups.append([len(r.ids) for _, r in group]), grouped(group, sample)))
    new = eng.generate_many(prompts, max_new_tokens=6)
    assert groups and all(len(g) * max(g) <= bound for g in groups)
    first = groups[0]  # cut by the bound before the 4 free rows were filled
    nxt = len(prompts[len(first)])
    assert 2 <= len(first) < 4 and (len(first) + 1) * max(first + [nxt]) > bound
    plain = load_engine(target=tiny_target)
    assert [r.output_ids for r in new] == [plain.generate(p, max_new_tokens=6).output_ids
                                           for p in prompts]


def test_prefill_rows_is_bounded_and_plain_only(tiny_target, tiny_draft):
    assert BatchedEngine(tiny_target, None, batch_size=2, prefill_rows=64).prefill_rows == 2
    assert BatchedEngine(tiny_target, None, batch_size=4).prefill_rows == 1
    spec = load_engine(target=tiny_target, draft=tiny_draft, engine="static", batch_size=4)
    assert spec.prefill_rows == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (device tool)")
def test_grouped_prefill_with_cuda_graphs_equals_eager_on_gpu(tiny_target_dir):
    """On a GPU in fp32 (graphs captured for the steps; the grouped prefill runs eagerly,
    where a pad that saw nothing would leave NaN in the cache)."""
    from eagle3lab.targets.adapter import load_target

    tgt = load_target(str(tiny_target_dir), device="cuda")
    prompts = _prompts(tgt, 9)
    plain = load_engine(target=tgt, engine="eager")
    for temperature in (0.0, 0.9):
        old = [plain.generate(p, max_new_tokens=16, temperature=temperature, seed=i)
               for i, p in enumerate(prompts)]
        eng = BatchedEngine(tgt, None, batch_size=4, prefill_rows=4)
        assert eng.graphs.enabled
        new = eng.generate_many(prompts, max_new_tokens=16, temperature=temperature,
                                seeds=list(range(len(prompts))))
        assert [r.output_ids for r in new] == [r.output_ids for r in old]
        assert eng.kv_t.data.isfinite().all()
