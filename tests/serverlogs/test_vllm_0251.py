"""vLLM 0.25.1's log, as `vllm serve T --speculative-config '{"method": "eagle3", ...}'`
writes it: every message built from the format string of the 0.25.1 source line that
prints it (cited per line), stamped and decorated as vllm/logger.py, vllm/logging_utils/
formatter.py and vllm/utils/system_utils.py do; read into phases, the facts a start
proves (version, drafter loaded, aux layers), decode rows, and a final `exited` verdict
when the log ends in the server's shutdown or eagle3lab's stop line (SGLang's too)."""

import datetime as dt
import logging
import math
import signal

import pytest

from eagle3lab.cli import main
from eagle3lab.serverlogs.analyzer import analyse_log, parse_line
from eagle3lab.serving import process
from eagle3lab.serving.launch import start_command

#: vllm/logger.py:22-26 (_FORMAT without VLLM_LOGGING_PREFIX, _DATE_FORMAT).
FMT = logging.Formatter("%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s",
                        datefmt="%m-%d %H:%M:%S")
PIDS = {"APIServer": 100, "EngineCore": 200}
A, E = "APIServer", "EngineCore"


def vlog(proc, msg, *args, file, lineno=1, level=logging.INFO, clock="06:00:00"):
    """The file lines one vLLM log call writes: the stamp, each further line of a
    multi-line message re-stamped after `\\r\\n` (vllm/logging_utils/formatter.py:71-75),
    each line behind the process prefix (vllm/utils/system_utils.py:201-234)."""
    rec = logging.LogRecord("vllm", level, file, lineno, msg, args, None)
    rec.created = dt.datetime.strptime(f"2025-12-18 {clock}", "%Y-%m-%d %H:%M:%S").timestamp()
    rec.msecs = 0
    rec.fileinfo = file
    out = FMT.format(rec)
    if rec.message:
        out = out.replace("\n", "\r\n" + out.split(rec.message)[0])
    return [f"({proc} pid={PIDS[proc]}) {part}" for part in out.split("\n")]


def uvicorn(msg):
    """uvicorn's default format under the APIServer prefix (vLLM passes no log config)."""
    return [f"(APIServer pid=100) INFO:     {msg}"]


#: vllm/entrypoints/serve/utils/api_utils.py:321-326, monochrome (vLLM's own formatter
#: on a file: colours empty).
LOGO = ("\n       \u2588     \u2588     \u2588\u2584   \u2584\u2588\n"
        " \u2584\u2584 \u2584\u2588 \u2588     \u2588     \u2588 \u2580\u2584\u2580 \u2588"
        "  version %s\n"
        "  \u2588\u2584\u2588\u2580 \u2588     \u2588     \u2588     \u2588"
        "  model   %s\n"
        "   \u2580\u2580  \u2580\u2580\u2580\u2580\u2580 \u2580\u2580\u2580\u2580\u2580"
        " \u2580     \u2580\n")
SPEC = "SpeculativeConfig(method='eagle3', model='/d/eagle3', num_spec_tokens=3)"


