"""vLLM as a live engine: the exact `vllm serve` command (parsed back by the preflight's
vLLM parser), and vLLM's log lines (each message built with the format string of the vLLM
source line that prints it, stamped with vLLM's logger format) read into the same phases,
verdicts, decode table and findings as SGLang's; a fake `vllm` process under the watchdog."""

import json
import logging
import os
import sys
import textwrap

import pytest

from eagle3lab.engines.argv import LaunchConfig
from eagle3lab.errors import UserError
from eagle3lab.preflight.command import parse_command
from eagle3lab.serverlogs.analyzer import analyse_log, decode_over_time
from eagle3lab.serving.launch import start

#: vllm/logger.py: _FORMAT and _DATE_FORMAT (v0.10+, `fileinfo` = the file name).
FORMATTER = logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] "
                              "%(message)s", datefmt="%m-%d %H:%M:%S")
#: vllm/v1/spec_decode/metrics.py SpecDecodingLogging.log
SPEC_FMT = ("SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f "
            "tokens/s, Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d "
            "tokens, Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%")
#: vllm/v1/metrics/loggers.py LoggingStatLogger.log
STATS_FMT = ("Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: "
             "%.1f tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, "
             "Prefix cache hit rate: %.1f%%")


def line(proc: str, msg: str, *args, file="api_server.py", lineno=1, level=logging.INFO,
         clock="06:01:05") -> str:
    rec = logging.LogRecord("vllm", level, file, lineno, msg, args, None)
    rec.created = __import__("datetime").datetime.strptime(
        f"2025-12-18 {clock}", "%Y-%m-%d %H:%M:%S").timestamp()
    rec.msecs = 0
    return f"({proc} pid=4242) " + FORMATTER.format(rec)


def startup() -> list[str]:
    e, a = "EngineCore_DP0", "APIServer"
    return [
        line(a, "vLLM API server version %s", "0.11.0", lineno=1839, clock="06:00:00"),
        line(a, "non-default args: %s", {"model": "m"}, file="utils.py", clock="06:00:00"),
        line(e, "Starting to load model %s...", "m", file="gpu_model_runner.py",
             clock="06:00:04"),
        line(e, "Model loading took %.4f GiB and %.6f seconds", 14.002, 5.929,
             file="gpu_model_runner.py", clock="06:00:10"),
        line(e, "Dynamo bytecode transform time: %.2f s", 4.39, file="backends.py",
             clock="06:00:15"),
        line(e, "GPU KV cache size: %s tokens", "1,661,008", file="kv_cache_utils.py",
             clock="06:00:55"),
        line(e, "Graph capturing finished in %.0f secs, took %.2f GiB", 7, 0.32,
             file="gpu_model_runner.py", clock="06:01:02"),
        line(e, "init engine (profile, create kv cache, warmup model) took %.2f seconds",
             52.14, file="core.py", clock="06:01:03"),
        line(a, "Starting vLLM API server %d on %s", 0, "http://0.0.0.0:8080", lineno=1945),
        "INFO:     Started server process [4242]",
        "INFO:     Application startup complete.",
    ]


def decode(mean: float, rates: list[float], clock: str) -> list[str]:
    acc, drafts = 300, 100
    return [line("APIServer", STATS_FMT, 0, 12.0, 480.5, 4, 1, 3.2, 0.0, file="loggers.py",
                 clock=clock),
            line("APIServer", SPEC_FMT, mean, 30.0, 45.0, acc, 3 * drafts,
                 ", ".join(f"{p:.3f}" for p in rates), 100 * (mean - 1) / 3,
                 file="metrics.py", clock=clock)]


