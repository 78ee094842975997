"""The data stages' server client against answers in vLLM 0.25.1's `/v1/completions` shape
(vllm/entrypoints/openai/completion/protocol.py:520-562, serving.py:499-643) and SGLang's
`/generate`: the request fields, the ids read from inside the choice (stop token
included), and an answer the server cut short (finish reason `abort`) retried, never
written."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eagle3lab.data.remote import CutShort, ServerGenerator
from eagle3lab.errors import UserError

SP = {"max_new_tokens": 4, "temperature": 0.0, "top_p": 1.0, "seed": 0,
      "stop_token_ids": [2]}


def completion(ids, finish, prompt=(1, 2, 3)):
    """A non-streamed vLLM 0.25.1 response, as `model_dump()` writes it."""
    return {"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "text": "...", "logprobs": None,
                         "finish_reason": finish, "stop_reason": None, "token_ids": ids,
                         "prompt_logprobs": None, "prompt_token_ids": list(prompt),
                         "routed_experts": None}],
            "service_tier": None, "system_fingerprint": None,
            "usage": {"prompt_tokens": 3, "total_tokens": 3 + len(ids),
                      "completion_tokens": len(ids), "prompt_tokens_details": None},
            "kv_transfer_params": None, "metrics": None}


def test_request_fields_and_answers_of_both_apis():
    gen = ServerGenerator("http://x", api="openai")
    gen.model = "m"
    path, body = gen._body([1, 2, 3], SP)
    assert path == "/v1/completions" and body == {
        "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0.0, "stop_token_ids": [2],
        "return_token_ids": True, "skip_special_tokens": True, "model": "m"}
    assert gen._answer(completion([5, 6, 2], "stop")) == ([5, 6, 2], "stop")
    assert gen._answer(completion([5, 6, 7, 8], "length")) == ([5, 6, 7, 8], "length")
    with pytest.raises(CutShort, match="'abort' after 1 tokens"):
        gen._answer(completion([5], "abort"))
    no_ids = completion([5], "stop")
    no_ids["choices"][0]["token_ids"] = None
    with pytest.raises(UserError, match="return_token_ids"):
        gen._answer(no_ids)
    sg = ServerGenerator("http://x", api="sglang")
    assert sg._answer({"output_ids": [5, 6], "meta_info": {"finish_reason": {
        "type": "stop", "matched": 2}}}) == ([5, 6, 2], "stop")
    with pytest.raises(CutShort):
        sg._answer({"output_ids": [5], "meta_info": {"finish_reason": {
            "type": "abort", "message": "shutting down"}}})


def test_an_aborted_answer_is_retried_not_written():
    calls = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            calls.append(1)
            data = json.dumps(completion([5] if len(calls) == 1 else [5, 6, 2],
                                         "abort" if len(calls) == 1 else "stop")).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    written = []
    try:
        gen = ServerGenerator(f"http://127.0.0.1:{httpd.server_address[1]}", api="openai",
                              concurrency=1, retries=2, backoff_s=0.01)
        gen.generate_ordered([("p0", [1, 2, 3], SP)],
                             lambda i, ids, finish: written.append((i, ids, finish)))
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert written == [(0, [5, 6, 2], "stop")]
    assert gen.stats == {"requests": 2, "retries": 1, "failed": 0}
