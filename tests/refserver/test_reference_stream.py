"""The reference server against real clients: SGLang's own benchmark request function
(stream) and /metrics counting exactly what the requests report, on the real default target
with the shipped drafter (accepted, so the accepted counts compared are not all zero); the
OpenAI completions route as vLLM answers it, and /health and /metrics answering while a
request is being decoded, on a tiny random target with a speculative engine."""

import asyncio
import threading
import time
from pathlib import Path

import pytest

from eagle3lab.measure.client import http_json
from eagle3lab.measure.prometheus import scrape, window
from sglang_bench_client import load_sglang_client
from serverutil import reference_server


SHIPPED = Path(__file__).resolve().parents[2] / "data" / "drafters" / "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def shipped_spec_server(tmp_path_factory, default_target_dir):
    """A reference server: the real default target with the shipped drafter (3 steps),
    CPU, started by the launcher and its watchdog; stopped at the end."""
    with reference_server(tmp_path_factory, target=default_target_dir, draft=SHIPPED,
                          silence_s=120, wait_s=300) as h:
        yield h


@pytest.mark.real
def test_sglang_benchmark_client_streams_from_the_reference_server(shipped_spec_server,
                                                                   default_target_dir):
    from transformers import AutoTokenizer

    from eagle3lab.data.prompts import chat_prompt_ids

    tok = AutoTokenizer.from_pretrained(str(default_target_dir))
    ids = list(chat_prompt_ids(tok, "Name three primary colors and explain why."))
    url, n = shipped_spec_server.url, 16
    ns = load_sglang_client()
    inp = ns["RequestFuncInput"](prompt=ids, api_url=url + "/generate", prompt_len=len(ids),
                                 output_len=n, model="m", lora_name=None, image_data=None,
                                 extra_request_body={})
    before = scrape(url)
    out = asyncio.run(ns["async_request_sglang_generate"](inp))
    after = scrape(url)
    assert out.success, out.error
    assert out.output_len == n and out.ttft > 0 and 0 < len(out.itl) <= n - 1
    status, ref = http_json(url + "/generate", {
        "input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0.0,
                                              "ignore_eos": True}})
    assert status == 200 and out.generated_text == ref["text"]  # greedy: the same answer
    meta = ref["meta_info"]
    hist = meta["spec_accept_histogram"]
    accepted = sum(k * c for k, c in enumerate(hist))
    assert accepted > 0 and meta["spec_accept_length"] > 1.3, meta  # the drafter is accepted
    assert out.spec_accept_length == meta["spec_accept_length"]  # the last chunk's meta_info
    w = window(before, after)  # the streamed request alone
    assert w["source"] == "vllm" and w["drafts"] == meta["spec_verify_ct"]
    assert w["draft_tokens"] == 3 * meta["spec_verify_ct"]
    assert w["accepted"] == accepted
    assert w["per_position"] == pytest.approx(
        [sum(hist[k:]) / sum(hist) for k in range(1, 4)])
    assert w["per_position"][0] > 0
    assert w["generation_tokens"] == n


def test_openai_completions_return_the_same_token_ids(tiny_spec_server):
    """vLLM 0.25.1's `CompletionResponse` (vllm/entrypoints/openai/completion/protocol.py:
    520-562, sent whole by `model_dump()`): the ids INSIDE the choice, usage with
    prompt_tokens_details; a model not served is a 404 NotFoundError."""
    body = {"prompt": [7, 8, 9], "max_tokens": 5, "temperature": 0.0,
            "return_token_ids": True}
    status, resp = http_json(tiny_spec_server.url + "/v1/completions", body)
    assert status == 200, resp
    _, native = http_json(tiny_spec_server.url + "/generate", {
        "input_ids": [7, 8, 9], "sampling_params": {"max_new_tokens": 5, "temperature": 0.0}})
    ch = resp["choices"][0]
    assert ch["token_ids"] == native["output_ids"] and ch["prompt_token_ids"] == [7, 8, 9]
    assert set(ch) == {"index", "text", "logprobs", "finish_reason", "stop_reason",
                       "token_ids", "prompt_logprobs", "prompt_token_ids", "routed_experts"}
    assert ch["finish_reason"] == "length" and ch["stop_reason"] is None
    assert "prompt_token_ids" not in resp and resp["object"] == "text_completion"
    assert resp["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8,
                             "prompt_tokens_details": None}
    _, plain = http_json(tiny_spec_server.url + "/v1/completions",
                         {**body, "return_token_ids": False})
    assert plain["choices"][0]["token_ids"] is None
    status, models = http_json(tiny_spec_server.url + "/v1/models")
    assert models["data"][0]["root"] == tiny_spec_server.config.target
    status, err = http_json(tiny_spec_server.url + "/v1/completions", {**body, "model": "other"})
    assert status == 404 and err["error"]["type"] == "NotFoundError"
    assert "The model `other` does not exist." in err["error"]["message"]
    status, err = http_json(tiny_spec_server.url + "/v1/completions",
                            {**body, "stream_options": {"include_usage": True}})
    assert status == 400 and "stream=True" in err["error"]["message"]
    status, err = http_json(tiny_spec_server.url + "/generate", {
        "input_ids": [1], "lora_path": "adapter", "sampling_params": {}})
    assert status == 400 and "lora_path" in err["error"]["message"]


