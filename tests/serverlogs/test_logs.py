"""SGLang log parsing on log text in SGLang's exact formats (both versions of the decode
line), verdicts, warnings, findings and the `eagle3lab logs` command."""

import datetime as dt
import json

import pytest

from eagle3lab.cli import main
from eagle3lab.serverlogs.analyzer import (LogAnalyzer, LogFollower, analyse_log, decode_over_time,
                                           parse_decode, parse_line)

# Formats: python/sglang/srt/utils/common.py (configure_logger), managers/
# scheduler_metrics_mixin.py (Decode batch), model_executor/model_runner.py, http_server.py.
START = """\
[2025-01-01 12:00:00] server_args=ServerArgs(model_path='meta-llama/Llama-3.1-8B-Instruct', tp_size=1, speculative_algorithm='EAGLE3')
[2025-01-01 12:00:01] Attention backend not specified. Use fa3 backend by default.
[2025-01-01 12:00:01] Max running requests is reset to 48 for speculative decoding. You can override this by explicitly setting --max-running-requests.
[2025-01-01 12:00:02 TP0] Init torch distributed begin.
[2025-01-01 12:00:03 TP0] Ignore import error when loading sglang.srt.models.glm_ocr: No module named 'transformers.models.glm_ocr'
[2025-01-01 12:00:03 TP0] Ignore import error when loading sglang.srt.models.glmasr: cannot import name 'GlmAsrConfig' from 'transformers'
[2025-01-01 12:00:03 TP0] DeepGemm is enabled but the scale_fmt of checkpoint is not ue8m0. This might cause accuracy degradation on Blackwell.
[2025-01-01 12:00:04 TP0] Load weight begin. avail mem=78.50 GB
Loading safetensors checkpoint shards: 100% Completed | 4/4 [00:05<00:00,  1.30s/it]
[2025-01-01 12:00:10 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.40 GB, mem usage=15.10 GB.
[2025-01-01 12:00:11 TP0] KV Cache is allocated. #tokens: 413000, K size: 25.21 GB, V size: 25.21 GB
[2025-01-01 12:00:11 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=10.20 GB
[2025-01-01 12:00:17 TP0] Capture cuda graph end. Time elapsed: 6.01 s. mem usage=0.51 GB. avail mem=9.69 GB.
[2025-01-01 12:00:18] INFO:     Application startup complete.
[2025-01-01 12:00:18] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)
[2025-01-01 12:00:19 TP0] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, 
[2025-01-01 12:00:20] The server is fired up and ready to roll!
"""
DECODE_NEW = """\
[2025-01-01 12:00:30 TP0] Decode batch, #running-req: 1, #token: 300, token usage: 0.00, accept len: 3.21, accept rate: 0.55, cuda graph: True, gen throughput (token/s): 312.45, #queue-req: 0, 
[2025-01-01 12:00:31 TP0] Decode batch, #running-req: 2, #token: 700, token usage: 0.01, accept len: 3.05, accept rate: 0.51, cuda graph: True, gen throughput (token/s): 580.10, #queue-req: 0, 
"""
DECODE_OLD = """\
[2025-01-01 12:00:30 TP0] Decode batch, #running-req: 1, #token: 300, token usage: 0.00, accept len: 1.00, cuda graph: True, gen throughput (token/s): 95.20, #queue-req: 0
[2025-01-01 12:00:32 TP0] Decode batch, #running-req: 1, #token: 340, token usage: 0.00, accept len: 1.02, cuda graph: True, gen throughput (token/s): 96.00, #queue-req: 0
"""
DECODE_PLAIN = """\
[2025-01-01 12:00:30] Decode batch, #running-req: 4, #token: 1200, token usage: 0.01, cuda graph: True, gen throughput (token/s): 410.00, #queue-req: 2
"""
NOW = dt.datetime(2025, 1, 1, 12, 5, 0)