def test_vllm_serve_command_is_exact_and_parses_back():
    cfg = LaunchConfig(engine="vllm", target="/m/Llama-3.1-8B", draft="/d/eagle3", steps=3,
                       tp=2, cuda_graph=False, max_running_requests=16, port=8000,
                       python="/venv/bin/python")
    argv = cfg.to_argv()
    assert argv == ["/venv/bin/python", "-m", "vllm.entrypoints.cli.main", "serve",
                    "/m/Llama-3.1-8B", "--host", "127.0.0.1",
                    "--port", "8000", "--tensor-parallel-size", "2", "--speculative-config",
                    json.dumps({"method": "eagle3", "model": "/d/eagle3",
                                "num_speculative_tokens": 3}),
                    "--enforce-eager", "--max-num-seqs", "16"]
    spec = parse_command(argv)
    assert (spec.engine, spec.target, spec.draft, spec.steps, spec.tp) == (
        "vllm", "/m/Llama-3.1-8B", "/d/eagle3", 3, 2)
    assert spec.algorithm == "eagle3"
    assert "--enforce-eager" in spec.unknown  # flags the preflight does not judge
    with pytest.raises(UserError, match="topk=2 with engine vllm"):
        LaunchConfig(engine="vllm", target="t", draft="d", topk=2, draft_tokens=8)


def test_a_vllm_log_reads_like_an_sglang_one(tmp_path):
    path = tmp_path / "vllm.log"
    path.write_text("\n".join(startup() + decode(2.95, [0.85, 0.65, 0.45], "06:01:15")
                              + decode(2.70, [0.80, 0.58, 0.32], "06:01:25")
                              + ["some line no parser knows"]) + "\n")
    r = analyse_log(path, silence_s=1e9)
    assert r["format"] == "vllm" and r["verdict"] == "ready" and r["crash"] is None
    assert [p["phase"] for p in r["phases"]] == [
        "launch", "load-weights", "weights-loaded", "cuda-graph-capture", "kv-cache",
        "cuda-graph-captured", "http-server", "ready"]
    assert r["lines"] == len(startup()) + 5  # the unknown line is kept (counted)
    assert len(r["decode"]) == 2  # stats + SpecDecoding merged into one row each
    d = r["decode"][0]
    assert (d["accept_len"], d["per_position"], d["accepted"], d["drafted"]) == (
        2.95, [0.85, 0.65, 0.45], 300, 300)
    assert d["accept_rate"] == pytest.approx(0.65)
    assert (d["running_req"], d["queue_req"], d["gen_throughput"]) == (4, 1, 480.5)
    assert d["token_usage"] == pytest.approx(0.032) and "APIServer" in d["tags"]
    assert r["speculative"] and not [f for f in r["findings"] if f["severity"] == "error"]
    df = decode_over_time(path, "speculative")
    assert list(df["t_s"]) == [0.0, 10.0] and list(df["accept_len"]) == [2.95, 2.70]


def test_vllm_acceptance_collapse_crash_and_hang(tmp_path):
    collapsed = tmp_path / "collapsed.log"
    collapsed.write_text("\n".join(startup() + decode(1.00, [0.0, 0.0, 0.0], "06:01:15")))
    r = analyse_log(collapsed, silence_s=1e9)
    f = {x["code"]: x for x in r["findings"]}
    assert "acceptance-collapse" in f and "--engine vllm" in f["acceptance-collapse"]["message"]

    crashed = tmp_path / "crashed.log"
    crashed.write_text("\n".join(startup()[:4] + [
        line("EngineCore_DP0", "EngineCore failed to start.", file="core.py",
             level=logging.ERROR),
        "(EngineCore_DP0 pid=4242) Traceback (most recent call last):",
        "(EngineCore_DP0 pid=4242) torch.OutOfMemoryError: CUDA out of memory."]))
    r = analyse_log(crashed)
    assert r["verdict"] == "crashed" and "EngineCore failed to start" in r["crash"]["marker"]

    hung = tmp_path / "hung.log"
    hung.write_text("\n".join(startup()[:5]))
    import datetime as dt
    r = analyse_log(hung, now=dt.datetime(dt.datetime.now().year, 12, 18, 6, 10),
                    silence_s=120)
    assert r["verdict"] == "hung" and r["phase"] == "cuda-graph-capture"
    assert any(x["code"] == "startup-hung" for x in r["findings"])