def start_v2(aux_line=True):
    """A 0.25.1 start of a dense target with an EAGLE-3 drafter: the V2 model runner."""
    lines = [
        *vlog(A, LOGO, "0.25.1", "/m/Llama-3.1-8B", file="api_utils.py", lineno=339),
        *vlog(A, "non-default args: %s", {"model": "/m/Llama-3.1-8B", "speculative_config": {
            "method": "eagle3", "model": "/d/eagle3", "num_speculative_tokens": 3}},
            file="api_utils.py", lineno=273),
        # vllm/v1/engine/core.py:114-118 with vllm/config/vllm.py:2005-2008,
        # vllm/config/speculative.py:1262-1276
        *vlog(E, "Initializing a V1 LLM engine (v%s) with config: %s", "0.25.1",
              f"model='/m/Llama-3.1-8B', speculative_config={SPEC}, "
              f"tokenizer='/m/Llama-3.1-8B', skip_tokenizer_init=False", file="core.py",
              lineno=114, clock="06:00:05"),
        *vlog(E, "world_size=%d rank=%d local_rank=%d distributed_init_method=%s backend=%s",
              1, 0, 0, "tcp://127.0.0.1:4321", "nccl", file="parallel_state.py",
              lineno=1608, clock="06:00:06"),  # vllm/distributed/parallel_state.py:1607-1609
        *vlog(E, "Using V2 Model Runner", file="gpu_worker.py", lineno=360),
        *vlog(E, "Loading model from scratch...", file="model_runner.py", lineno=281,
              clock="06:00:07"),  # vllm/v1/worker/gpu/model_runner.py:281
        *vlog(E, "Loading weights took %.2f seconds", 3.1, file="default_loader.py",
              lineno=430, clock="06:00:10"),  # model_loader/default_loader.py:430-433
    ]
    if aux_line:  # vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:28
        lines += vlog(E, "Using Eagle3 auxiliary layers from config: %s", (2, 16, 29),
                      file="eagle3_utils.py", lineno=28, clock="06:00:10")
    lines += [
        *vlog(E, "Loading weights took %.2f seconds", 0.2, file="default_loader.py",
              lineno=430, clock="06:00:11"),
        *vlog(E, "Model loading took %s GiB and %.6f seconds", "15.32", 4.123456,
              file="model_runner.py", lineno=302, clock="06:00:11"),  # gpu/model_runner.py
        *vlog(E, "Dynamo bytecode transform time: %.2f s", 5.01, file="backends.py",
              lineno=1149, clock="06:00:17"),  # vllm/compilation/backends.py:1149
        *vlog(E, "torch.compile took %.2f s in total", 20.55, file="monitor.py",
              lineno=53, clock="06:00:32"),  # vllm/compilation/monitor.py:20,53
        *vlog(E, "Initial profiling/warmup run took %.2f s", 1.2, file="monitor.py",
              lineno=81, clock="06:00:33"),  # monitor.py:81-84
        *vlog(E, "Available KV cache memory: %s GiB", "98.5", file="gpu_worker.py",
              lineno=538, clock="06:00:34"),  # vllm/v1/worker/gpu_worker.py:538-541
        *vlog(E, "GPU KV cache size: %s tokens", "806,784", file="kv_cache_utils.py",
              lineno=2146, clock="06:00:34"),  # vllm/v1/core/kv_cache_utils.py:2146
        # a tqdm bar (vllm/v1/worker/gpu/cudagraph_utils.py:303): \r-separated updates
        "(EngineCore pid=200) \rCapturing CUDA graphs:   0%|          | 0/35 [00:00<?, "
        "?it/s]\rCapturing CUDA graphs: 100%|##########| 35/35 [00:02<00:00, 15.02it/s]",
        # vllm/v1/worker/gpu/spec_decode/autoregressive/speculator.py:90
        *vlog(E, "Capturing model for speculator...", file="speculator.py", lineno=90,
              clock="06:00:37"),
        *vlog(E, "Graph capturing finished in %.0f secs, took %.2f GiB", 7, 0.45,
              file="model_runner.py", lineno=722, clock="06:00:41"),  # gpu/model_runner.py
        *vlog(E, "init engine (profile, create kv cache, warmup model) took %.2f s "
              "(compilation: %.2f s)", 45.1, 25.56, file="core.py", lineno=335,
              clock="06:00:45"),  # vllm/v1/engine/core.py:335-341
        *vlog(A, "Supported tasks: %s", ("generate",), file="api_server.py", lineno=612,
              clock="06:00:46"),
        *vlog(A, "Starting vLLM server on %s", "http://127.0.0.1:8000",
              file="api_server.py", lineno=616, clock="06:00:46"),
        *vlog(A, "Available routes are:", file="launcher.py", lineno=37, clock="06:00:46"),
        *vlog(A, "Route: %s, Methods: %s", "/v1/completions", "POST", file="launcher.py",
              lineno=46, clock="06:00:46"),
        *uvicorn("Started server process [100]"), *uvicorn("Waiting for application startup."),
        *uvicorn("Application startup complete."),
    ]
    return lines


#: vllm/v1/metrics/loggers.py:225-283 (`Engine %03d: ` from loggers.py:160-161) and
#: vllm/v1/spec_decode/metrics.py:120-136
STATS = ("Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: "
         "%.1f tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, "
         "Prefix cache hit rate: %.1f%%")
