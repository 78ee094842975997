"""The speculative engine is exact: at temperature 0 its output is the target's plain
greedy output (chain and tree, real target), whatever the drafter proposes; at
temperature > 0 its tokens follow the target's distribution (statistical test)."""

import types

import pytest
import torch

from eagle3lab.errors import UserError
from eagle3lab.data.prompts import chat_prompt_ids
from eagle3lab.formats.demo import make_speculators_draft
from eagle3lab.specdec.drafting import Drafter
from eagle3lab.specdec.engine import SpecEngine
from eagle3lab.specdec.load import load_engine
from eagle3lab.specdec.plain import PlainEngine
from oracle import OracleDrafter, random_drafter

SETTINGS = [(3, 1, None), (5, 1, None), (4, 3, 10)]  # (steps, topk, draft_tokens)


@pytest.fixture(scope="module")
def greedy_case(real_target):
    ids = chat_prompt_ids(real_target.tokenizer, "List three colours of the rainbow.")
    plain = PlainEngine(real_target).generate(ids, max_new_tokens=24)
    return ids, plain


@pytest.mark.real
@pytest.mark.parametrize("steps,topk,draft_tokens", SETTINGS)
@pytest.mark.parametrize("wrong", [0.0, 0.4])
def test_greedy_output_equals_plain_with_oracle(real_target, greedy_case, steps, topk,
                                                draft_tokens, wrong):
    ids, plain = greedy_case
    oracle = OracleDrafter(ids + plain.output_ids, real_target.vocab_size,
                           real_target.hidden_size, wrong=wrong, seed=steps + topk)
    eng = SpecEngine(real_target, oracle, steps=steps, topk=topk, draft_tokens=draft_tokens)
    r = eng.generate(ids, max_new_tokens=24)
    assert r.output_ids == plain.output_ids
    assert r.finish_reason == plain.finish_reason
    assert sum(r.accept_histogram) == r.verify_ct
    assert len(r.accept_histogram) == steps + 1
    if wrong == 0.0:  # a perfect drafter: every verify step accepts all it can
        assert r.accept_length > steps * 0.75
    else:
        assert 1.0 < r.accept_length < steps + 1


@pytest.fixture(scope="module")
def untrained_real_draft(real_target, tmp_path_factory):
    """An untrained speculators drafter for the real target, written once for the chain and
    the tree setting (loading it does not change it)."""
    return make_speculators_draft(tmp_path_factory.mktemp("draft") / "d",
                                  target=real_target.path, draft_vocab=4096, seed=1)


@pytest.mark.real
@pytest.mark.parametrize("steps,topk,draft_tokens", [(3, 1, None), (3, 3, 7)])
def test_greedy_output_equals_plain_with_real_drafter(real_target, greedy_case, steps, topk,
                                                      draft_tokens, untrained_real_draft):
    ids, plain = greedy_case
    draft = untrained_real_draft
    eng = load_engine(target=real_target, draft=draft, steps=steps, topk=topk,
                      draft_tokens=draft_tokens)
    r = eng.generate(ids, max_new_tokens=24)
    assert r.output_ids == plain.output_ids
    assert r.accept_length < 1.3  # an untrained drafter is (almost) never accepted


def test_draft_token_budget_rules(tiny_target):
    d = OracleDrafter([1, 2, 3], tiny_target.vocab_size, tiny_target.hidden_size)
    assert SpecEngine(tiny_target, d, steps=4, topk=1, draft_tokens=99).draft_tokens == 5
    with pytest.raises(UserError, match="draft_tokens"):
        SpecEngine(tiny_target, d, steps=2, topk=2, draft_tokens=9)
    with pytest.raises(UserError, match="features"):
        SpecEngine(tiny_target, d, features="wrong")
    with pytest.raises(UserError, match="greedily only"):
        SpecEngine(tiny_target, d, steps=2, topk=2).generate([1, 2], max_new_tokens=2,
                                                             temperature=1.0)


def test_stop_token_inside_accepted_drafts_ends_output(tiny_target):
    ids = [1, 5, 9, 13]
    plain = PlainEngine(tiny_target).generate(ids, max_new_tokens=20, stop_token_ids=set())
    stop = plain.output_ids[6]
    oracle = OracleDrafter(ids + plain.output_ids, tiny_target.vocab_size,
                           tiny_target.hidden_size, wrong=0.0)
    r = SpecEngine(tiny_target, oracle, steps=5).generate(ids, max_new_tokens=20,
                                                          stop_token_ids={stop})
    first = plain.output_ids.index(stop)
    assert r.output_ids == plain.output_ids[:first + 1] and r.finish_reason == "stop"


def _tiny_vocab_target(vocab=12, seed=3):
    """A 12-token Llama in memory (no tokenizer: the test feeds token ids)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle3lab.targets.adapter import Target

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, eos_token_id=None, bos_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper distributions than the tiny init gives
        model.lm_head.weight.mul_(40)
    return Target(model, types.SimpleNamespace(chat_template=None), "tiny", "tiny")


def chi_square_pvalue(observed, expected) -> float:
    """Pearson's chi-square goodness of fit: P(X >= stat), X ~ chi2(len - 1)."""
    stat = float(((observed - expected) ** 2 / expected).sum())
    dof = observed.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(stat / 2)))


def test_chi_square_pvalue_sanity():
    exp = torch.full((4,), 25.0)
    assert chi_square_pvalue(exp.clone(), exp) == 1.0
    assert chi_square_pvalue(torch.tensor([70.0, 10, 10, 10]), exp) < 1e-6


def test_rejection_sampling_preserves_the_target_distribution():
    """Second and third generated tokens: empirical frequencies vs the exact target
    marginals (chi-square, fixed seeds: deterministic)."""
    tgt = _tiny_vocab_target()
    drafter = Drafter(random_drafter(tgt, seed=5))
    with torch.no_grad():
        drafter.model.lm_head.weight.mul_(30)  # a confident drafter that is often wrong
    eng = SpecEngine(tgt, drafter, steps=2)
    prompt = [1, 4, 7]
    V = tgt.vocab_size
    n = 800
    counts2, counts3 = torch.zeros(V), torch.zeros(V)
    accepted = 0
    for i in range(n):
        r = eng.generate(prompt, max_new_tokens=3, temperature=1.0, seed=i, stop_token_ids=set())
        counts2[r.output_ids[1]] += 1
        counts3[r.output_ids[2]] += 1
        accepted += sum(k * h for k, h in enumerate(r.accept_histogram))
    with torch.no_grad():
        p1 = torch.softmax(tgt.model(torch.tensor([prompt])).logits[0, -1], -1)
        seq2 = torch.tensor([prompt + [a] for a in range(V)])
        p2_given = torch.softmax(tgt.model(seq2).logits[:, -1], -1)  # [t1, t2]
        p2 = p1 @ p2_given
        seq3 = torch.tensor([prompt + [a, b] for a in range(V) for b in range(V)])
        p3_given = torch.softmax(tgt.model(seq3).logits[:, -1], -1)
        joint12 = (p1[:, None] * p2_given).reshape(-1)
        p3 = joint12 @ p3_given
    assert 0.1 < accepted / (2 * n) < 0.95, "the test must exercise both accept and reject"
    for counts, p in ((counts2, p2), (counts3, p3)):
        keep = p * n >= 5
        exp = p[keep] * n
        obs = counts[keep]
        exp = exp * obs.sum() / exp.sum()
        assert chi_square_pvalue(obs, exp) > 0.001
