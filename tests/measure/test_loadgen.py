"""The concurrent benchmark client against the reference server (tiny target, speculative
engine): every level sends the same requests with N in flight over both APIs, reports
throughput, TTFT, ITL and accept length, and the /metrics window of each level counts
exactly the verify steps its requests report."""

import math

from eagle3lab.measure.loadgen import summarize_level, sweep


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


def test_openai_request_fields_and_a_canned_vllm_stream():
    """The OpenAI body as vLLM 0.25.1 takes it (stream_options only with stream:
    vllm/entrypoints/openai/completion/protocol.py:470-479), and a stream in vLLM's shape
    (serving.py:282-497: delta token_ids, a ping comment, the usage chunk with no choices,
    an error chunk) read by the client: tokens from usage, the error as a failed row."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from eagle3lab.measure.loadgen import _payload, run_level

    _, streamed = _payload("openai", {"input_ids": [1, 2]}, max_new_tokens=3,
                           temperature=0.0, stream=True, model="m")
    assert streamed == {"prompt": [1, 2], "max_tokens": 3, "temperature": 0.0,
                        "ignore_eos": True, "stream": True, "return_token_ids": True,
                        "stream_options": {"include_usage": True}, "model": "m"}
    _, whole = _payload("openai", {"input_ids": [1, 2]}, max_new_tokens=3, temperature=0.0,
                        stream=False, model=None)
    assert "stream_options" not in whole and "model" not in whole

    def choice(ids, text, finish=None, prompt=None):
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                "stop_reason": None, "prompt_token_ids": prompt, "token_ids": ids}

    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}
    good = [{**head, "choices": [choice([5], "a", prompt=[1, 2])]},
            {**head, "choices": [choice([6, 7], "bc", "length")]},
            {**head, "choices": [], "usage": {"prompt_tokens": 2, "total_tokens": 5,
                                              "completion_tokens": 3}}]
    bad = [{**head, "choices": [choice([5], "a")]},
           {"error": {"message": "EngineCore encountered an issue.", "type":
                      "InternalServerError", "param": None, "code": 500}}]

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            events = bad if body["prompt"] == [9] else good
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b": ping\n\n")
            for e in events:
                self.wfile.write(f"data: {json.dumps(e)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        rows, s = run_level(f"http://127.0.0.1:{httpd.server_address[1]}",
                            [{"prompt_id": "ok", "input_ids": [1, 2]},
                             {"prompt_id": "dead", "input_ids": [9]}],
                            concurrency=2, api="openai", max_new_tokens=3, metrics=False)
    finally:
        httpd.shutdown()
        httpd.server_close()
    ok, dead = rows
    assert ok["ok"] and ok["completion_tokens"] == 3 and len(ok["itl"]) == 2
    assert not dead["ok"] and "EngineCore encountered an issue" in dead["error"]
    assert s["failed"] == 1 and s["completion_tokens"] == 3