SPEC_FMT = ("SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f "
            "tokens/s, Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d "
            "tokens, Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%")


def decode(clock="06:01:00"):
    return [*vlog(A, STATS, 0, 51.2, 812.4, 8, 0, 2.1, 0.0, file="loggers.py", lineno=273,
                  clock=clock),
            *vlog(A, SPEC_FMT, 2.61, 380.2, 720.0, 3802, 7200, "0.780, 0.520, 0.310", 52.8,
                  file="metrics.py", lineno=120, clock=clock),
            *uvicorn('127.0.0.1:51234 - "POST /v1/completions HTTP/1.1" 200 OK')]


def shutdown_lines():
    """What a SIGTERM to the whole group can leave (0.25.1): the API server's and the
    engine core's `[shutdown]` lines, the client's monitor seeing the engine core gone,
    uvicorn's own, and eagle3lab's stop line."""
    return [
        *vlog(A, "[shutdown] API server: shutdown triggered", file="launcher.py",
              lineno=100, clock="06:02:00"),  # vllm/entrypoints/launcher.py:100
        *vlog(E, "[shutdown] EngineCore: trigger received signal=%s", "SIGTERM",
              file="core.py", lineno=1214, clock="06:02:00"),  # vllm/v1/engine/core.py
        *vlog(A, "[shutdown] API server: stopping engine client mode=%s timeout=%ss", "abort",
              0, file="launcher.py", lineno=116, clock="06:02:00"),
        *vlog(A, "[shutdown] MPClient: start timeout=%s", "0s", file="core_client.py",
              lineno=655, clock="06:02:00"),  # vllm/v1/engine/core_client.py:655
        *vlog(A, "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
              file="core_client.py", lineno=702, level=logging.WARNING, clock="06:02:01"),
        *uvicorn("Shutting down"), *uvicorn("Waiting for application shutdown."),
        *uvicorn("Application shutdown complete."),
        "# eagle3lab: stopped process group 100 (SIGTERM), exit code 0",  # launch.py stop()
    ]


def test_a_0251_start_reads_to_ready_with_the_facts_and_the_drafter():
    r = analyse_log(start_v2() + decode(), silence_s=1e9)
    assert r["format"] == "vllm" and r["verdict"] == "ready" and r["crash"] is None
    assert [p["phase"] for p in r["phases"]] == [
        "launch", "init-distributed", "load-weights", "weights-loaded", "cuda-graph-capture",
        "kv-cache", "cuda-graph-capture", "cuda-graph-captured", "http-server", "ready"]
    assert r["facts"] == {
        "version": "0.25.1", "served_model": "/m/Llama-3.1-8B", "model_runner": "V2",
        "listen": "http://127.0.0.1:8000",
        "speculative_config": {"method": "eagle3", "model": "/d/eagle3", "num_spec_tokens": 3},
        "aux_layers": {"ids": [2, 16, 29], "source": "config"}}
    d = r["drafter"]
    assert (d["method"], d["model"], d["num_spec_tokens"], d["loaded"]) == (
        "eagle3", "/d/eagle3", 3, True)
    assert (d["aux_layers"], d["aux_layers_from"]) == ([2, 16, 29], "config")
    assert [e["message"] for e in d["evidence"]] == [
        "Using Eagle3 auxiliary layers from config: (2, 16, 29)",
        "Capturing model for speculator..."]
    f = {x["code"]: x for x in r["findings"]}
    assert "input of layers [2, 16, 29] (vLLM ids, from the drafter's config)" in \
        f["drafter-loaded"]["message"]
    assert r["phases"][-1]["time"] == "2025-12-18 06:00:46"  # uvicorn's: the last stamp
    row = r["decode"][0]
    assert (row["accept_len"], row["per_position"], row["accepted"], row["drafted"]) == (
        2.61, [0.78, 0.52, 0.31], 3802, 7200)
    assert (row["running_req"], row["gen_throughput"], row["accept_rate"]) == (8, 812.4, 0.528)


