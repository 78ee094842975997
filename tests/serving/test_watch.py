"""The watchdog and process groups against real processes: a start that hangs after
SGLang's start-up lines (detected within the silence window, stacks dumped, group killed),
one that dies with a traceback, one that ignores SIGTERM, one that exits; no orphans."""

import time

import pytest

from server_fakes import CLEAN_EXIT, CRASHED, HUNG, STUBBORN, read
from eagle3lab.serving import process, watch
from eagle3lab.serving.launch import start_command

SILENCE_S, POLL_S = 2.0, 0.2


class PollClock:
    """The watchdog's clock (watch.py's `time`): it advances by the polls' sleeps only (each
    also slept for real), so the silence measured at the verdict counts the polls that saw
    no new log line, however slowly this shared machine runs each poll."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        time.sleep(s)
        self.now += s


def test_hung_start_is_detected_stacks_dumped_group_killed(tmp_path, fake_script, no_orphans,
                                                          monkeypatch):
    h = start_command(fake_script(HUNG), run_dir=tmp_path / "run", name="fake",
                      faulthandler_ok=True)
    seen = []
    monkeypatch.setattr(watch, "time", PollClock())
    st = h.watchdog(silence_s=SILENCE_S, poll_s=POLL_S).wait(60, on_change=seen.append)
    assert st["verdict"] == "hung", st
    # said at the first poll past the silence window, not later
    assert SILENCE_S <= st["silence_s"] <= SILENCE_S + POLL_S + 1e-6, st["silence_s"]
    assert st["phase"] == "cuda-graph-capture"
    assert "--cuda-graph-max-bs" in st["causes"][0]["fix"]
    assert "NVML" in st["gpu_note"] or st["gpu_utilisation"] is not None
    assert [s["verdict"] for s in seen][0] == "starting"
    stacks = st["stacks"]
    assert stacks["method"] in ("py-spy", "faulthandler", "faulthandler+py-spy"), stacks
    text = "\n".join(read(f) for f in stacks["files"])
    assert "capture_cuda_graph" in text, stacks  # the leader's frame
    if stacks["method"] == "py-spy":
        assert len(stacks["files"]) == 2 and "wait_for_nccl_peer" in text  # the rank too
    assert st["stop"]["signals"][0] == "SIGTERM" and len(st["stop"]["killed_pids"]) == 2
    assert not process.group_members(h.pgid)
    assert (tmp_path / "run" / "fake.watch.json").exists()


def test_faulthandler_fallback_when_py_spy_is_unavailable(tmp_path, fake_script, no_orphans,
                                                          monkeypatch):
    monkeypatch.setattr(process, "py_spy_path", lambda: None)
    h = start_command(fake_script(HUNG), run_dir=tmp_path / "run", name="fake",
                      faulthandler_ok=True)
    st = h.watchdog(silence_s=SILENCE_S, poll_s=0.2).wait(60)
    assert st["verdict"] == "hung"
    assert st["stacks"]["method"] == "faulthandler"
    assert "capture_cuda_graph" in "".join(read(f) for f in st["stacks"]["files"])
    assert not process.group_members(h.pgid)


def test_crash_with_traceback(tmp_path, fake_script, no_orphans):
    h = start_command(fake_script(CRASHED), run_dir=tmp_path / "run", name="fake")
    st = h.watchdog(silence_s=30, poll_s=0.2).wait(60)
    assert st["verdict"] == "crashed"
    assert "RuntimeError: CUDA error: out of memory" in st["reason"]
    assert st["phase"] == "cuda-graph-capture"
    assert any(f["code"] == "server-crashed" for f in st["findings"])
    assert h.proc.returncode == 1 and not process.group_members(h.pgid)


def test_clean_exit_is_exited(tmp_path, fake_script, no_orphans):
    h = start_command(fake_script(CLEAN_EXIT), run_dir=tmp_path / "run", name="fake")
    st = h.watchdog(silence_s=30, poll_s=0.2).wait(30)
    assert st["verdict"] == "exited" and st["returncode"] == 0
    again = start_command(fake_script(CRASHED), run_dir=tmp_path / "run", name="fake")
    assert again.watchdog(silence_s=30, poll_s=0.2).wait(30)["verdict"] == "crashed"
    assert "nothing to do" in read(tmp_path / "run" / "fake.1.log")  # the first start
    assert "nothing to do" not in read(again.log_path)  # one start per log


def test_stop_kills_after_grace_when_term_is_ignored(tmp_path, fake_script, no_orphans):
    h = start_command(fake_script(STUBBORN), run_dir=tmp_path / "run", name="fake")
    deadline = time.monotonic() + 20
    while "ignoring SIGTERM" not in read(h.log_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    rep = h.stop(grace_s=1.0)
    assert rep["signals"] == ["SIGTERM", "SIGKILL"] and h.proc.returncode == -9
    assert h.stop() is rep  # idempotent
    assert "stopped process group" in read(h.log_path)


def test_dump_stacks_ignores_non_python(tmp_path, no_orphans):
    h = start_command(["sleep", "30"], run_dir=tmp_path / "run", name="sleep")
    try:
        res = process.dump_stacks(h.members(), tmp_path / "stacks")
        assert res["files"] == [] and res["method"] == "none"
    finally:
        h.stop(grace_s=2)


@pytest.mark.parametrize("host,outside", [("127.0.0.1", False), ("0.0.0.0", True)])
def test_exposure_note(host, outside):
    from eagle3lab.serving.launch import exposure_note

    note = exposure_note(host)
    assert (note is not None) == outside
    if outside:
        assert "reachable from outside" in note
