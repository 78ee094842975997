"""`regenerate --server`: records through the reference server equal in-process greedy
regeneration token for token (both APIs); a wrong server is refused before anything is
written; a server that dies mid-run leaves a prefix that a re-run completes (never a
prompt twice); transient failures are retried and counted."""

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eagle3lab.data.regenerate import regenerate
from eagle3lab.errors import UserError

KW = dict(prompts="eval", limit=5, max_new_tokens=12, temperature=0.0, progress=False)


@pytest.fixture(scope="module")
def in_process(tmp_path_factory, tiny_target_dir):
    out = tmp_path_factory.mktemp("regen") / "in_process.jsonl"
    regenerate(target=str(tiny_target_dir), out=out, batch_size=1, device="cpu", **KW)
    return out


def _records(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


class FlakyProxy:
    """Forwards to a server; `fail` decides per generation request (0-based) whether to
    answer 503 instead; `dead_after` N generation requests, every later one fails."""

    def __init__(self, upstream, *, fail=lambda n: False, dead_after=None):
        self.n = 0
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _forward(self, body=None):
                if body is not None:
                    n, outer.n = outer.n, outer.n + 1
                    if fail(n) or (dead_after is not None and n >= dead_after):
                        self.send_response(503)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                req = urllib.request.Request(upstream + self.path, data=body,
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=60) as r:
                        code, data = r.status, r.read()
                except urllib.error.HTTPError as e:
                    code, data = e.code, e.read()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._forward()

            def do_POST(self):
                self._forward(self.rfile.read(int(self.headers["Content-Length"])))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("api", ["sglang", "openai"])
def test_server_records_equal_in_process_ones(tmp_path, tiny_target_dir, tiny_spec_server,
                                              in_process, api):
    out = tmp_path / "server.jsonl"
    s = regenerate(target=str(tiny_target_dir), out=out, server=tiny_spec_server.url,
                   api=api, concurrency=3, **KW)
    assert s["new_records"] == 5
    assert _records(out) == _records(in_process)  # ids, masks, text: token for token
    meta = json.loads((tmp_path / "server.jsonl.meta.json").read_text())
    old = json.loads(in_process.with_name(in_process.name + ".meta.json").read_text())
    assert meta["params"] == old["params"]  # the same kind of file: either may resume it
    assert meta["server"]["api"] == api and meta["server"]["failed"] == 0


def test_a_wrong_server_is_refused_before_writing(tmp_path, tiny_target_dir, tiny_spec_server):
    out = tmp_path / "x.jsonl"
    with pytest.raises(UserError, match="not the target"):
        regenerate(target=str(tiny_target_dir), out=out, server=tiny_spec_server.url,
                   server_model="Llama-3.1-8B-Instruct", **KW)
    assert not out.exists()


def test_killed_mid_run_then_resumed_and_retries_counted(tmp_path, tiny_target_dir,
                                                         tiny_spec_server, in_process,
                                                         monkeypatch):
    from eagle3lab.data import remote

    class QuickBackoff(remote.ServerGenerator):  # 0.05 s instead of 1 s before a retry
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.backoff_s = 0.05

    monkeypatch.setattr(remote, "ServerGenerator", QuickBackoff)
    out = tmp_path / "resumed.jsonl"
    dying = FlakyProxy(tiny_spec_server.url, dead_after=3)
    try:
        with pytest.raises(UserError, match="re-run the same command to resume"):
            regenerate(target=str(tiny_target_dir), out=out, server=dying.url,
                       concurrency=1, retries=1, **KW)
    finally:
        dying.close()
    first = _records(out)
    assert first == _records(in_process)[:3]  # a prefix, in the prompts' order
    flaky = FlakyProxy(tiny_spec_server.url, fail=lambda n: n % 2 == 0)  # every other fails
    try:
        s = regenerate(target=str(tiny_target_dir), out=out, server=flaky.url,
                       concurrency=2, retries=2, **KW)
    finally:
        flaky.close()
    assert s["new_records"] == 2 and s["records"] == 5
    assert _records(out) == _records(in_process)  # completed, never a prompt twice
    meta = json.loads((tmp_path / "resumed.jsonl.meta.json").read_text())
    assert meta["server"]["retries"] >= 2 and meta["server"]["failed"] == 0


def test_self_prompt_through_the_server_is_seeded_and_not_mixed(tmp_path, tiny_target_dir,
                                                                 tiny_spec_server):
    """The tiny random target rarely ends a user turn, so most samples are dropped as
    unfinished: what is tested is the plumbing (every row of every batch sampled through
    the server, per-row seeds: a second run writes the same file), and that a file
    sampled through a server is not continued in-process (another sampler)."""
    from eagle3lab.data.selfprompt import synthesize_prompts

    kw = dict(target=str(tiny_target_dir), n=3, batch_size=3, max_batches=2,
              max_new_tokens=8, temperature=1.0, exclude=None, progress=False,
              server=tiny_spec_server.url, concurrency=3)
    a = synthesize_prompts(out=tmp_path / "a.jsonl", **kw)
    b = synthesize_prompts(out=tmp_path / "b.jsonl", **kw)
    assert a["counts"]["sampled"] == b["counts"]["sampled"] > 0
    assert a["counts"] == b["counts"] and a["batches"] == 2
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()
    meta = json.loads((tmp_path / "a.jsonl.meta.json").read_text())
    assert meta["params"]["sampler"] == "server"
    with pytest.raises(UserError, match="sampler"):
        synthesize_prompts(out=tmp_path / "a.jsonl", **{**kw, "server": None,
                                                        "device": "cpu", "max_batches": 3})