def test_parse_line_timestamp_tags_ms_and_ray_prefix():
    ln = parse_line("[2025-01-01 12:00:00 TP0] Load weight begin. avail mem=78.50 GB\n")
    assert ln.time == dt.datetime(2025, 1, 1, 12, 0, 0) and ln.tags == ("TP0",)
    assert ln.message == "Load weight begin. avail mem=78.50 GB"
    ln = parse_line("\x1b[36m(SGLangEngine pid=105447)\x1b[0m [2026-10-06 11:01:01.250 DP0 TP1 "
                    "EP1] Decode batch, #running-req: 3, #token: 9, token usage: 0.00, "
                    "cuda graph: True, gen throughput (token/s): 1.50, #queue-req: 0")
    assert ln.time == dt.datetime(2026, 10, 6, 11, 1, 1, 250000)
    assert ln.tags == ("DP0", "TP1", "EP1") and ln.message.startswith("Decode batch")
    assert parse_line("Loading safetensors checkpoint shards: 100%").time is None


def test_decode_line_both_versions_and_variants():
    new = parse_decode(parse_line(DECODE_NEW.splitlines()[0]).message)
    assert new == {"running_req": 1, "token": 300, "token_usage": 0.0, "accept_len": 3.21,
                   "accept_rate": 0.55, "gen_throughput": 312.45, "queue_req": 0,
                   "graph": True}
    old = parse_decode(parse_line(DECODE_OLD.splitlines()[0]).message)
    assert old["accept_len"] == 1.0 and old["accept_rate"] is None
    assert old["gen_throughput"] == 95.2 and old["queue_req"] == 0
    plain = parse_decode(parse_line(DECODE_PLAIN).message)
    assert plain["accept_len"] is None and plain["running_req"] == 4
    hybrid = parse_decode("Decode batch [812], #running-req: 9, #full token: 11584, full token "
                          "usage: 0.01, mamba num: 36, mamba usage: 0.60, accept len: 3.04, "
                          "accept rate: 0.68, cpu graph: False, gen throughput (token/s): "
                          "22.40, #queue-req: 1")
    assert (hybrid["token"], hybrid["token_usage"], hybrid["accept_len"]) == (11584, 0.01, 3.04)
    assert hybrid["graph"] is False
    assert parse_decode("Prefill batch, #new-seq: 1, #new-token: 7") is None


def test_ready_speculative_log():
    r = analyse_log((START + DECODE_NEW).splitlines(), now=NOW, silence_s=120)
    assert r["verdict"] == "ready" and r["phase"] == "ready"
    assert r["last_line_time"] == "2025-01-01 12:00:31"
    assert [p["phase"] for p in r["phases"]] == [
        "launch", "init-distributed", "load-weights", "weights-loaded", "kv-cache",
        "cuda-graph-capture", "cuda-graph-captured", "http-server", "ready"]
    assert [d["accept_len"] for d in r["decode"]] == [3.21, 3.05]
    assert r["decode"][0]["time"] == "2025-01-01 12:00:30"
    ids = {w["id"]: w for w in r["warnings"]}
    assert set(ids) >= {"deepgemm-scale-fmt", "attention-backend-default",
                        "max-running-requests-reset", "import-error-noise"}
    assert ids["import-error-noise"]["count"] == 2
    assert all(w["match"] and w["explanation"] for w in r["warnings"])
    assert r["speculative"] and not any(f["severity"] == "error" for f in r["findings"])


def test_acceptance_collapse_on_old_format():
    r = analyse_log((START + DECODE_OLD).splitlines(), now=NOW)
    codes = {f["code"]: f for f in r["findings"]}
    assert r["verdict"] == "ready"
    assert codes["acceptance-collapse"]["severity"] == "error"
    assert "eagle3lab inspect" in codes["acceptance-collapse"]["message"]


def test_no_speculation_is_info_only():
    r = analyse_log((START + DECODE_PLAIN).splitlines(), now=NOW)
    assert not r["speculative"]
    assert [f["code"] for f in r["findings"]] == ["no-speculation"]


