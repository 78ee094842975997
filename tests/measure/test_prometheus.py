"""/metrics: the reference server's exposition carries vLLM's spec-decode counters and
SGLang's gauges under the engines' names, and the scraper turns two scrapes into accept
length and per-position acceptance over the window (differences, never totals)."""

import math

import pytest

from eagle3lab.measure.prometheus import ReferenceMetrics, parse_metrics, positions_frame, window

#: The text a vLLM server writes (names and labels from vllm/v1/spec_decode/metrics.py
#: and vllm/v1/metrics/loggers.py; prometheus_client writes a Counter as NAME_total plus
#: NAME_created), two engines (data parallel) that the scraper must sum.
VLLM_TEXT = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} {d0}
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} {d1}
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} {dt}
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} {acc}
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} {p1}
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} {gen}
vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e+09
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} {pt}
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} {stop}
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} {length}
vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 0.0
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 3.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 9.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 9.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 640.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 4.0
"""


def _vllm(**v):
    text = VLLM_TEXT
    for k, x in v.items():
        text = text.replace("{" + k + "}", str(x))
    return {"t": v.get("t", 0.0), **parse_metrics(text)}


def test_vllm_counters_give_accept_length_and_per_position_over_a_window():
    """Names, labels and types as vLLM 0.25.1 exposes them (vllm/v1/spec_decode/
    metrics.py:228-264, vllm/v1/metrics/loggers.py:431-688): counters as NAME_total, a
    histogram whose name ends in _total (`vllm:iteration_tokens_total`) left alone."""
    before = _vllm(d0=100, d1=0, dt=200, acc=50, p0=40, p1=10, gen=1000, pt=300, stop=2,
                   length=5, t=0.0)
    after = _vllm(d0=110, d1=10, dt=240, acc=80, p0=58, p1=22, gen=1050, pt=340, stop=3,
                  length=8, t=2.0)  # 20 drafts, 50 tokens, 4 requests more
    w = window(before, after)
    assert w["source"] == "vllm"
    assert (w["drafts"], w["draft_tokens"], w["accepted"]) == (20, 40, 30)
    assert w["accept_length"] == pytest.approx(1 + 30 / 20)  # vLLM: 1 + accepted / drafts
    assert w["acceptance_rate"] == pytest.approx(30 / 40)
    assert w["per_position"] == pytest.approx([18 / 20, 12 / 20])
    assert w["per_position_accepted"] == [18, 12]
    assert (w["generation_tokens"], w["tokens_per_s"]) == (50, 25)
    assert (w["requests"], w["prompt_tokens"]) == (4, 40)
    assert ("vllm:iteration_tokens_total", None) not in after["counters"]
    assert after["gauges"]["vllm:num_requests_running"] == 4


def test_reference_exposition_round_trips_through_the_parser():
    m = ReferenceMetrics(model_name="tiny", num_spec_tokens=3)
    before = {"t": 0.0, **parse_metrics(m.render().decode())}
    for accepted in (0, 1, 3, 2, 3):  # five verify steps, as observe_draft counts them
        m.observe_draft(accepted)
    m.observe_tokens(14, streaming=False)
    m.observe_request(prompt_tokens=6, finish_reason="length")
    m.set_batch(running=1, waiting=2, accept_length=2.8, accept_rate=0.6, throughput=9.0)
    text = m.render().decode()
    for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total",
                 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",'
                 'model_name="tiny",position="2"}', "vllm:num_requests_waiting",
                 'vllm:request_success_total{engine="0",finished_reason="length",'
                 'model_name="tiny"} 1.0', 'vllm:request_success_total{engine="0",'
                 'finished_reason="abort",model_name="tiny"} 0.0',
                 'vllm:prompt_tokens_total{engine="0",model_name="tiny"} 6.0',
                 "sglang:spec_accept_length", "sglang:spec_accept_rate",
                 "sglang:num_queue_reqs", "sglang:spec_verify_calls_total"):
        assert name in text
    w = window(before, {"t": 1.0, **parse_metrics(text)})
    assert (w["drafts"], w["draft_tokens"], w["accepted"]) == (5, 15, 9)
    # histogram of accepted counts [1, 1, 1, 2]: at least 1 -> 4/5, at least 2 -> 3/5, 3 -> 2/5
    assert w["per_position"] == pytest.approx([0.8, 0.6, 0.4])
    assert w["accept_length"] == pytest.approx(1 + 9 / 5)
    assert w["generation_tokens"] == 14 and w["tokens_per_s"] == 14
    assert (w["requests"], w["prompt_tokens"]) == (1, 6)
    assert w["sglang_accept_length"] == 2.8
    df = positions_frame([{**w, "t_end": 1.0}])
    assert list(df["position"]) == [1, 2, 3] and list(df["p_cumulative"]) == w["per_position"]


def test_sglang_gauges_only_and_a_plain_server():
    sglang = """# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="m",engine_type="unified",tp_rank="0"} 2.5
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{model_name="m",engine_type="unified",tp_rank="0"} 0.5
"""
    snap = {"t": 0.0, **parse_metrics(sglang)}
    w = window(snap, {**snap, "t": 1.0})
    assert w["source"] == "sglang" and w["accept_length"] == 2.5
    assert w["per_position"] == [] and w["drafts"] is None  # SGLang has no per-position
    plain = ReferenceMetrics(model_name="t", num_spec_tokens=0)  # no spec config: no counters
    assert "spec_decode" not in plain.render().decode()
    w = window(*[{"t": 0.0, **parse_metrics(plain.render().decode())}] * 2)
    assert w["source"] is None and math.isnan(w["accept_length"])
