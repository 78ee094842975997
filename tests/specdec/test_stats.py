"""Acceptance statistics from raw counts, with the definitions SGLang uses."""

import math

import pytest

from eagle3lab.specdec.result import GenerationResult
from eagle3lab.specdec.stats import (AcceptStats, chain_expected_tau, decode_accept_length,
                                      predicted_speedup)


def _r(tokens, hist):
    return GenerationResult(output_ids=list(range(tokens)), finish_reason="length",
                            verify_ct=sum(hist), accept_histogram=hist, num_draft_tokens=3,
                            decode_s=1.0)


def test_rates_from_summed_counts():
    s = AcceptStats.from_results([_r(10, [1, 1, 1, 1]), _r(6, [2, 0, 1, 1])])
    assert s.histogram == [3, 1, 2, 2] and s.verify_ct == 8 and s.completion_tokens == 16
    assert s.tau == 2.0
    assert s.cumulative() == [5 / 8, 4 / 8, 2 / 8]
    assert s.conditional() == [5 / 8, 4 / 5, 2 / 4]
    assert s.mean_accepted == (1 + 4 + 6) / 8
    d = s.to_dict()
    assert d["accept_histogram"] == [3, 1, 2, 2] and d["tokens_per_s"] == 8.0


def test_histograms_of_different_lengths_add():
    s = AcceptStats.from_results([_r(3, [1, 1]), _r(9, [0, 0, 0, 3])])
    assert s.histogram == [1, 1, 0, 3]


def test_conditional_undefined_where_never_reached():
    s = AcceptStats.from_results([_r(2, [2, 0, 0])])
    assert s.conditional() == [0.0, None]


def test_chain_model_and_speedup():
    assert chain_expected_tau(0.0, 5) == 1.0
    assert chain_expected_tau(1.0, 5) == 6.0
    assert chain_expected_tau(0.5, 2) == pytest.approx(1.75)
    assert predicted_speedup(tau=3.0, plain_step_s=0.1, verify_step_s=0.15,
                             draft_per_verify_s=0.05) == pytest.approx(1.5)


def test_decode_accept_length_leaves_out_the_prefill_token():
    # 1 prefill token + 4 verify steps accepting 2, 0, 3, 1 drafts (+1 bonus each): 11 tokens
    s = AcceptStats.from_results([_r(11, [1, 1, 1, 1])])
    assert s.verify_ct == 4 and s.tau == pytest.approx(11 / 4)
    accepted = sum(n * h for n, h in enumerate(s.histogram))
    assert decode_accept_length(accepted, s.verify_ct) == pytest.approx(1 + 6 / 4)
    assert decode_accept_length(accepted, s.verify_ct) == pytest.approx(1 + s.mean_accepted)
    assert math.isnan(decode_accept_length(0, 0))
