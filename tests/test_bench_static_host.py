"""bench/static_host.py at its smallest on the CPU: one JSON line per batch size and shape
with the host's and the forwards' ms per verify step (both positive, the tokens those
steps made), then cProfile's table; a bad batch size is one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "static_host.py"


@pytest.mark.slow
@pytest.mark.full
def test_tiny_run_reports_host_and_forward_time_per_step():
    r = subprocess.run([sys.executable, "-P", str(SCRIPT), "--batch-sizes", "2", "4",
                        "--settings", "3,1,4", "--max-new-tokens", "8", "--repeats", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert [(x["shape"], x["batch"]) for x in rows] == [("3,1,4", 2), ("3,1,4", 4)]
    for x in rows:
        assert x["steps"] > 0 and x["host_ms_per_step"] > 0 and x["forward_ms_per_step"] > 0
        assert 0 < x["tokens"] <= 8 * x["batch"] and 1.0 <= x["tau"] <= 4.0
    assert "Ordered by: cumulative time" in r.stdout


@pytest.mark.parametrize("args,line", [
    (["--batch-sizes", "0"], "batch size (--batch-size) must be a whole number of at least 1, "
                             "got 0."),
    (["--repeats", "0"], "--repeats must be at least 1 (timed runs per point), got 0.")])
def test_bad_input_is_one_line(args, line):
    r = subprocess.run([sys.executable, "-P", str(SCRIPT), *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [f"bench/static_host.py: error: {line}"]


def test_fastest_repeat_reads_either_form():
    # _measure returns host ms per step on the CPU and loop ms per step on CUDA (a GPU run
    # once failed here with a KeyError); the fastest repeat is picked from either form.
    import importlib.util

    spec = importlib.util.spec_from_file_location("static_host_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cpu = [{"host_ms_per_step": 3.0}, {"host_ms_per_step": 2.0}, {"host_ms_per_step": 4.0}]
    cuda = [{"loop_ms_per_step": 9.5, "device_ms_per_step": 1.0},
            {"loop_ms_per_step": 7.25, "device_ms_per_step": 2.0}]
    assert mod._fastest(cpu) is cpu[1]
    assert mod._fastest(cuda) is cuda[1]
