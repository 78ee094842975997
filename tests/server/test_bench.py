"""The benchmark client against a stub of SGLang's native API (0.5.23 field names), and the
table arithmetic: ratios of summed raw counts, per-position acceptance from histograms."""

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest

from eagle3lab.server.bench import (build_requests, decode_over_time, per_position,
                                    run_requests, server_info, summarize)

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


def test_decode_over_time(tmp_path):
    log = tmp_path / "s.log"
    log.write_text(
        "[2025-01-01 12:00:30 TP0] Decode batch, #running-req: 1, #token: 300, token usage: "
        "0.00, accept len: 3.21, accept rate: 0.55, cuda graph: True, gen throughput "
        "(token/s): 312.45, #queue-req: 0, \n"
        "[2025-01-01 12:00:34 TP0] Decode batch, #running-req: 1, #token: 340, token usage: "
        "0.00, accept len: 2.00, cuda graph: True, gen throughput (token/s): 200.00, "
        "#queue-req: 0\n")
    df = decode_over_time(log, "eagle3")
    assert list(df["t_s"]) == [0.0, 4.0] and list(df["accept_len"]) == [3.21, 2.0]
    assert list(df["arm"]) == ["eagle3", "eagle3"]