def test_stamp_variants_debug_paths_logo_lines_and_uvicorn():
    """DEBUG logging shortens paths (vllm/logging_utils/formatter.py:21-69); a logo line
    is stamped like any other; uvicorn's lines keep their own format under the prefix."""
    ln = parse_line("(EngineCore_DP0 pid=7) INFO 12-18 06:02:00 [v1/engine/core.py:1214] "
                    "[shutdown] EngineCore: trigger received signal=SIGTERM\r\n", 3)
    assert ln.engine == "vllm" and ln.tags == ("EngineCore_DP0", "INFO")
    assert ln.message.startswith("[shutdown] EngineCore") and ln.time.second == 0
    ln = parse_line("DEBUG 12-18 06:00:00 [model_executor/.../utils/fp8_utils.py:88] x")
    assert ln.engine == "vllm" and ln.message == "x"
    logo = vlog(A, LOGO, "0.25.1", "m", file="api_utils.py", lineno=339)
    assert len(logo) == 6 and all(parse_line(x).engine == "vllm" for x in logo)
    assert parse_line(logo[2]).message.endswith("version 0.25.1")
    ln = parse_line(uvicorn("Application startup complete.")[0])
    assert ln.tags == ("APIServer", "INFO") and ln.message == "Application startup complete."
    # older releases (v0.10/0.11): still read
    r = analyse_log(vlog(A, "vLLM API server version %s", "0.11.0", file="api_server.py")
                    + vlog(E, "torch.compile takes %.2f s in total", 20.0, file="monitor.py"),
                    silence_s=1e9)
    assert r["facts"]["version"] == "0.11.0"
    assert [p["phase"] for p in r["phases"]] == ["launch", "cuda-graph-capture"]


def test_v1_runner_drafter_lines_and_a_drafter_nothing_confirms():
    """The V1 model runner (vllm/v1/worker/gpu_model_runner.py) says `Loading drafter
    model...` (5233), names the aux layers only when the drafter's config sets them
    (5396-5397), and `Model loading took %s GiB memory and %.6f seconds` (5306-5309)."""
    head = start_v2()[:8]  # logo .. Initializing .. world_size
    v1 = head + [
        *vlog(E, "Starting to load model %s...", "/m/Llama-3.1-8B",
              file="gpu_model_runner.py", lineno=5209),
        *vlog(E, "Loading drafter model...", file="gpu_model_runner.py", lineno=5233),
        *vlog(E, "Detected EAGLE model without its own lm_head in the checkpoint. Sharing "
              "target model lm_head weights with the draft model.",
              file="llm_base_proposer.py", lineno=1530),
        *vlog(E, "Using auxiliary layers from speculative config: %s", (1, 15, 28),
              file="gpu_model_runner.py", lineno=5396),
        *vlog(E, "Model loading took %s GiB memory and %.6f seconds", "14.99", 5.1,
              file="gpu_model_runner.py", lineno=5306),
        *uvicorn("Application startup complete.")]
    r = analyse_log(v1, silence_s=1e9)
    assert [p["phase"] for p in r["phases"]][-3:] == ["load-weights", "weights-loaded", "ready"]
    assert r["drafter"]["loaded"] and r["drafter"]["aux_layers"] == [1, 15, 28]
    assert r["drafter"]["aux_layers_from"] == "config" and "model_runner" not in r["facts"]
    silent = [x for x in v1 if "auxiliary" not in x]  # the target's default layers
    r = analyse_log(silent, silence_s=1e9)
    f = {x["code"]: x for x in r["findings"]}
    assert r["drafter"]["aux_layers"] is None and "default" in f["drafter-loaded"]["message"]
    unconfirmed = [x for x in silent if "drafter" not in x and "EAGLE" not in x]
    r = analyse_log(unconfirmed, silence_s=1e9)
    f = {x["code"]: x for x in r["findings"]}
    assert not r["drafter"]["loaded"] and f["drafter-unconfirmed"]["severity"] == "warning"


