"""The one layer over torch.distributed (eagle3lab/distributed.py) that the data stages,
training and the CLI share: torchrun's environment read one way, two real gloo ranks whose
collectives agree (rank 0 decides, every rank gets the result or the same error), the
process group's timeout in SECONDS, the per-rank device, and errors printed once.

The two ranks are forked from this process with torchrun's variables set
(testutil.fork_ranks), so nothing is imported again per rank."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from eagle3lab.distributed import RankFailure, Ranks, detect, rank_device, report
from eagle3lab.errors import UserError
from testutil import fork_ranks

TIMEOUT_S = 2.0  # the process group's timeout in the 2-rank test


def test_detect_reads_torchrun_environment(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert detect() == Ranks() and not detect().many and not detect().active
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert detect() == Ranks(3, 4, 3, 4)  # one node: LOCAL_* default to RANK / WORLD_SIZE
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert detect() == Ranks(3, 4, 1, 2) and str(detect()) == "rank 3 of 4"
    monkeypatch.setenv("WORLD_SIZE", "four")
    with pytest.raises(UserError, match="not integers"):
        detect()


def test_rank_device():
    two = Ranks(1, 2, 1, 2)
    assert rank_device("cpu", two) == "cpu"
    assert rank_device("cuda:1", Ranks()) == "cuda:1"  # one process: as asked
    with pytest.raises(UserError, match="--device cuda:1 under torchrun would put all 2 "
                                        "ranks on one GPU; pass --device cuda"):
        rank_device("cuda:1", two)


def test_errors_print_once_and_reach_torchruns_summary(tmp_path, monkeypatch):
    assert report(UserError("x")) == (True, 0.0)  # no torchrun: as before
    err = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(err))
    for var, v in (("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(var, v)
    assert report(UserError("bad --lr")) == (False, 0.0)  # every rank raised it: rank 0 says it
    assert json.loads(err.read_text())["message"]["message"] == "UserError: bad --lr"
    err.unlink()
    assert report(RankFailure("peer died", linger_s=4.0, record=False)) == (True, 4.0)
    assert not err.exists()  # torchrun's summary names the dead rank instead
    monkeypatch.setenv("RANK", "0")
    assert report(UserError("bad --lr")) == (True, 0.0)


class _Leave(Exception):
    """Leave the session as after an error: without its closing barrier."""


def _rank(rank: int, results: str) -> None:
    from eagle3lab.distributed import session

    def bad_file():
        raise UserError("rank 0 read a bad file")

    out: dict = {}
    try:
        with session(device="cpu", timeout=TIMEOUT_S) as ranks:
            out["ranks"] = [ranks.rank, ranks.world_size, ranks.backend, ranks.device]
            out["gather"] = ranks.gather(10 * ranks.rank)
            out["sum"] = ranks.sum([ranks.rank, 1.0])
            out["decided"] = ranks.on_main(lambda: f"decided on rank {ranks.rank}")
            for key, fn in (("user_error", bad_file), ("other_error", lambda: 1 / 0)):
                try:
                    ranks.on_main(fn)
                except Exception as e:  # noqa: BLE001 - what each rank raised, for the test
                    out[key] = f"{type(e).__name__}: {e}"
            released = Path(results, "released")
            if ranks.main:  # rank 1 stays away from this barrier: it fails after TIMEOUT_S
                t0 = time.monotonic()
                try:
                    ranks.barrier()
                except Exception as e:  # noqa: BLE001
                    out["barrier"] = type(e).__name__
                out["waited_s"] = time.monotonic() - t0
                released.write_text("")
            else:
                deadline = time.monotonic() + 60
                while not released.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                out["released"] = released.exists()
            raise _Leave
    except _Leave:
        pass
    Path(results, f"rank{rank}.json").write_text(json.dumps(out))


def test_two_ranks_agree_and_time_out_in_seconds(tmp_path):
    fork_ranks(lambda rank: _rank(rank, str(tmp_path)), limit_s=60)  # not 120 s (minutes)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["ranks"] == [0, 2, "gloo", "cpu"] and r1["ranks"] == [1, 2, "gloo", "cpu"]
    assert r0["gather"] == r1["gather"] == [0, 10]
    assert r0["sum"] == r1["sum"] == [1.0, 2.0]
    assert r0["decided"] == r1["decided"] == "decided on rank 0"
    assert r0["user_error"] == r1["user_error"] == "UserError: rank 0 read a bad file"
    assert r0["other_error"] == "ZeroDivisionError: division by zero"
    assert r1["other_error"] == "RuntimeError: rank 0 failed: ZeroDivisionError: division by zero"
    # rank 0's barrier failed while rank 1 stayed away (rank 1 saw the release rank 0
    # wrote after it, before giving up itself), after waiting about TIMEOUT_S: seconds, not
    # milliseconds (the lower bound) nor the default 30 minutes (rank 1's wait)
    assert "barrier" in r0 and r0["waited_s"] >= TIMEOUT_S * 0.5, r0
    assert r1["released"] is True, r1


def _show_rank(rank: int) -> None:
    import os

    print(f"rank {rank}: RANK={os.environ.get('RANK')} WORLD_SIZE="
          f"{os.environ.get('WORLD_SIZE')} OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} "
          f"X={os.environ.get('X')}")


def test_fork_ranks_variables_logs_failures_and_limit(tmp_path):
    """distributed.fork_ranks (the tests' ranks and bench/scale.py --tiny): torchrun's
    variables, or none (a plain one-process command); each rank's output in its log; a
    rank's error raised in the caller; ranks past the limit killed, TimeoutError."""
    from eagle3lab.distributed import fork_ranks as fork

    def logs(tag):
        return lambda rank: str(tmp_path / f"{tag}{rank}.log")

    fork(_show_rank, world=2, env={"X": "y"}, logs=logs("tr"), poll_s=0.1)
    assert [(tmp_path / f"tr{r}.log").read_text() for r in (0, 1)] == [
        f"rank {r}: RANK={r} WORLD_SIZE=2 OMP_NUM_THREADS=1 X=y\n" for r in (0, 1)]
    fork(_show_rank, world=1, torchrun_vars=False, logs=logs("plain"), poll_s=0.1)
    assert (tmp_path / "plain0.log").read_text() == \
        "rank 0: RANK=None WORLD_SIZE=None OMP_NUM_THREADS=1 X=None\n"

    def fail(rank):
        if rank == 1:
            raise ValueError("planted in rank 1")

    with pytest.raises(Exception, match="planted in rank 1"):
        fork(fail, world=2, poll_s=0.1)
    with pytest.raises(TimeoutError, match="did not finish within 0.5 s"):
        fork(lambda rank: time.sleep(120), world=2, limit_s=0.5, poll_s=0.1)
