"""The reference server against real clients, on a tiny random target with a speculative
engine: SGLang's own benchmark request function (stream), the OpenAI completions route as
vLLM answers it, /metrics counting exactly what the requests report, and /health and
/metrics answering while a request is being decoded."""

import asyncio
import threading
import time

import pytest

from eagle3lab.server.client import http_json
from eagle3lab.server.metrics import scrape, window
from sglang_bench_client import load_sglang_client


def test_sglang_benchmark_client_streams_from_the_reference_server(tiny_spec_server):
    ns = load_sglang_client()
    inp = ns["RequestFuncInput"](prompt=[1, 2, 3, 4, 5], api_url=tiny_spec_server.url + "/generate",
                                 prompt_len=5, output_len=7, model="m", lora_name=None,
                                 image_data=None, extra_request_body={})
    before = scrape(tiny_spec_server.url)
    out = asyncio.run(ns["async_request_sglang_generate"](inp))
    after = scrape(tiny_spec_server.url)
    assert out.success, out.error
    assert out.output_len == 7 and out.ttft > 0 and len(out.itl) == 6
    assert out.spec_accept_length >= 1.0  # from the last chunk's meta_info
    status, ref = http_json(tiny_spec_server.url + "/generate", {
        "input_ids": [1, 2, 3, 4, 5], "sampling_params": {"max_new_tokens": 7,
                                                          "temperature": 0.0}})
    assert status == 200 and out.generated_text == ref["text"]  # greedy: the same answer
    w = window(before, after)  # the streamed request alone
    meta = ref["meta_info"]
    assert w["source"] == "vllm" and w["drafts"] == meta["spec_verify_ct"]
    assert w["draft_tokens"] == 3 * meta["spec_verify_ct"]
    hist = meta["spec_accept_histogram"]
    assert w["accepted"] == sum(k * c for k, c in enumerate(hist))
    assert w["per_position"] == pytest.approx(
        [sum(hist[k:]) / sum(hist) for k in range(1, 4)])
    assert w["generation_tokens"] == 7


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

    threads = [threading.Thread(target=long_request) for _ in range(3)]
    for t in threads:
        t.start()
    seen_queue, probes = 0.0, []
    deadline = time.monotonic() + 60
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        t0 = time.perf_counter()
        snap = scrape(url)
        probes.append(time.perf_counter() - t0)
        seen_queue = max(seen_queue, snap["gauges"].get("vllm:num_requests_waiting", 0))
        status, _ = http_json(url + "/health", timeout_s=5)
        assert status == 200
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert [s for s, _ in results] == [200, 200, 200]
    assert [r["meta_info"]["completion_tokens"] for _, r in results] == [60, 60, 60]
    assert seen_queue >= 1  # requests waited in the queue, counted in /metrics
    assert max(probes) < 2.0  # /metrics never waited for a decode
