"""The reference server as a live process on the real default target: a healthy start seen
by the watchdog, the benchmark client, SGLang-format logs, a clean stop, no orphans."""

import pytest

from eagle3lab.engines.argv import LaunchConfig
from eagle3lab.measure.client import http_json, server_info
from eagle3lab.measure.workload import build_requests, run_requests
from eagle3lab.serverlogs.analyzer import analyse_log
from eagle3lab.serving import process
from eagle3lab.serving.launch import start


@pytest.mark.real
@pytest.mark.slow
def test_reference_server_start_bench_stop(tmp_path, default_target_dir, no_orphans):
    from transformers import AutoTokenizer

    cfg = LaunchConfig(engine="reference", target=str(default_target_dir), port=0,
                       device="cpu")
    h = start(cfg, run_dir=tmp_path / "run", name="baseline")
    try:
        st = h.watchdog(silence_s=60, poll_s=0.3).wait(180)
        assert st["verdict"] == "ready", st
        assert h.notes == []  # loopback: nothing to warn about
        events = [e["event"] for e in st["events"]]
        assert "phase load-weights" in events and "phase weights-loaded" in events

        tok = AutoTokenizer.from_pretrained(default_target_dir)
        reqs = build_requests(["What is 2+2?", "Name a colour."], tokenizer=tok)
        df = run_requests(h.url, reqs, arm="baseline", max_new_tokens=5)
        assert list(df["completion_tokens"]) == [5, 5]
        assert df["spec_verify_ct"].isna().all()  # plain decoding: no spec fields, as SGLang

        status, resp = http_json(h.url + "/generate", {
            "text": ["Hi", "Bye"], "sampling_params": {"max_new_tokens": 2,
                                                       "temperature": 0.0}})
        assert status == 200 and len(resp) == 2
        assert resp[0]["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
        assert set(resp[0]["meta_info"]) >= {"completion_tokens", "prompt_tokens",
                                             "e2e_latency", "id"}
        status, err = http_json(h.url + "/generate", {"text": "x", "sampling_params": {
            "max_new_tokens": 2, "top_k": 5}})
        assert status == 400 and "top_k" in err["error"]["message"]

        info = server_info(h.url)
        assert info["speculative_algorithm"] is None and info["production"] is False
    finally:
        rep = h.stop()
    assert rep["signals"] == ["SIGTERM"] and rep["returncode"] == 0
    assert not process.group_members(h.pgid)

    r = analyse_log(h.log_path)  # the log ends in the server's shutdown: exited
    assert r["verdict"] == "exited" and r["crash"] is None
    assert [p["phase"] for p in r["phases"]] == ["launch", "load-weights", "weights-loaded",
                                                 "http-server", "ready", "shutdown"]
    assert r["shutdown"]["marker"] == "Received SIGTERM; shutting down."
    assert r["shutdown"]["ready_before"] and r["stop"]["signals"] == ["SIGTERM"]
    assert len(r["decode"]) == 1 + 2 + 2  # warm-up, two bench requests, one batch of two
    assert all(d["accept_len"] is None and d["gen_throughput"] > 0 for d in r["decode"])
    assert "Shutdown complete." in h.log_path.read_text()


def test_speculative_without_a_draft_or_a_default_is_a_clear_error(capsys):
    from eagle3lab.cli import main

    rc = main(["serve", "--target", "/some/hf-target", "--speculative", "--port", "1"])
    err = capsys.readouterr().err
    assert rc == 1 and "No drafter given (--draft)" in err


@pytest.mark.real
@pytest.mark.slow
def test_speculative_serves_the_default_drafter(tmp_path, default_target_dir, no_orphans):
    """`eagle3lab serve --speculative` (no --draft) serves the shipped default drafter."""
    from eagle3lab.workdir import default_drafter

    cfg = LaunchConfig(engine="reference", target="smollm2-135m-instruct", port=0,
                       device="cpu", extra_args=["--speculative"])
    h = start(cfg, run_dir=tmp_path / "run", name="speculative")
    try:
        st = h.watchdog(silence_s=60, poll_s=0.3).wait(180)
        assert st["verdict"] == "ready", st
        info = server_info(h.url)
        assert info["speculative_algorithm"] == "EAGLE3"
        assert info["speculative_draft_model_path"] == default_drafter()
        assert info["speculative_num_draft_tokens"] == 4  # steps 3 + 1, as for --draft
    finally:
        h.stop()


def test_a_client_that_left_is_one_line_not_a_crash(tmp_path):
    """A /health probe that timed out (a busy machine) leaves the server a broken pipe;
    socketserver would print a traceback, which the log reader takes for a crash (seen on
    a 2-core machine with five reference servers: the watchdog stopped a healthy one)."""
    import logging
    from http.server import BaseHTTPRequestHandler

    from eagle3lab.refserver.server import Httpd
    from eagle3lab.serverlogs.analyzer import analyse_log

    log_path = tmp_path / "server.log"
    log = logging.getLogger("test-httpd")
    handler = logging.FileHandler(log_path)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    httpd = Httpd(("127.0.0.1", 0), BaseHTTPRequestHandler, log=log)
    try:
        try:
            raise BrokenPipeError(32, "Broken pipe")
        except BrokenPipeError:
            httpd.handle_error(None, ("127.0.0.1", 4242))
    finally:
        httpd.server_close()
        handler.close()
        log.removeHandler(handler)
    text = log_path.read_text()
    assert text.strip() == ("127.0.0.1:4242 went away before its answer was sent "
                            "(BrokenPipeError).")
    assert analyse_log(log_path, silence_s=1e9)["crash"] is None
