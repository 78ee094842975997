"""The benchmark's table arithmetic: ratios of summed raw counts (never means of ratios),
speedup against the baseline, per-position acceptance from summed histograms."""

import math

import pandas as pd

from eagle3lab.measure.client import avg_spec_accept_length
from eagle3lab.measure.tables import per_position, summarize


def test_summary_speedup_and_baseline_has_no_accept_length():
    df = pd.DataFrame([
        {"arm": "baseline", "completion_tokens": 20, "latency_s": 2.0, "spec_verify_ct": None,
         "accept_histogram": None},
        {"arm": "eagle3", "completion_tokens": 20, "latency_s": 1.0, "spec_verify_ct": 8,
         "accept_histogram": [2, 2, 2, 2]},
    ])
    s = summarize(df).set_index("arm")
    assert s.loc["baseline", "tokens_per_s"] == 10.0 and s.loc["eagle3", "speedup"] == 2.0
    assert math.isnan(s.loc["baseline", "accept_length"])
    assert s.loc["eagle3", "accept_length"] == 2.5


def test_ratios_of_sums_and_the_servers_number_beside_the_clients():
    df = pd.DataFrame([
        {"arm": "s", "completion_tokens": 30, "latency_s": 1.0, "spec_verify_ct": 10,
         "accept_histogram": None},
        {"arm": "s", "completion_tokens": 2, "latency_s": 1.0, "spec_verify_ct": 2,
         "accept_histogram": None},
    ])
    infos = {"s": {"internal_states": [{"avg_spec_accept_length": 2.75}]}}
    row = summarize(df, infos=infos, baseline="none").iloc[0]
    assert row["accept_length"] == 32 / 12  # not the mean of 3.0 and 1.0
    assert row["tokens_per_s"] == 16.0 and row["verify_steps"] == 12
    assert row["server_avg_accept_length"] == 2.75
    assert math.isnan(row["speedup"])  # no baseline arm ran
    assert avg_spec_accept_length(None) is None
    assert avg_spec_accept_length({"internal_states": []}) is None


def test_per_position_from_histograms():
    df = pd.DataFrame([{"arm": "s", "accept_histogram": [1, 1, 1, 1]},
                       {"arm": "s", "accept_histogram": [2, 2, 0, 0]},
                       {"arm": "baseline", "accept_histogram": None}])
    pp = per_position(df)
    assert list(pp["position"]) == [1, 2, 3] and set(pp["arm"]) == {"s"}
    # summed H = [3, 3, 1, 1], 8 verify steps
    assert list(pp["accepted_at_least_k"]) == [5, 2, 1]
    assert list(pp["p_cumulative"]) == [5 / 8, 2 / 8, 1 / 8]
    assert list(pp["p_conditional"]) == [5 / 8, 2 / 5, 1 / 2]
