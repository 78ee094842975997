"""The benchmark's result: its key numbers for the batch report come from the tables the
notebook shows (None where an arm did not run), and `save` writes every table and
bench.json. Built from real request rows, real SGLang log lines and the real table code."""

import json

import pandas as pd
import pytest

from eagle3lab.measure.bench import BenchResult, summary_numbers
from eagle3lab.measure.tables import per_position, summarize
from eagle3lab.serverlogs.analyzer import analyse_log, decode_over_time

READY = "[2025-01-01 12:00:18] The server is fired up and ready to roll!\n"
DECODE = ("[2025-01-01 12:00:30 TP0] Decode batch, #running-req: 1, #token: 300, token usage: "
          "0.00, accept len: {a}, accept rate: 0.10, cuda graph: True, gen throughput "
          "(token/s): 50.00, #queue-req: 0\n")


def _result(tmp_path, *, spec_ran: bool) -> BenchResult:
    rows = [{"arm": "baseline", "prompt_id": "p0", "completion_tokens": 20, "latency_s": 2.0,
             "spec_verify_ct": None, "accept_histogram": None}]
    if spec_ran:
        rows.append({"arm": "speculative", "prompt_id": "p0", "completion_tokens": 20,
                     "latency_s": 1.0, "spec_verify_ct": 8, "accept_histogram": [2, 2, 2, 2]})
    req = pd.DataFrame(rows)
    logs, decode = {}, []
    for arm, text in (("baseline", READY), ("speculative", READY + DECODE.format(a="1.00")
                                            * 3)):
        path = tmp_path / f"{arm}.log"
        path.write_text(text)
        logs[arm] = analyse_log(path)
        decode.append(decode_over_time(path, arm))
    watch = {"baseline": {"verdict": "ready"},
             "speculative": {"verdict": "ready" if spec_ran else "hung"}}
    return BenchResult(
        requests=req, summary=summarize(req), positions=per_position(req),
        decode=pd.concat(decode, ignore_index=True), watch=watch, logs=logs,
        infos={"baseline": None}, stops={a: {"pgid": 1, "signal": "TERM"} for a in watch},
        skipped={} if spec_ran else {"speculative": "server hung: no log line for 120 s"})


def test_key_numbers_come_from_the_tables(tmp_path):
    r = _result(tmp_path, spec_ran=True)
    n = summary_numbers(r, engine="reference")
    assert list(n) == ["engine", "verdicts", "baseline_tokens_per_s", "spec_tokens_per_s",
                       "speedup", "accept_length", "acceptance_per_position", "findings",
                       "skipped_arms", "sweep_tokens_per_s"]
    assert n["verdicts"] == {"baseline": "ready", "speculative": "ready"}
    assert (n["baseline_tokens_per_s"], n["spec_tokens_per_s"], n["speedup"]) == (10, 20, 2)
    assert n["accept_length"] == 2.5
    # summed H = [2, 2, 2, 2]: P(k) = 6/8, 4/8, 2/8
    assert n["acceptance_per_position"] == pytest.approx([0.75, 0.5, 0.25])
    codes = {f["code"] for rep in r.logs.values() for f in rep["findings"]}
    assert n["findings"] == sorted(codes) and "acceptance-collapse" in codes
    assert n["skipped_arms"] == []


def test_a_skipped_arm_has_no_numbers_and_is_named(tmp_path):
    n = summary_numbers(_result(tmp_path, spec_ran=False), engine="sglang")
    assert n["baseline_tokens_per_s"] == 10
    assert n["spec_tokens_per_s"] is None and n["speedup"] is None
    assert n["accept_length"] is None and n["acceptance_per_position"] == []
    assert n["skipped_arms"] == ["speculative"]
    empty = BenchResult(requests=pd.DataFrame(), summary=summarize(pd.DataFrame(
        columns=["arm", "completion_tokens", "latency_s", "spec_verify_ct"])),
        positions=pd.DataFrame(), decode=None, watch={}, logs={}, infos={}, stops={},
        skipped={"baseline": "server crashed"})
    n = summary_numbers(empty, engine="sglang")
    assert n["baseline_tokens_per_s"] is None and n["acceptance_per_position"] == []


def test_save_writes_every_table_and_bench_json(tmp_path):
    r = _result(tmp_path, spec_ran=False)
    out = tmp_path / "out"
    out.mkdir()
    paths = r.save(out)
    assert [p.name for p in paths] == ["requests.csv", "summary.csv", "positions.csv",
                                       "decode.csv", "bench.json"]
    bench = json.loads((out / "bench.json").read_text())
    assert bench["verdicts"] == {"baseline": "ready", "speculative": "hung"}
    assert bench["skipped"] == {"speculative": "server hung: no log line for 120 s"}
    assert pd.read_csv(out / "decode.csv")["accept_len"].tolist() == [1.0, 1.0, 1.0]
    assert set(r.findings_table()["arm"]) <= {"baseline", "speculative"}
    assert list(r.warnings_table().columns) == ["arm", "severity", "count", "message",
                                                "explanation"]
