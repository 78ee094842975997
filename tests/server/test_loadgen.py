"""The concurrent benchmark client against the reference server (tiny target, speculative
engine): every level sends the same requests with N in flight over both APIs, reports
throughput, TTFT, ITL and accept length, and the /metrics window of each level counts
exactly the verify steps its requests report."""

import math

from eagle3lab.server.loadgen import summarize_level, sweep


def test_sweep_levels_on_both_apis(tiny_spec_server):
    reqs = [{"prompt_id": f"p{i}", "input_ids": [5 + i, 6, 7, 8]} for i in range(4)]
    levels, rows = sweep(tiny_spec_server.url, reqs, levels=(1, 4), arm="speculative",
                         max_new_tokens=6, log=lambda s: None)
    assert list(levels["concurrency"]) == [1, 4] and list(levels["failed"]) == [0, 0]
    assert list(levels["completion_tokens"]) == [24, 24]  # ignore_eos: the full budget
    assert (levels["throughput_tok_s"] > 0).all() and (levels["ttft_mean_s"] > 0).all()
    assert (levels["itl_mean_s"] > 0).all()
    for (_, lv), c in zip(levels.iterrows(), (1, 4)):
        verify = rows.loc[rows["concurrency"] == c, "spec_verify_ct"].sum()
        assert lv["metrics_source"] == "vllm" and lv["metrics_drafts"] == verify
        assert lv["accept_length"] == 24 / verify
        assert len(lv["metrics_per_position"]) == 3
    # greedy: concurrency does not change what is generated (queued, not mixed)
    opened, _ = sweep(tiny_spec_server.url, reqs[:2], levels=(2,), api="openai",
                      max_new_tokens=6, log=lambda s: None)
    assert list(opened["completion_tokens"]) == [12] and opened["failed"][0] == 0
    assert math.isnan(opened["accept_length"][0])  # OpenAI chunks carry no spec fields


def test_failed_requests_are_counted_not_raised():
    rows = [{"ok": True, "completion_tokens": 10, "ttft_s": 0.1, "latency_s": 1.0,
             "itl": [0.1] * 9, "spec_verify_ct": 4, "error": None},
            {"ok": False, "completion_tokens": 0, "ttft_s": math.nan, "latency_s": math.nan,
             "itl": [], "spec_verify_ct": None, "error": "HTTP 500: boom"}]
    s = summarize_level(rows, concurrency=2, wall_s=2.0, window=None)
    assert (s["failed"], s["throughput_tok_s"], s["accept_length"]) == (1, 5.0, 2.5)
    assert s["errors"] == ["HTTP 500: boom"] and s["metrics_source"] is None
