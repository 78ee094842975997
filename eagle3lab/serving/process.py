"""Process groups for servers: start one, stop all of it, prove nothing survived, and
dump the Python stacks of every member.

Prevents orphaned GPU servers and wrong kills. SGLang starts a scheduler process per rank
and a detokenizer beside the HTTP server; killing the launcher by pid (or `pkill -f
sglang`, which also kills other people's servers) leaves ranks holding GPU memory. Here a
server is started as the leader of its own session and process group, `stop_group`
signals exactly that group (SIGTERM, then SIGKILL after a grace period) and then checks
that no member is left, and `dump_stacks` records where each member was stuck before a
hung server is stopped: with py-spy when it can attach, else (for Python processes we
started with `faulthandler.register(SIGUSR1)`, such as the reference server) by asking
the process to write its own stacks into its log.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil


def start_group(argv: list[str], *, log_path: str | Path, env: dict[str, str] | None = None,
                cwd: str | Path | None = None) -> subprocess.Popen:
    """Start `argv` as the leader of a new session/process group, stdout+stderr -> log_path
    (appended to)."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=full_env,
                                cwd=str(cwd) if cwd else None, start_new_session=True)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def group_members(pgid: int, leader: psutil.Process | None = None) -> list[psutil.Process]:
    """Live processes of process group `pgid` (zombies excluded), plus any descendant of
    the leader that moved to another group (it is still this server's)."""
    found: dict[int, psutil.Process] = {}
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid:
                found[pid] = psutil.Process(pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    if leader is not None:
        with contextlib.suppress(psutil.Error):
            for child in leader.children(recursive=True):
                found.setdefault(child.pid, child)
    return [p for p in found.values() if _alive(p)]


def describe(procs: list[psutil.Process]) -> list[dict[str, Any]]:
    """pid, status, name and cpu time of each process (for the watchdog and reports)."""
    out = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            with p.oneshot():
                cpu = p.cpu_times()
                out.append({"pid": p.pid, "status": p.status(), "name": p.name(),
                            "cmdline": " ".join(p.cmdline())[:200],
                            "cpu_s": round(cpu.user + cpu.system, 2)})
    return out


def stop_group(proc: subprocess.Popen, *, grace_s: float = 10.0) -> dict[str, Any]:
    """End the process group led by `proc`: SIGTERM, wait up to grace_s, then SIGKILL.

    Returns what happened; raises RuntimeError (naming the pids) if a member survives
    SIGKILL, which only an uninterruptible (D-state) process can do.
    """
    pgid = proc.pid
    leader = None
    with contextlib.suppress(psutil.Error):
        leader = psutil.Process(proc.pid)
    report: dict[str, Any] = {"pgid": pgid, "signals": [], "killed_pids": []}
    members = group_members(pgid, leader)
    if not members and proc.poll() is not None:
        report["returncode"] = proc.returncode
        return report
    report["killed_pids"] = sorted(p.pid for p in members)
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        report["signals"].append(sig.name)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        for p in members:  # descendants that left the group
            with contextlib.suppress(psutil.Error):
                if os.getpgid(p.pid) != pgid:
                    p.send_signal(sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader so it does not linger as a zombie
            members = [p for p in members if _alive(p)]
            if not members:
                break
            time.sleep(0.05)
        if not members:
            break
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    report["returncode"] = proc.returncode
    survivors = [p.pid for p in group_members(pgid, None) if _alive(p)]
    if survivors:
        raise RuntimeError(f"Process group {pgid}: pids {survivors} survived SIGKILL "
                           f"(uninterruptible I/O or a GPU driver call); check `ps -o "
                           f"pid,stat,wchan -p {','.join(map(str, survivors))}`.")
    return report


def py_spy_path() -> str | None:
    """py-spy next to this interpreter (the venv) or on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def _is_python(p: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return "python" in p.name().lower() or "python" in (p.cmdline() or [""])[0]
    return False


def dump_stacks(procs: list[psutil.Process], out_dir: str | Path, *,
                log_path: str | Path | None = None, faulthandler_ok: bool = False,
                timeout_s: float = 20.0) -> dict[str, Any]:
    """Write the Python stacks of each process to out_dir/stacks-PID.txt.

    Tries py-spy first (`py-spy dump --pid PID`; needs ptrace permission). For a process
    py-spy cannot read, and only when `faulthandler_ok` says the process registered
    `faulthandler.register(SIGUSR1)` (a process without that handler would be killed by
    SIGUSR1), sends SIGUSR1 and copies what it wrote to `log_path`. Returns
    {"method": ..., "files": [...], "errors": [...]} saying which method ran per pid.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    spy = py_spy_path()
    result: dict[str, Any] = {"py_spy": spy, "files": [], "errors": [], "methods": {}}
    for p in procs:
        if not _is_python(p):
            continue
        target = out_dir / f"stacks-{p.pid}.txt"
        if spy:
            try:
                r = subprocess.run([spy, "dump", "--pid", str(p.pid)], capture_output=True,
                                   text=True, timeout=timeout_s)
                if r.returncode == 0 and r.stdout.strip():
                    target.write_text(r.stdout)
                    result["files"].append(str(target))
                    result["methods"][p.pid] = "py-spy"
                    continue
                result["errors"].append(f"py-spy pid {p.pid}: {(r.stderr or r.stdout).strip()[:300]}")
            except (subprocess.TimeoutExpired, OSError) as e:
                result["errors"].append(f"py-spy pid {p.pid}: {e}")
        if faulthandler_ok and log_path is not None:
            text = _faulthandler_dump(p, Path(log_path))
            if text:
                target.write_text(text)
                result["files"].append(str(target))
                result["methods"][p.pid] = "faulthandler"
                continue
            result["errors"].append(f"faulthandler pid {p.pid}: nothing written to the log")
        result["methods"].setdefault(p.pid, "none")
    used = set(result["methods"].values()) - {"none"}
    result["method"] = "+".join(sorted(used)) if used else "none"
    return result


def _faulthandler_dump(p: psutil.Process, log_path: Path, wait_s: float = 1.0) -> str:
    before = log_path.stat().st_size if log_path.exists() else 0
    try:
        p.send_signal(signal.SIGUSR1)
    except psutil.Error:
        return ""
    time.sleep(wait_s)
    with open(log_path, "rb") as f:
        f.seek(before)
        text = f.read().decode("utf-8", errors="replace")
    return text if ("Thread 0x" in text or "Stack (most recent" in text
                    or "Current thread" in text) else ""