def test_stats_line_variants():
    """Aggregated DP logger (vllm/v1/metrics/loggers.py:309-310), `Deferred` and
    `Preemptions` (loggers.py:242-248), and a SpecDecoding line with nothing drafted."""
    agg = ("2 Engines Aggregated: Avg prompt throughput: 0.0 tokens/s, Avg generation "
           "throughput: 99.0 tokens/s, Running: 3 reqs, Waiting: 4 reqs, Deferred: 1 reqs, "
           "Preemptions: 2, GPU KV cache usage: 50.0%, Prefix cache hit rate: 0.0%")
    nan = SPEC_FMT % (float("nan"), 0, 0, 0, 0, "nan, nan", float("nan"))
    r = analyse_log(vlog(A, agg, file="loggers.py") + vlog(A, nan, file="metrics.py"),
                    silence_s=1e9)
    d = r["decode"][0]
    assert (d["running_req"], d["queue_req"], d["token_usage"]) == (3, 4, 0.5)
    assert math.isnan(d["accept_len"]) and math.isnan(d["accept_rate"])
    assert len(d["per_position"]) == 2 and all(map(math.isnan, d["per_position"]))


def test_a_log_that_ends_in_shutdown_is_exited_and_keeps_its_statistics(tmp_path):
    lines = start_v2() + decode("06:01:00") + decode("06:01:10") + shutdown_lines()
    r = analyse_log(lines, silence_s=1e9)
    assert r["verdict"] == "exited" and r["phase"] == "shutdown" and r["crash"] is None
    s = r["shutdown"]
    assert s["by"] == "server" and s["marker"] == "[shutdown] API server: shutdown triggered"
    assert s["ready_before"] and s["after_phase"] == "ready" and s["decode_lines_before"] == 2
    assert s["error_lines"] == 1 and "engine core exited" in s["errors"][0]["marker"]
    assert r["stop"] == {"line": len(lines), "signals": ["SIGTERM"], "returncode": 0}
    assert len(r["decode"]) == 2 and r["decode"][1]["accept_len"] == 2.61
    codes = {f["code"]: f["severity"] for f in r["findings"]}
    assert codes["server-stopped"] == "info" and codes["errors-during-shutdown"] == "info"
    assert not [c for c, sev in codes.items() if sev == "error"]
    path = tmp_path / "vllm.log"
    path.write_text("\n".join(lines) + "\n")
    assert main(["logs", str(path)]) == 0  # exited is not a failure


def test_cli_prints_shutdown_and_drafter(tmp_path, capsys):
    path = tmp_path / "vllm.log"
    path.write_text("\n".join(start_v2() + decode() + shutdown_lines()) + "\n")
    assert main(["logs", str(path)]) == 0
    out = capsys.readouterr().out
    assert "vllm log, exited (phase shutdown" in out and "shutdown: line" in out
    assert "drafter: eagle3 /d/eagle3 (3 tokens), loaded, aux layers [2, 16, 29]" in out


def test_a_crash_before_the_shutdown_stays_a_crash():
    """The engine core dies (vllm/v1/engine/core.py:1233 `logger.exception`: the traceback
    re-stamped line by line), the API server sees it (core_client.py:702-704), uvicorn
    shuts down: crashed, with the exception line as the error."""
    tb = ("EngineCore encountered a fatal error.\nTraceback (most recent call last):\n"
          "  File \"core.py\", line 1, in run_busy_loop\n"
          "torch.OutOfMemoryError: CUDA out of memory.")
    lines = (start_v2() + decode() + vlog(E, tb, file="core.py", lineno=1233,
                                          level=logging.ERROR, clock="06:01:30")
             + vlog(A, "[shutdown] MPClient: engine core exited unexpectedly; starting "
                    "cleanup", file="core_client.py", lineno=702, level=logging.WARNING)
             + uvicorn("Shutting down") + uvicorn("Application shutdown complete."))
    r = analyse_log(lines, silence_s=1e9)
    assert r["verdict"] == "crashed" and "EngineCore encountered" in r["crash"]["marker"]
    assert r["crash"]["error"] == "torch.OutOfMemoryError: CUDA out of memory."
    assert r["shutdown"] is not None and r["phase"] == "shutdown"
    died = start_v2() + vlog(A, "[shutdown] MPClient: engine core exited unexpectedly; "
                             "starting cleanup", file="core_client.py", lineno=702)
    assert analyse_log(died, silence_s=1e9)["verdict"] == "crashed"