def test_a_vllm_process_under_the_watchdog(tmp_path, no_orphans):
    """A stand-in `vllm.entrypoints.cli.main` module (the `vllm` script's module, which the
    launcher runs with its interpreter): it prints vLLM's start-up and decode lines, then
    serves nothing and waits; the launcher starts it with the exact argv in its own group,
    the watchdog reads it to ready, stop() ends it."""
    pkg = tmp_path / "fake" / "vllm" / "entrypoints" / "cli"
    pkg.mkdir(parents=True)
    for d in (pkg, pkg.parent, pkg.parent.parent):
        (d / "__init__.py").write_text("")
    lines = startup() + decode(2.5, [0.7, 0.5, 0.3], "06:01:15")
    (pkg / "main.py").write_text(textwrap.dedent(f"""
        import sys, time
        assert sys.argv[1] == "serve", sys.argv
        for ln in {lines!r}:
            print(ln, flush=True)
        time.sleep(600)
        """))
    cfg = LaunchConfig(engine="vllm", target="/m/t", draft="/d/e", steps=3, port=0,
                       python=sys.executable,
                       env={"PYTHONPATH": str(tmp_path / "fake")})
    h = start(cfg, run_dir=tmp_path / "run", name="vllm", check=False)
    try:
        st = h.watchdog(silence_s=30, poll_s=0.1).wait(30)
        assert st["verdict"] == "ready" and st["phase"] == "ready", st
        assert h.argv[:5] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve",
                              "/m/t"]
    finally:
        rep = h.stop(grace_s=5)
    assert rep["signals"] == ["SIGTERM"]
    r = analyse_log(h.log_path)
    assert r["format"] == "vllm" and r["decode"][0]["per_position"] == [0.7, 0.5, 0.3]
    assert r["verdict"] == "exited"  # the launcher's stop line ends the log
    assert os.path.exists(tmp_path / "run" / "vllm.launch.json")


def test_eagle3lab_serve_engine_vllm_watches_to_ready_and_stops_on_sigterm(tmp_path,
                                                                        no_orphans):
    """`eagle3lab serve --engine vllm`: preflight, the launcher and the watchdog from the
    command line, with the stand-in vLLM module: ready is printed, SIGTERM stops the group,
    the log reads `exited`; a launch preflight refuses is refused with its table."""
    import signal
    import subprocess
    import time

    pkg = tmp_path / "fake" / "vllm" / "entrypoints" / "cli"
    pkg.mkdir(parents=True)
    for d in (pkg, pkg.parent, pkg.parent.parent):
        (d / "__init__.py").write_text("")
    (pkg / "main.py").write_text(textwrap.dedent(f"""
        import sys, time
        assert sys.argv[1:3] == ["serve", {str(tmp_path / "t")!r}], sys.argv
        assert sys.argv[-2:] == ["--dtype", "bfloat16"], sys.argv
        for ln in {startup()!r}:
            print(ln, flush=True)
        time.sleep(600)
        """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"),
                                                        os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "eagle3lab", "serve", "--engine", "vllm", "--target",
            str(tmp_path / "t"), "--port", "0", "--run-dir", str(tmp_path / "run"), "--",
            "--dtype", "bfloat16"]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env)
    out = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out.append(p.stdout.readline())
        if "is ready at http://127.0.0.1:" in out[-1]:
            break
    else:
        p.kill()
        raise AssertionError("".join(out))
    p.send_signal(signal.SIGTERM)
    rest, _ = p.communicate(timeout=60)
    assert p.returncode == 0, "".join(out) + rest
    assert "stopped (SIGTERM); log verdict exited" in rest
    assert "python" in out[0] and "-m vllm.entrypoints.cli.main serve" in out[0]

    r = subprocess.run(argv[:-3] + ["--draft", "/tmp/nope-eagle3lab", "--", "--dtype",
                                    "bfloat16"], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "preflight refuses this launch" in r.stderr
    assert "model-path" in r.stderr
