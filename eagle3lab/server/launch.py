"""A typed launch config -> the exact server command, checked, started in its own process
group, with a handle that stops all of it.

Prevents the launch failures that cost a GPU node minutes each: a misspelt or renamed flag
(checked with SGLang's own `prepare_server_args` before launch, where sglang imports;
`sglang_check.py`), a chain draft whose `--speculative-num-draft-tokens` SGLang silently
overrides (with topk 1 it is forced to steps + 1 by SGLang's server_args.py), a
server listening on every interface by accident (127.0.0.1 unless asked, and then the
handle says it is reachable from outside), and servers outliving the notebook (the handle's
`stop()` ends the whole process group and verifies it; `process.py`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from eagle3lab.config import StrictConfig
from eagle3lab.errors import UserError
from eagle3lab.fsutil import atomic_write_json
from eagle3lab.server import process

LOOPBACK = ("127.0.0.1", "localhost", "::1")

#: SGLang renamed --cuda-graph-max-bs to --cuda-graph-max-bs-decode (0.5.15 has the new
#: name; 0.5.23 rejects the old one as ambiguous). (first release with the name, flag).
CUDA_GRAPH_MAX_BS_FLAGS = [((0, 5, 15), "--cuda-graph-max-bs-decode"),
                           ((0, 0, 0), "--cuda-graph-max-bs")]
#: The release requirements-sglang-cpu.txt pins; the default when none is installed.
PINNED_SGLANG = "0.5.23"


class LaunchConfig(StrictConfig):
    WHERE: ClassVar[str] = "launch config"

    target: str = Field(min_length=1, description="target model: HF directory (sglang) or "
                        "directory/preset name (reference)")
    draft: str | None = Field(None, description="EAGLE-3 draft checkpoint; None serves "
                              "without speculation")
    engine: Literal["sglang", "vllm", "reference"] = Field(
        "sglang", description="vllm: `python -m vllm.entrypoints.cli.main serve` (= `vllm serve`); "
        "reference: eagle3lab serve (CPU)")
    tp: int = Field(1, ge=1, description="tensor parallel size (sglang --tp-size); reference: "
                    "must be 1")
    speculative_algorithm: str = Field("EAGLE3", description="used only with a draft")
    steps: int = Field(3, ge=1, description="--speculative-num-steps: draft forward passes "
                       "per verify")
    topk: int = Field(1, ge=1, description="--speculative-eagle-topk: 1 = chain drafting")
    draft_tokens: int | None = Field(None, description="--speculative-num-draft-tokens; "
                                     "None: steps + 1")
    cuda_graph: bool = Field(True, description="False adds --disable-cuda-graph (debugging a "
                             "hang)")
    cuda_graph_max_bs: int | None = Field(None, description="lower it when CUDA-graph capture "
                                          "hangs or OOMs")
    max_running_requests: int | None = Field(None, description="SGLang resets it to 48 with "
                                             "speculation")
    host: str = Field("127.0.0.1", description="anything else makes the server reachable "
                      "from outside")
    port: int = Field(30000, ge=0, le=65535, description="0: pick a free port at start()")
    device: str = Field("auto", description="reference engine only: cpu, cuda or auto")
    extra_args: list[str] = Field(default_factory=list, description="appended verbatim, one "
                                  "argv item each")
    env: dict[str, str] = Field(default_factory=dict, description="e.g. NCCL_DEBUG: INFO")
    python: str | None = Field(None, description="interpreter that runs the server; None: "
                               "this one")
    sglang_version: str | None = Field(None, description="release the argv is for; None: "
                                       "installed/pinned")

    def check(self, where: str) -> None:
        if self.engine == "reference" and self.tp != 1:
            raise ValueError(f"tp={self.tp}; expected 1 for the reference engine (one "
                             f"process, one device)")
        if self.draft and self.topk == 1 and self.draft_tokens not in (None, self.steps + 1):
            raise ValueError(
                f"draft_tokens={self.draft_tokens} with topk=1: a chain verifies steps + 1 = "
                f"{self.steps + 1} tokens and SGLang overrides the value silently. Set "
                f"draft_tokens to {self.steps + 1} or leave it None")
        if self.engine == "vllm" and self.draft and self.topk != 1:
            raise ValueError(f"topk={self.topk} with engine vllm: vLLM's EAGLE-3 drafts a "
                             f"chain of num_speculative_tokens (= steps); set topk 1 (a "
                             f"tree needs speculative_token_tree in extra_args' config)")
        if self.engine == "vllm" and self.cuda_graph_max_bs is not None:
            raise ValueError("cuda_graph_max_bs is SGLang's flag; for vLLM pass your "
                             "release's capture-size flag in extra_args")
        if self.draft and self.topk > 1 and self.draft_tokens is None:
            raise ValueError("topk > 1 (tree drafting) needs draft_tokens, the number of tree "
                             "nodes verified per step (e.g. 8 or 16)")

    @property
    def effective_draft_tokens(self) -> int | None:
        if not self.draft:
            return None
        return self.steps + 1 if self.topk == 1 else self.draft_tokens

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def to_argv(self) -> list[str]:
        """The exact command line (the interpreter first)."""
        py = self.python or sys.executable
        if self.engine == "reference":
            argv = [py, "-m", "eagle3lab", "serve", "--target", self.target,
                    "--host", self.host, "--port", str(self.port), "--device", self.device]
            if self.draft:
                argv += ["--draft", self.draft, "--steps", str(self.steps), "--topk",
                         str(self.topk), "--draft-tokens", str(self.effective_draft_tokens)]
            return argv + list(self.extra_args)
        if self.engine == "vllm":
            return self._vllm_argv(py)
        argv = [py, "-m", "sglang.launch_server", "--model-path", self.target,
                "--tp-size", str(self.tp), "--host", self.host, "--port", str(self.port)]
        if self.draft:
            argv += ["--speculative-algorithm", self.speculative_algorithm,
                     "--speculative-draft-model-path", self.draft,
                     "--speculative-num-steps", str(self.steps),
                     "--speculative-eagle-topk", str(self.topk),
                     "--speculative-num-draft-tokens", str(self.effective_draft_tokens)]
        if not self.cuda_graph:
            argv.append("--disable-cuda-graph")
        if self.cuda_graph_max_bs is not None:
            argv += [_cuda_graph_max_bs_flag(self.sglang_version), str(self.cuda_graph_max_bs)]
        if self.max_running_requests is not None:
            argv += ["--max-running-requests", str(self.max_running_requests)]
        return argv + list(self.extra_args)


    def _vllm_argv(self, py: str) -> list[str]:
        """`python -m vllm.entrypoints.cli.main serve T ...`: the `vllm` script's own module
        (vllm-0.25.1.dist-info/entry_points.txt), run by `py`, so an install without
        scripts beside the interpreter (`pip install --target`, docs/vllm.md) works too.
        Flags from vllm/engine/arg_utils.py `EngineArgs`: --tensor-parallel-size,
        --speculative-config as JSON with method, model, num_speculative_tokens
        (vllm/config/speculative.py), --enforce-eager, --max-num-seqs; host/port from
        vllm/entrypoints/openai/cli_args.py."""
        argv = [py, "-m", "vllm.entrypoints.cli.main", "serve", self.target, "--host",
                self.host, "--port", str(self.port), "--tensor-parallel-size", str(self.tp)]
        if self.draft:
            argv += ["--speculative-config", json.dumps({
                "method": "eagle3", "model": self.draft,
                "num_speculative_tokens": self.steps})]
        if not self.cuda_graph:
            argv.append("--enforce-eager")
        if self.max_running_requests is not None:
            argv += ["--max-num-seqs", str(self.max_running_requests)]
        return argv + list(self.extra_args)


def version_tuple(v: str) -> tuple[int, ...]:
    """'0.5.23' -> (0, 5, 23); suffixes such as 'rc1' or '+cu128' are ignored."""
    parts = []
    for p in v.split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def installed_sglang_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def _cuda_graph_max_bs_flag(version: str | None) -> str:
    v = version_tuple(version or installed_sglang_version() or PINNED_SGLANG)
    return next(flag for first, flag in CUDA_GRAPH_MAX_BS_FLAGS if v >= first)


def exposure_note(host: str) -> str | None:
    """A sentence for the user when the server will be reachable from other machines."""
    if host in LOOPBACK or host.startswith("127."):
        return None
    return (f"The server binds to {host}: it is reachable from outside this machine (anyone "
            f"who can reach this host can send it requests). Use 127.0.0.1 to keep it local.")


def check_argv_with_sglang(argv: list[str], *, python: str | None = None,
                           timeout_s: float = 120.0) -> dict[str, Any]:
    """Run SGLang's `prepare_server_args` on the arguments of an SGLang command line.

    Returns {"status": "ok"|"invalid"|"unavailable", "reason", "parsed", "stubbed",
    "messages"}; "unavailable" (sglang or one of its imports missing) is not an error.
    """
    if "sglang.launch_server" in argv:
        argv = argv[argv.index("sglang.launch_server") + 1:]
    script = Path(__file__).with_name("sglang_check.py")
    # run_path, not `python script.py`: that would put eagle3lab/server/ first on sys.path,
    # where our warnings.py would shadow the standard library's for sglang and torch.
    runner = f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"
    try:
        r = subprocess.run([python or sys.executable, "-c", runner, *argv], capture_output=True,
                           text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "unavailable", "reason": f"the check took over {timeout_s:.0f} s",
                "parsed": None, "stubbed": [], "messages": []}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        return {"status": "unavailable", "reason": "the check printed no result: "
                + " | ".join(tail), "parsed": None, "stubbed": [], "messages": tail}
    return json.loads(lines[-1])


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host not in ("0.0.0.0", "localhost") else "127.0.0.1", 0))
        return s.getsockname()[1]


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
        from eagle3lab.server.watch import Watchdog

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
        from eagle3lab.preflight.run import PreflightRefused, preflight_launch

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
