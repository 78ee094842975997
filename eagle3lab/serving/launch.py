"""A launch config started in its own process group, checked first, with a handle that
stops all of it.

Prevents the launch failures that cost a GPU node minutes each: a command SGLang's own
parser refuses (`check_argv_with_sglang`, eagle3lab/engines/sglang_parser.py, before any
process), a launch that cannot work (with a draft, the launch's preflight:
eagle3lab/preflight/; an error refuses the start unless `force`), a server listening on
every interface by accident (127.0.0.1 unless asked, and then the handle says it is
reachable from outside), and servers outliving the notebook (the handle's `stop()` ends the
whole process group and verifies it; `process.py`). The command itself is the
`LaunchConfig`'s argv (eagle3lab/engines/argv.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3lab.distributed import free_port
from eagle3lab.engines.sglang_parser import check_argv_with_sglang
from eagle3lab.errors import UserError
from eagle3lab.fsutil import atomic_write_json
from eagle3lab.preflight.run import PreflightRefused, preflight_launch
from eagle3lab.serving import process
from eagle3lab.serving.watch import Watchdog

if TYPE_CHECKING:
    from eagle3lab.engines.argv import LaunchConfig

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def exposure_note(host: str) -> str | None:
    """A sentence for the user when the server will be reachable from other machines."""
    if host in LOOPBACK or host.startswith("127."):
        return None
    return (f"The server binds to {host}: it is reachable from outside this machine (anyone "
            f"who can reach this host can send it requests). Use 127.0.0.1 to keep it local.")


@dataclasses.dataclass
class ServerHandle:
    """A started server: its process group, log, URL; `stop()` ends all of it."""

    name: str
    argv: list[str]
    url: str | None
    log_path: Path
    run_dir: Path
    proc: subprocess.Popen
    config: LaunchConfig | None = None
    check: dict[str, Any] | None = None
    preflight: dict[str, Any] | None = None  # PreflightReport.to_dict() of this launch
    notes: list[str] = dataclasses.field(default_factory=list)
    faulthandler_ok: bool = False  # the process registered faulthandler on SIGUSR1
    started_at: float = dataclasses.field(default_factory=time.time)
    stop_report: dict[str, Any] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def pgid(self) -> int:
        return self.proc.pid  # the leader of its own session/group

    def running(self) -> bool:
        return self.proc.poll() is None

    def members(self):
        return process.group_members(self.pgid)

    def stop(self, grace_s: float = 10.0) -> dict[str, Any]:
        """SIGTERM the group, SIGKILL after grace_s, verify no member survives. Idempotent."""
        if self.stop_report is None:
            self.stop_report = process.stop_group(self.proc, grace_s=grace_s)
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(f"# eagle3lab: stopped process group {self.pgid} "
                        f"({', '.join(self.stop_report['signals']) or 'already exited'}), "
                        f"exit code {self.stop_report.get('returncode')}\n")
        return self.stop_report

    def watchdog(self, **kwargs):
        return Watchdog(self, **kwargs)

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_command(argv: list[str], *, run_dir: str | Path, name: str = "server",
                  url: str | None = None, env: dict[str, str] | None = None,
                  faulthandler_ok: bool = False, config: LaunchConfig | None = None,
                  check: dict[str, Any] | None = None,
                  preflight: dict[str, Any] | None = None) -> ServerHandle:
    """Start any server command in its own process group, logging to RUN_DIR/NAME.log (an
    earlier NAME.log is renamed NAME.N.log, so each log holds one start)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / f"{name}.log"
    if log_path.exists() and log_path.stat().st_size:  # keep an earlier attempt's log aside
        n = 1
        while (run_dir / f"{name}.{n}.log").exists():
            n += 1
        log_path.rename(run_dir / f"{name}.{n}.log")
    atomic_write_json(run_dir / f"{name}.launch.json", {
        "argv": argv, "url": url, "env": env or {}, "started": dt.datetime.now().isoformat(),
        "config": config.model_dump() if config else None, "sglang_check": check,
        "preflight": preflight})
    proc = process.start_group(argv, log_path=log_path, env=env)
    return ServerHandle(name=name, argv=argv, url=url, log_path=log_path, run_dir=run_dir,
                        proc=proc, config=config, check=check, preflight=preflight,
                        faulthandler_ok=faulthandler_ok)


def start(config: LaunchConfig, *, run_dir: str | Path, name: str | None = None,
          check: bool = True, force: bool = False, preflight=None) -> ServerHandle:
    """Check (SGLang's parser where sglang imports; with a draft, the whole launch's
    preflight: eagle3lab/preflight/) and start the server of `config`. A preflight error
    refuses the start (`PreflightRefused`, naming every finding) unless `force`;
    `preflight`: a PreflightReport already made for this config (notebook 04 shows it)."""
    if config.port == 0:
        config = config.model_copy(update={"port": free_port(config.host)})
    argv = config.to_argv()
    notes = []
    result = None
    if config.engine == "sglang" and check:
        result = check_argv_with_sglang(argv, python=config.python)
        if result["status"] == "invalid":
            raise UserError(f"SGLang rejects the launch command: {result['reason']}. "
                            f"Command: {' '.join(argv)}")
        if result["status"] == "unavailable":
            notes.append(f"Launch command not checked with SGLang's parser: {result['reason']}")
        elif result.get("stubbed"):
            notes.append("Launch command checked with SGLang's prepare_server_args "
                         f"(stand-in for {', '.join(result['stubbed'])}, not installed here).")
    report = None
    if check and config.draft:
        report = preflight or preflight_launch(config, parser_result=result)
        if not report.ok and not force:
            raise PreflightRefused(report, name or config.engine)
        if not report.ok and config.engine == "reference":
            argv.append("--force")  # the reference server runs the same preflight itself
        notes += [f"Preflight {f.severity} [{f.code}]: {f.message}" for f in report.findings
                  if f.severity == "error" or f.severity == "warning"]
    note = exposure_note(config.host)
    if note:
        notes.append(note)
    handle = start_command(argv, run_dir=run_dir, name=name or config.engine,
                           url=config.url, env=config.env or None,
                           faulthandler_ok=config.engine == "reference", config=config,
                           check=result, preflight=report.to_dict() if report else None)
    handle.notes = notes
    return handle