@pytest.mark.parametrize("line,verdict", [
    ("# eagle3lab: stopped process group 9 (SIGTERM, SIGKILL), exit code -9", "exited"),
    ("# eagle3lab: stopped process group 9 (already exited), exit code 0", "exited"),
    ("# eagle3lab: stopped process group 9 (already exited), exit code 1", "crashed"),
])
def test_eagle3lab_stop_line_alone(line, verdict):
    r = analyse_log(start_v2()[:12] + [line], now=dt.datetime(2099, 1, 1), silence_s=120)
    assert r["verdict"] == verdict
    if verdict == "exited":
        f = {x["code"]: x for x in r["findings"]}
        assert f["stopped-before-ready"]["severity"] == "warning"
        assert r["shutdown"]["after_phase"] == "load-weights"
        if "SIGKILL" in line:
            assert r["shutdown"]["by"] == "eagle3lab" and "SIGKILL" in \
                f["stopped-before-ready"]["message"]
    else:
        assert "exited with code 1" in r["crash"]["marker"]


def test_sglang_and_reference_shutdown_lines():
    """SGLang 0.5.23 (managers/tokenizer_manager.py `SignalHandler.sigterm_handler`,
    `sigterm_watchdog`) and uvicorn's lines under SGLang's stamp; the reference server's
    own (eagle3lab/refserver/server.py); a traceback of a killed rank after them."""
    sglang = [
        "[2025-01-01 12:00:00] server_args=ServerArgs(model_path='m', tp_size=1)",
        "[2025-01-01 12:00:04 TP0] Load weight begin. avail mem=78.50 GB",
        "[2025-01-01 12:00:20] The server is fired up and ready to roll!",
        "[2025-01-01 12:00:30 TP0] Decode batch, #running-req: 1, #token: 300, token usage: "
        "0.00, accept len: 3.21, accept rate: 0.55, cuda graph: True, gen throughput "
        "(token/s): 312.45, #queue-req: 0, ",
        "[2025-01-01 12:01:00] SIGTERM received. signum=15 frame=None. Draining requests "
        "and shutting down...",
        "[2025-01-01 12:01:05] Gracefully exiting... Remaining number of requests 0. "
        "Remaining requests remaining_rids=[].",
        "[2025-01-01 12:01:05 TP0] Traceback (most recent call last):",
        "[2025-01-01 12:01:05 TP0] KeyboardInterrupt",
        "[2025-01-01 12:01:06] INFO:     Shutting down",
        "[2025-01-01 12:01:06] INFO:     Finished server process [77]",
    ]
    r = analyse_log(sglang, now=dt.datetime(2025, 1, 2), silence_s=120)
    assert r["format"] == "sglang" and r["verdict"] == "exited" and r["crash"] is None
    assert r["shutdown"]["marker"].startswith("SIGTERM received.")
    assert r["shutdown"]["errors"][0]["error"] == "KeyboardInterrupt"
    assert r["decode"][0]["accept_len"] == 3.21 and r["drafter"] is None
    reference = ["[2025-01-01 12:00:20] The server is fired up and ready to roll!",
                 "[2025-01-01 12:01:00] Received SIGTERM; shutting down.",
                 "[2025-01-01 12:01:00] Shutdown complete."]
    r = analyse_log(reference, silence_s=1e9)
    assert r["verdict"] == "exited" and r["shutdown"]["line"] == 2


def test_watchdog_reads_a_shutdown_as_exited_and_stops_what_is_left(tmp_path, fake_script,
                                                                     no_orphans):
    """A stand-in server that logs a 0.25.1 start, then its shutdown, and lingers: the
    watchdog says exited (not ready), and stops the group it left behind."""
    lines = start_v2()[:12] + shutdown_lines()[:2]
    h = start_command(fake_script(f"""
        import time
        for ln in {lines!r}:
            print(ln, flush=True)
        time.sleep(600)
        """), run_dir=tmp_path / "run", name="fake")
    st = h.watchdog(silence_s=30, poll_s=0.1).wait(30)
    assert st["verdict"] == "exited" and "shut down" in st["reason"], st
    assert "still exiting" in st["reason"] and st["stop"]["signals"] == ["SIGTERM"]
    # ended by the watchdog's SIGTERM, not by waiting out its sleep(600)
    assert h.proc.returncode == -signal.SIGTERM and not process.group_members(h.pgid)