@pytest.mark.parametrize("cut,phase,cause", [
    ("Capture cuda graph end", "cuda-graph-capture", "--cuda-graph-max-bs"),
    ("Ignore import error", "init-distributed", "NCCL"),
])
def test_hung_depends_on_silence_and_names_the_cause(cut, phase, cause):
    text = START[:START.index(cut)]
    text = text[:text.rindex("\n") + 1]
    a = LogAnalyzer().feed_text(text)
    assert a.report(now=a.last_time + dt.timedelta(seconds=60), silence_s=120)["verdict"] == \
        "starting"
    r = a.report(now=a.last_time + dt.timedelta(seconds=121), silence_s=120)
    assert r["verdict"] == "hung" and r["phase"] == phase
    (f,) = [f for f in r["findings"] if f["code"] == "startup-hung"]
    assert f["severity"] == "error" and cause in f["message"]


def test_crash_with_traceback():
    text = START[:START.index("[2025-01-01 12:00:10")] + """\
[2025-01-01 12:00:05 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2500, in run_scheduler_process
    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.

[2025-01-01 12:00:05] Received sigquit from a child process. It usually means the child failed.
"""
    r = analyse_log(text.splitlines(), now=NOW)
    assert r["verdict"] == "crashed"
    (f,) = [f for f in r["findings"] if f["code"] == "server-crashed"]
    assert "torch.OutOfMemoryError: CUDA out of memory" in f["message"]


def test_follower_reads_growing_file_complete_lines_only(tmp_path):
    log = tmp_path / "server.log"
    fol = LogFollower(log)
    assert fol.poll() == []
    lines = START.splitlines(keepends=True)
    log.write_text("".join(lines[:3]) + lines[3][:10])  # a half-written line
    assert len(fol.poll()) == 3
    with open(log, "a") as f:
        f.write(lines[3][10:] + "".join(lines[4:]))
    fol.poll()
    assert fol.analyzer.ready and fol.analyzer.lines == len(lines)


def test_logs_command_json_and_exit_codes(tmp_path, capsys):
    ok, collapsed, hung = (tmp_path / n for n in ("ok.log", "collapse.log", "hung.log"))
    ok.write_text(START + DECODE_NEW)
    collapsed.write_text(START + DECODE_OLD)
    hung.write_text(START[:START.index("[2025-01-01 12:00:17")])
    assert main(["logs", str(ok), "--json", "--now", "2025-01-01T12:05:00"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert set(obj) >= {"verdict", "phase", "last_line_time", "warnings", "decode", "findings"}
    assert obj["verdict"] == "ready"
    assert set(obj["decode"][0]) >= {"time", "running_req", "accept_len", "accept_rate",
                                     "gen_throughput"}
    assert set(obj["warnings"][0]) >= {"match", "explanation"}
    assert main(["logs", str(collapsed), "--json", "--now", "2025-01-01T12:05:00"]) == 1
    assert json.loads(capsys.readouterr().out)["verdict"] == "ready"
    assert main(["logs", str(hung), "--json", "--now", "2025-01-01T12:00:40",
                 "--silence-s", "20"]) == 1
    assert json.loads(capsys.readouterr().out)["verdict"] == "hung"
    assert main(["logs", str(hung), "--now", "2025-01-01T12:00:20", "--silence-s", "20"]) == 0
    out = capsys.readouterr().out
    assert "starting" in out and "cuda-graph-capture" in out
    assert main(["logs", str(tmp_path / "missing.log")]) == 2
    assert main(["logs", str(ok), "--now", "yesterday"]) == 1
    assert "ISO" in capsys.readouterr().err


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


def test_decode_over_time_of_a_log_without_decode_lines(tmp_path):
    log = tmp_path / "b.log"
    log.write_text("[2025-01-01 12:00:00] The server is fired up and ready to roll!\n")
    df = decode_over_time(log, "baseline")
    assert len(df) == 0 and "t_s" in df.columns and "accept_len" in df.columns
