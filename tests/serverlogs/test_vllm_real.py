"""Files a real vLLM 0.25.1 wrote on an H200 (2026-12-02, bench/vllm_check.py; provenance in
fixtures/vllm-0.25.1/README.md), read on the CPU by the same code that reads a live server:
the log reader (phases, the ready verdict, the drafter and its aux layers, the
SpecDecoding lines, the shutdown, the crashes), the /metrics window, and the offline
engine's prediction for the same prompts compared position by position."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3lab.measure.agreement import compare, counts_from_histogram, counts_from_window
from eagle3lab.measure.prometheus import parse_metrics, window
from eagle3lab.serverlogs.analyzer import LogAnalyzer, analyse_log

FIX = Path(__file__).parent / "fixtures" / "vllm-0.25.1"
RESULTS = json.loads((FIX / "h200-results.json").read_text())


def _window(name: str) -> dict:
    before = {"t": 0.0, **parse_metrics((FIX / f"{name}.metrics.before.txt").read_text())}
    after = {"t": 1.0, **parse_metrics((FIX / f"{name}.metrics.after.txt").read_text())}
    return window(before, after)


def test_a_speculative_eager_start_read_from_launch_to_shutdown(tmp_path):
    r = analyse_log(FIX / "spec-k3.log", silence_s=1e9)
    assert r["format"] == "vllm" and r["crash"] is None
    assert [p["phase"] for p in r["phases"]] == [
        "launch", "init-distributed", "load-weights", "weights-loaded", "kv-cache",
        "cuda-graph-captured", "http-server", "ready", "shutdown"]
    assert r["verdict"] == "exited"  # it ended in the server's shutdown, not "ready"
    assert (r["facts"]["version"], r["facts"]["model_runner"]) == ("0.25.1", "V2")
    d = r["drafter"]
    assert d["loaded"] and d["method"] == "eagle3" and d["num_spec_tokens"] == 3
    assert (d["aux_layers"], d["aux_layers_from"]) == ([2, 15, 27], "config")
    spec = [row for row in r["decode"] if row["accept_len"] is not None]
    assert [(x["accept_len"], x["accepted"], x["drafted"], x["per_position"]) for x in spec] \
        == [(2.23, 12274, 30042, [0.597, 0.374, 0.254]), (2.21, 1647, 4089, [0.591, 0.36, 0.258])]
    assert not [f for f in r["findings"] if f["severity"] == "error"]
    codes = {f["code"] for f in r["findings"]}
    assert {"drafter-loaded", "server-stopped"} <= codes

    # the same log cut before the shutdown reads as ready (what the watchdog saw live)
    lines = (FIX / "spec-k3.log").read_text().splitlines(keepends=True)
    cut = next(i for i, ln in enumerate(lines) if "[shutdown]" in ln)
    live = tmp_path / "live.log"
    live.write_text("".join(lines[:cut]))
    assert analyse_log(live, silence_s=1e9)["verdict"] == "ready"


def test_compile_and_cuda_graph_start_up_phases():
    r = analyse_log(FIX / "graphs-k3.log", silence_s=1e9)
    phases = [p["phase"] for p in r["phases"]]
    assert phases.index("cuda-graph-capture") < phases.index("kv-cache") < \
        phases.index("cuda-graph-captured") < phases.index("ready")
    assert r["verdict"] == "exited" and r["drafter"]["loaded"]
    assert len([x for x in r["decode"] if x["per_position"]]) == 4


def test_crashes_name_their_cause():
    fc = analyse_log(FIX / "fault-last-layer-features.log", silence_s=1e9)
    assert fc["verdict"] == "crashed" and fc["phase"] == "load-weights"
    f = {x["code"]: x for x in fc["findings"]}
    assert "torch.Size([576, 576])" in f["server-crashed"]["message"]
    # it began loading the drafter (the aux-layer line) but never finished: not "loaded"
    assert not fc["drafter"]["loaded"] and fc["drafter"]["load_started"]
    assert f["drafter-load-failed"]["severity"] == "error"

    missing = analyse_log(FIX / "fault-missing-path.log", silence_s=1e9)
    assert missing["verdict"] == "crashed" and missing["phase"] == "launch"
    assert "SpeculativeConfig" in missing["crash"]["error"]


@pytest.mark.parametrize("name,verdict,code", [("spec-k3", "exited", 0),
                                               ("fault-last-layer-features", "crashed", 1)])
def test_eagle3lab_logs_on_the_real_logs(name, verdict, code):
    r = subprocess.run([sys.executable, "-m", "eagle3lab", "logs", str(FIX / f"{name}.log")],
                       capture_output=True, text=True)
    assert r.returncode == code, r.stderr
    assert f"vllm log, {verdict}" in r.stdout


def test_the_metrics_window_is_the_logs_spec_decoding_interval():
    """Two /metrics scrapes around the 115 acceptance requests count what the first
    SpecDecoding line (covering the same 10 s) printed: the counters and the log agree."""
    w = _window("spec-k3")
    assert w["source"] == "vllm" and w["requests"] == 115
    assert (w["drafts"], w["draft_tokens"], w["accepted"]) == (10014, 30042, 12274)
    assert [round(p, 3) for p in w["per_position"]] == [0.597, 0.374, 0.254]
    assert w["accept_length"] == pytest.approx(2.2257, abs=1e-4)
    collapsed = _window("fault-d2t-dropped")  # d2t removed: every draft maps to a wrong id
    assert collapsed["accept_length"] < 1.001 and collapsed["drafts"] == 3479


def test_the_offline_prediction_matches_vllm_within_the_noise_of_the_counts():
    """The offline engine's histogram for the same 115 held-out prompts (static engine on
    the same H200, bf16 and fp32) against vLLM's counters: every position within 3
    standard errors, in both dtypes and at k = 3 and 5."""
    k3 = RESULTS["accept"]["spec-k3"]
    r = compare(counts_from_histogram(k3["offline"]["histogram"]), counts_from_window(
        _window("spec-k3")))
    assert r["agree"] and r["max_abs_z"] < 3
    assert [x["z"] for x in r["positions"]] == pytest.approx(
        [x["z"] for x in k3["comparison"]["positions"]])  # as computed on the device
    for name in ("spec-k5", "spec-k3-fp32"):
        a = RESULTS["accept"][name]
        r = compare(counts_from_histogram(a["offline"]["histogram"]),
                    counts_from_window(a["served_window"]))
        assert r["agree"], (name, r)
    # the fp32 server and the fp32 engine mostly write the same text; bf16 diverges early
    assert RESULTS["accept"]["spec-k3-fp32"]["vllm_vs_offline_outputs"]["identical"] >= 90
    assert RESULTS["accept"]["spec-k3"]["vllm_vs_offline_outputs"]["identical"] < 20


def test_preflight_verdicts_agree_with_what_vllm_did():
    """Each planted fault: an error from preflight where vLLM refused or served badly,
    no error where it served as the healthy drafter did (t2d-dropped was the one false
    alarm, fixed: tests/preflight/test_preflight_checks.py)."""
    healthy = RESULTS["faults"]["fault-midlayer-keys"]["served_accept_length"]
    for name, f in RESULTS["faults"].items():
        served = f["served_accept_length"]
        bad = f["verdict"] != "ready" or served < 0.9 * healthy
        if bad:
            assert not f["preflight"]["ok"], name  # preflight saw every real failure
        if f["verdict"] != "ready":
            assert "refused" in f["offline_as_vllm"], name
        else:  # the offline engine, loading the drafter as vLLM does, predicted the serving
            assert f["offline_as_vllm"]["accept_length"] == pytest.approx(served, abs=0.1), name


def test_the_live_reader_follows_the_log_line_by_line():
    """LogAnalyzer fed line by line (as LogFollower feeds it from a growing file) ends in
    the same state as the whole-file read."""
    a = LogAnalyzer()
    for ln in (FIX / "spec-k3.log").read_text().splitlines():
        a.feed(ln)
    assert a.ready and a.shutdown is not None and a.drafter()["loaded"]
