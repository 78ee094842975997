"""Fixtures for the live-server tests: fake SGLang processes written as small Python
scripts, and a check that no process a test started outlives it."""

from __future__ import annotations

import contextlib
import sys
import textwrap
import time

import psutil
import pytest

from server_fakes import processes_mentioning


@pytest.fixture
def fake_script(tmp_path):
    """Write a fake server script under tmp_path; returns the argv that runs it."""
    def make(body: str, name: str = "fake_server.py") -> list[str]:
        path = tmp_path / name
        path.write_text(textwrap.dedent(body))
        return [sys.executable, str(path)]
    return make


def _servers_since(t0: float) -> list[psutil.Process]:
    out = []
    for p in processes_mentioning("eagle3lab serve"):
        try:
            if p.create_time() >= t0 - 1 and p.is_running():
                out.append(p)
        except psutil.Error:
            continue
    return out


@pytest.fixture
def no_orphans(tmp_path):
    """After the test, no live process refers to this test's tmp_path (scripts, run dirs),
    and no `eagle3lab serve` process started during the test is still alive."""
    t0 = time.time()
    yield
    deadline = time.monotonic() + 5
    while processes_mentioning(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = processes_mentioning(str(tmp_path))
    for p in left:  # clean up so one failure does not leak into the next test
        try:
            p.kill()
        except psutil.Error:
            pass
    assert not left, f"orphan processes: {[(p.pid, p.cmdline()) for p in left]}"
    deadline = time.monotonic() + 5
    while _servers_since(t0) and time.monotonic() < deadline:
        time.sleep(0.1)
    servers = [(p.pid, " ".join(p.cmdline())) for p in _servers_since(t0)]
    assert not servers, f"reference servers outlived the test: {servers}"


@pytest.fixture(scope="session")
def tiny_spec_server(tmp_path_factory, tiny_target_dir):
    """One reference server for the session: the tiny random target with an untrained
    drafter (3 steps), CPU, started by the launcher and its watchdog; stopped at the end.
    Greedy, its answers equal plain greedy decoding token for token (fp32)."""
    from eagle3lab.formats.demo import make_speculators_draft

    draft = make_speculators_draft(tmp_path_factory.mktemp("draft") / "d",
                                   target=tiny_target_dir)
    with reference_server(tmp_path_factory, target=tiny_target_dir, draft=draft,
                          silence_s=60, wait_s=120) as h:
        yield h


@contextlib.contextmanager
def reference_server(tmp_path_factory, *, target, draft, silence_s: float, wait_s: float):
    """A speculative reference server (3 steps, CPU) started by the launcher, ready by its
    watchdog's verdict within `wait_s`; stopped on leaving."""
    from eagle3lab.engines.argv import LaunchConfig
    from eagle3lab.serving.launch import start

    cfg = LaunchConfig(engine="reference", target=str(target), draft=str(draft), steps=3,
                       port=0, device="cpu")
    h = start(cfg, run_dir=tmp_path_factory.mktemp("run"), name="speculative", force=True)
    try:
        st = h.watchdog(silence_s=silence_s, poll_s=0.2).wait(wait_s)
        assert st["verdict"] == "ready", st
        yield h
    finally:
        h.stop()