def _sse(url: str, body: dict) -> list:
    import json
    import urllib.request

    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        events = [x[6:] for x in r.read().decode().split("\n\n") if x.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(x) for x in events[:-1]]


def test_openai_stream_as_vllm_writes_it(tiny_spec_server):
    """vLLM 0.25.1's stream (vllm/entrypoints/openai/completion/serving.py:282-497): delta
    ids per chunk, the prompt's ids on the first chunk only, null ids without
    return_token_ids, and with include_usage a last chunk with no choices and the usage."""
    body = {"prompt": [7, 8, 9], "max_tokens": 5, "temperature": 0.0, "stream": True,
            "return_token_ids": True, "stream_options": {"include_usage": True}}
    chunks = _sse(tiny_spec_server.url, body)
    *parts, last = chunks
    assert last["choices"] == [] and last["usage"] == {
        "prompt_tokens": 3, "total_tokens": 8, "completion_tokens": 5}
    _, whole = http_json(tiny_spec_server.url + "/v1/completions", {
        k: v for k, v in body.items() if k not in ("stream", "stream_options")})
    ids = [i for c in parts for i in c["choices"][0]["token_ids"]]
    assert ids == whole["choices"][0]["token_ids"]
    assert parts[0]["choices"][0]["prompt_token_ids"] == [7, 8, 9]
    assert all(c["choices"][0]["prompt_token_ids"] is None for c in parts[1:])
    assert parts[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["text"] for c in parts) == whole["choices"][0]["text"]
    assert len({c["id"] for c in chunks}) == 1 and "usage" not in parts[0]
    plain = _sse(tiny_spec_server.url, {**body, "return_token_ids": False,
                                        "stream_options": {"include_usage": True,
                                                           "continuous_usage_stats": True}})
    assert all(c["choices"][0]["token_ids"] is None for c in plain[:-1])
    assert [c["usage"]["completion_tokens"] for c in plain][-1] == 5


def test_health_and_metrics_answer_while_requests_queue(tiny_spec_server):
    url = tiny_spec_server.url
    results = []

    def long_request():
        results.append(http_json(url + "/generate", {"input_ids": [3, 4, 5],
                       "sampling_params": {"max_new_tokens": 60, "temperature": 0.0,
                                           "ignore_eos": True}}))

    before = scrape(url)
    threads = [threading.Thread(target=long_request) for _ in range(3)]
    for t in threads:
        t.start()
    seen_queue, mid_request = 0.0, 0
    deadline = time.monotonic() + 60
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        snap = scrape(url)
        seen_queue = max(seen_queue, snap["gauges"].get("vllm:num_requests_waiting", 0))
        # decoded tokens that are not a whole number of requests: this answer came while
        # a request was half decoded (a /metrics that waited for the decode never sees one)
        mid_request += window(before, snap)["generation_tokens"] % 60 != 0
        status, _ = http_json(url + "/health", timeout_s=5)
        assert status == 200
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert [s for s, _ in results] == [200, 200, 200]
    assert [r["meta_info"]["completion_tokens"] for _, r in results] == [60, 60, 60]
    assert window(before, scrape(url))["generation_tokens"] == 180
    assert seen_queue >= 1  # requests waited in the queue, counted in /metrics
    assert mid_request >= 1  # /metrics answered during a decode, not after it
