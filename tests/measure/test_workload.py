"""The benchmark's requests against a stub of SGLang's native API (0.5.23 field names):
raw counts per request, the server's info, an error answer named by its prompt."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eagle3lab.errors import UserError
from eagle3lab.measure.client import http_json, server_info
from eagle3lab.measure.tables import summarize
from eagle3lab.measure.workload import build_requests, run_requests

# Per prompt: completion tokens, verify steps, histogram (H[n] = steps accepting n drafts).
SPEC = {"a": (10, 4, [1, 1, 1, 1]), "b": (6, 4, [2, 2, 0, 0])}


class StubSGLang(BaseHTTPRequestHandler):
    """Answers like SGLang 0.5.23 with speculation (spec_correct_drafts_histogram)."""

    def log_message(self, *a):
        pass

    def _send(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/get_server_info":
            self._send({"internal_states": [{"avg_spec_accept_length": 2.0}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["sampling_params"] == {"max_new_tokens": 16, "temperature": 0.0}
        if body["text"] == "bad":  # an error page, not JSON
            data = b"Internal Server Error: scheduler died"
            self.send_response(500)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        n, verify, hist = SPEC[body["text"]]
        self._send({"text": "x" * n, "output_ids": list(range(n)), "meta_info": {
            "id": "r", "finish_reason": {"type": "length", "length": n},
            "prompt_tokens": 3, "completion_tokens": n, "spec_verify_ct": verify,
            "spec_accept_length": n / verify, "spec_accept_rate": 0.5,
            "spec_correct_drafts_histogram": hist}})


@pytest.fixture
def stub_url():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), StubSGLang)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_client_against_sglang_shaped_server(stub_url):
    df = run_requests(stub_url, build_requests(["a", "b"]), arm="eagle3",
                      max_new_tokens=16)
    assert list(df["prompt_id"]) == ["p0", "p1"]
    assert list(df["completion_tokens"]) == [10, 6]
    assert list(df["spec_verify_ct"]) == [4, 4]
    assert list(df["accept_length"]) == [2.5, 1.5]
    assert df["accept_histogram"].iloc[1] == [2, 2, 0, 0]
    assert (df["latency_s"] > 0).all() and df["finish_reason"].iloc[0] == "length"
    info = server_info(stub_url)
    summary = summarize(df, infos={"eagle3": info}, baseline="eagle3")
    row = summary.iloc[0]
    assert row["accept_length"] == 2.0  # (10 + 6) / (4 + 4): ratio of sums, not mean of ratios
    assert row["server_avg_accept_length"] == 2.0 and row["speedup"] == 1.0


def test_an_error_answer_is_named_by_its_prompt(stub_url):
    status, text = http_json(stub_url + "/generate", {"text": "bad", "sampling_params": {
        "max_new_tokens": 16, "temperature": 0.0}})
    assert (status, text) == (500, "Internal Server Error: scheduler died")
    with pytest.raises(UserError, match=r"answered 500 for prompt 'p1': Internal Server Error"):
        run_requests(stub_url, build_requests(["a", "bad"]), arm="x", max_new_tokens=16)


def test_server_info_is_none_when_nothing_answers():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert server_info(f"http://127.0.0.1:{port}") is None
