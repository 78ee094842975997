"""SGLang and vLLM log lines -> start-up phases, a verdict, decode statistics and findings.

Prevents reading a server's state wrong from a raw log: a start that hung for ten minutes
looks like a slow start, a scheduler traceback scrolls past under import-error noise, and
an accept length stuck at 1.00 (a drafter that is loaded but never accepted, e.g. fed
the wrong aux layers: eagle3lab/targets/auxlayers.py) looks like a working speculative server. `LogAnalyzer` is fed lines one at
a time (a saved log, or a growing one via `follow`), keeps raw counts, and `report()`
returns the JSON object of `eagle3lab logs --json`.

The format is detected per line: a vLLM-stamped line (vllm_format.py, which cites vLLM's
source for each line it reads) makes the log a vLLM log (`format`), whose phases, crash
markers, stats lines and `SpecDecoding metrics` lines (accept length, acceptance rate and
per-position acceptance) fill the same phases and decode table; lines neither parser
knows are kept (counted, timed when stamped, matched against the warnings catalogue).

Formats, read from the SGLang source (sgl-project/sglang, python/sglang/srt/):
- timestamps: `utils/common.py` `configure_logger`: `[%(asctime)s{.msecs}{prefix}] msg`,
  datefmt `%Y-%m-%d %H:%M:%S`; the prefix holds rank tags (`managers/scheduler.py`:
  ` DP0`, ` PP0`, ` TP0`, ` EP0`, ...); Ray launches put `(Actor pid=N)` in front.
- `Decode batch, #running-req: N, #token: T, token usage: U, [accept len: X, [accept rate:
  Y, ]]cuda graph: B, gen throughput (token/s): G, #queue-req: Q` from
  `managers/scheduler_metrics_mixin.py` (newer: `managers/scheduler_components/
  metrics_reporter.py`); older releases print no `accept rate`; hybrid models print
  `#full token`/`full token usage`; CPU/NPU servers say `cpu graph`/`npu graph`.
- start-up: `model_executor/model_runner.py` (`Load weight begin/end`),
  `model_executor/model_runner.py` / `cuda_graph_setup.py` (`Capture cuda graph begin`,
  newer `Capture decode CUDA graph begin`), `entrypoints/http_server.py` (`The server is
  fired up and ready to roll!`), `entrypoints/engine.py` (scheduler died / sigquit).
- shutdown (0.5.23): `managers/tokenizer_manager.py` `SignalHandler.sigterm_handler`
  (`SIGTERM received. signum=... Draining requests and shutting down...`) and
  `sigterm_watchdog` (`Gracefully exiting... Remaining number of requests N. ...`).

Shutdown, both engines: uvicorn's lines (`Shutting down`, `Waiting for application
shutdown.`, `Application shutdown complete.`, `Finished server process [N]`), each
engine's own (above; vLLM's in vllm_format.py), the reference server's (`Received SIGTERM;
shutting down.`, `Shutdown complete.`) and the line eagle3lab's launcher appends when it
stops a server (`# eagle3lab: stopped process group PGID (SIGTERM[, SIGKILL]), exit code
N`, `ServerHandle.stop` in launch.py; `(already exited)` when the process had ended by
itself). The first one ends the log's life: verdict `exited` (the decode statistics read
before it are kept), phase `shutdown`, and the crash markers and tracebacks that follow
it (processes killed mid-call while the group is stopped) are listed under
`shutdown.errors` instead of making the log `crashed`; a crash before it stays a crash.
A process that had exited by itself with a non-zero code and left no crash marker is
`crashed`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from pathlib import Path
from typing import Any, Iterable

from eagle3lab.errors import UserError
from eagle3lab.serverlogs import vllm_format
from eagle3lab.serverlogs.catalogue import WarningTally, hang_cause

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_STAMP = re.compile(
    r"^(?P<prefix>.*?)\[(?P<date>\d{4}-\d{2}-\d{2}) (?P<clock>\d{2}:\d{2}:\d{2})"
    r"(?:[.,](?P<frac>\d{1,6}))?(?P<tags>(?: [^\]\s]+)*)\]\s?(?P<msg>.*)$")

#: (phase, pattern over a message). A phase is entered when its line appears.
PHASES: list[tuple[str, re.Pattern]] = [
    ("launch", re.compile(r"^server_args=|^Launch command:")),
    ("init-distributed", re.compile(r"^Init torch distributed begin")),
    ("load-weights", re.compile(r"^Load weight begin")),
    ("weights-loaded", re.compile(r"^Load weight end")),
    ("kv-cache", re.compile(r"^KV Cache is allocated|^Memory pool end")),
    ("cuda-graph-capture", re.compile(r"^Capture (?:[\w -]+ )?(?:cuda|CUDA) graph begin")),
    ("cuda-graph-captured", re.compile(r"^Capture (?:[\w -]+ )?(?:cuda|CUDA) graph end")),
    ("http-server", re.compile(r"Uvicorn running on|Application startup complete|"
                               r"^HTTP server listening on")),
    ("ready", re.compile(r"The server is fired up and ready to roll!")),
]

_DECODE = re.compile(r"^Decode batch(?: \[\d+\])?[.,]\s*#running-req: (?P<running>\d+),"
                     r"(?P<rest>.*)$")
_PREFILL = re.compile(r"^Prefill batch(?: \[\d+\])?[.,]\s*#new-seq: (?P<seqs>\d+), "
                      r"#new-token: (?P<tokens>\d+)")
_FIELDS = {
    "token": (re.compile(r"(?:^|, )#(?:full )?token: (\d+)"), int),
    "token_usage": (re.compile(r"(?:^|, )(?:full )?token usage: ([0-9.]+)"), float),
    "accept_len": (re.compile(r"(?:^|, )accept len: ([0-9.]+)"), float),
    "accept_rate": (re.compile(r"(?:^|, )accept rate: ([0-9.]+)"), float),
    "gen_throughput": (re.compile(r"gen throughput \(token/s\): ([0-9.]+)"), float),
    "queue_req": (re.compile(r"#queue-req: (\d+)"), int),
}
_GRAPH = re.compile(r"(?:^|, )(\w+) graph: (True|False)")
_CRASH = re.compile(r"Traceback \(most recent call last\):|crashed with exit code|"
                    r"Scheduler hit an exception|"
                    r"scheduler died during initialization|"
                    r"Received sigquit from a child process|^eagle3lab \w+: error:")
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b.*$")
#: Shutdown lines shared by both engines and eagle3lab's reference server (vLLM's own are
#: `vllm_format.SHUTDOWN`); uvicorn's may sit under SGLang's stamp as `INFO:     ...`.
SHUTDOWN = re.compile(r"(?:^|INFO:\s+)(?:Shutting down$|Waiting for application shutdown\.|"
                      r"Application shutdown complete\.|Finished server process \[\d+\])|"
                      r"^SIGTERM received\. .*shutting down|^Gracefully exiting\.\.\.|"
                      r"^Received SIG\w+; shutting down\.$|^Shutdown complete\.$")
#: The line `ServerHandle.stop` (launch.py) appends to the log it stopped.
STOPPED = re.compile(r"^# eagle3lab: stopped process group (?P<pgid>\d+) \((?P<how>[^)]*)\), "
                     r"exit code (?P<rc>-?\d+|None)")
_CR = re.compile(rf"^(?P<prefix>{vllm_format.PROC_PREFIX})(?P<rest>.*)$")

#: accept len at or below this, on average over the decode lines, is "about 1.0".
COLLAPSE_ACCEPT_LEN = 1.05


@dataclasses.dataclass
class LogLine:
    lineno: int
    time: dt.datetime | None  # SGLang's local wall-clock time; None for untimed lines
    tags: tuple[str, ...]  # rank tags such as ("TP0",), empty without
    message: str  # the text after the timestamp (the whole line when untimed)
    engine: str | None = None  # "vllm" for a vLLM-stamped line; None otherwise


def _last_update(line: str) -> str:
    """A line holding carriage returns (a progress bar's updates, maybe followed by a log
    line written before the bar's newline) -> its last non-empty part, keeping a leading
    vLLM process prefix."""
    if "\r" not in line:
        return line
    m = _CR.match(line)
    parts = [p for p in m["rest"].split("\r") if p.strip()]  # type: ignore[index]
    return m["prefix"] + (parts[-1] if parts else "")  # type: ignore[index]


def parse_line(raw: str, lineno: int = 0) -> LogLine:
    """One log line, ANSI colours removed, a progress bar's last update kept; timestamp
    and rank tags split off (SGLang's stamp, else vLLM's: its tags are the process names
    and the level; an unstamped line under vLLM's process prefix or in uvicorn's format
    gets those as tags, without a time)."""
    line = _last_update(_ANSI.sub("", raw.rstrip("\r\n")))
    m = _STAMP.match(line)
    if not m:
        v = vllm_format.parse_stamp(line)
        if v is not None:
            return LogLine(lineno, v[0], v[1], v[2], "vllm")
        u = vllm_format.parse_unstamped(line)
        if u is not None:
            return LogLine(lineno, None, u[0], u[1])
        return LogLine(lineno, None, (), line)
    frac = (m["frac"] or "0").ljust(6, "0")
    t = dt.datetime.strptime(f"{m['date']} {m['clock']}", "%Y-%m-%d %H:%M:%S").replace(
        microsecond=int(frac))
    return LogLine(lineno, t, tuple(m["tags"].split()), m["msg"])


def parse_decode(message: str) -> dict[str, Any] | None:
    """The fields of a `Decode batch` message; None for any other message.

    accept_len / accept_rate are None when the server runs without speculation (SGLang
    prints neither then); accept_rate is None on releases that print only accept len.
    """
    m = _DECODE.match(message)
    if not m:
        return None
    rest = m["rest"].strip()
    out: dict[str, Any] = {"running_req": int(m["running"])}
    for name, (rx, cast) in _FIELDS.items():
        f = rx.search(rest)
        out[name] = cast(f.group(1)) if f else None
    g = _GRAPH.search(rest)
    out["graph"] = (g.group(2) == "True") if g else None
    return out


def _iso(t: dt.datetime | None) -> str | None:
    return t.isoformat(sep=" ") if t else None


class LogAnalyzer:
    """Accumulates a log, line by line; `report()` says where the server stands."""

    def __init__(self) -> None:
        self.lines = 0
        self.first_time: dt.datetime | None = None
        self.last_time: dt.datetime | None = None
        self.phases: list[dict[str, Any]] = []
        self.decode: list[dict[str, Any]] = []
        self.prefill_batches = 0
        self.crash: dict[str, Any] | None = None
        self.shutdown: dict[str, Any] | None = None  # the first shutdown line, see SHUTDOWN
        self.stop: dict[str, Any] | None = None  # eagle3lab's stop line (STOPPED)
        self.facts: dict[str, dict[str, Any]] = {}  # vllm_format.parse_facts, first seen
        self.drafter_lines: list[dict[str, Any]] = []  # lines where the drafter's load began
        #: `Model loading took` after a drafter line: target AND drafter weights are in
        #: (both runners print it once, after the drafter: vllm/v1/worker/gpu/
        #: model_runner.py:302, gpu_model_runner.py; a drafter whose weights do not fit
        #: crashes between the two, as the fc-dim fault did on vLLM 0.25.1)
        self.drafter_done: dict[str, Any] | None = None
        self.warnings = WarningTally()
        self._exc_into: dict[str, Any] | None = None  # takes the next exception line
        self.format = "sglang"  # "vllm" once a vLLM-stamped line is seen

    def feed(self, raw: str) -> LogLine:
        self.lines += 1
        ln = parse_line(raw, self.lines)
        msg = ln.message
        if ln.time is not None:
            self.first_time = self.first_time or ln.time
            self.last_time = ln.time
        if ln.engine == "vllm":
            self.format = "vllm"
        if self.shutdown is None:
            for name, rx in (vllm_format.PHASES if self.format == "vllm" else PHASES):
                if rx.search(msg):
                    self._enter(name, ln, msg)
                    break
        self._decode_line(ln, msg)
        for name, value in vllm_format.parse_facts(msg).items():
            self.facts.setdefault(name, {"value": value, "line": ln.lineno})
        if vllm_format.DRAFTER_BEGINS.search(msg) and len(self.drafter_lines) < 8:
            self.drafter_lines.append({"line": ln.lineno, "time": _iso(ln.time),
                                       "message": msg.strip()[:200]})
        elif self.drafter_lines and self.drafter_done is None and \
                vllm_format.MODEL_LOADED.search(msg):
            self.drafter_done = {"line": ln.lineno, "time": _iso(ln.time),
                                 "message": msg.strip()[:200]}
        self._lifecycle(ln, msg)
        self.warnings.feed(msg, ln.lineno)
        return ln

    def _enter(self, phase: str, ln: LogLine, msg: str) -> None:
        """Enter `phase` at this line; an unstamped line (uvicorn's under vLLM) takes the
        time of the last stamped line before it."""
        if not self.phases or self.phases[-1]["phase"] != phase:
            self.phases.append({"phase": phase, "time": _iso(ln.time or self.last_time),
                                "line": ln.lineno, "message": msg.strip()[:200]})

    def _decode_line(self, ln: LogLine, msg: str) -> None:
        d = parse_decode(msg) or vllm_format.parse_stats(msg)
        spec = None if d is not None else vllm_format.parse_spec(msg)
        if d is not None:
            self.decode.append({"time": _iso(ln.time), "line": ln.lineno,
                                "tags": " ".join(ln.tags), **d})
        elif spec is not None:  # vLLM prints it right after its stats line: merge
            last = self.decode[-1] if self.decode else None
            if last is None or last["accept_len"] is not None or "prompt_throughput" not in last:
                last = {"time": _iso(ln.time), "line": ln.lineno, "tags": " ".join(ln.tags),
                        **{k: None for k in ("running_req", "token", "token_usage",
                                             "gen_throughput", "queue_req", "graph")}}
                self.decode.append(last)
            last.update(accept_len=spec["accept_len"], accept_rate=spec["accept_rate"],
                        per_position=spec["per_position"], drafted=spec["drafted"],
                        accepted=spec["accepted"])
        elif _PREFILL.match(msg):
            self.prefill_batches += 1

    def _lifecycle(self, ln: LogLine, msg: str) -> None:
        """Crash markers (and the exception line after them), eagle3lab's stop line and the
        first shutdown line; a crash marker after the shutdown began is a shutdown error."""
        stopped = STOPPED.match(msg)
        if _CRASH.search(msg) or vllm_format.CRASH.search(msg):
            marker = {"line": ln.lineno, "marker": msg.strip()[:200], "error": None}
            if self.shutdown is None:
                self.crash = self.crash or marker
                self._exc_into = self.crash
            else:
                errors = self.shutdown["errors"]
                self.shutdown["error_lines"] += 1
                self._exc_into = marker if len(errors) < 5 else None
                if self._exc_into is not None:
                    errors.append(marker)
        elif self._exc_into is not None and _EXC_LINE.match(msg):
            self._exc_into["error"] = msg.strip()[:300]
            self._exc_into = None
        elif stopped:
            rc = None if stopped["rc"] == "None" else int(stopped["rc"])
            how = stopped["how"]
            signals = [] if how == "already exited" else [x.strip() for x in how.split(",")
                                                           if x.strip()]
            self.stop = {"line": ln.lineno, "signals": signals, "returncode": rc}
            if self.shutdown is not None or self.crash is not None:
                return
            if signals or not rc:  # stopped by eagle3lab, or it had ended cleanly
                self._begin_shutdown(ln, msg, by="eagle3lab" if signals else "server")
            else:
                self.crash = {"line": ln.lineno, "error": None, "marker":
                              f"the process had exited with code {rc} before eagle3lab "
                              f"stopped it, and printed no crash marker"}
        elif self.shutdown is None and (SHUTDOWN.search(msg)
                                        or vllm_format.SHUTDOWN.search(msg)):
            self._begin_shutdown(ln, msg, by="server")

    def _begin_shutdown(self, ln: LogLine, msg: str, *, by: str) -> None:
        self.shutdown = {"line": ln.lineno, "time": _iso(ln.time), "marker": msg.strip()[:200],
                         "by": by, "after_phase": self.phase, "ready_before": self.ready,
                         "decode_lines_before": len(self.decode), "errors": [],
                         "error_lines": 0}
        self._enter("shutdown", ln, msg)

    def feed_text(self, text: str) -> "LogAnalyzer":
        for raw in text.splitlines():
            self.feed(raw)
        return self

    @property
    def phase(self) -> str | None:
        return self.phases[-1]["phase"] if self.phases else None

    @property
    def ready(self) -> bool:
        return any(p["phase"] == "ready" for p in self.phases)

    @property
    def speculative(self) -> bool:
        """True when the decode lines carry `accept len` (the server runs speculation)."""
        return any(d["accept_len"] is not None for d in self.decode)

    def drafter(self) -> dict[str, Any] | None:
        """What the log proves about the drafter (vLLM): the speculative config, whether a
        line shows it loaded, and the target layers whose hidden states it reads (vLLM's
        ids: id k = the input of decoder layer k; `aux_layers_from`: the drafter's config
        or the target model's default); None when the log names no drafter."""
        spec = (self.facts.get("speculative_config") or {}).get("value")
        aux = (self.facts.get("aux_layers") or {}).get("value")
        if spec is None and not self.drafter_lines:
            return None
        spec = spec or {}
        return {"method": spec.get("method"), "model": spec.get("model"),
                "num_spec_tokens": spec.get("num_spec_tokens"),
                "loaded": self.drafter_done is not None,
                "load_started": bool(self.drafter_lines), "loaded_line": self.drafter_done,
                "aux_layers": aux["ids"] if aux else None,
                "aux_layers_from": aux["source"] if aux else None,
                "evidence": self.drafter_lines}

    def silence_s(self, now: dt.datetime) -> float | None:
        return (now - self.last_time).total_seconds() if self.last_time else None

    def verdict(self, now: dt.datetime, silence_s: float) -> str:
        if self.crash is not None:
            return "crashed"
        if self.shutdown is not None:
            return "exited"
        if self.ready:
            return "ready"
        quiet = self.silence_s(now)
        if quiet is not None and quiet > silence_s:
            return "hung"
        return "starting"

    def findings(self, verdict: str, now: dt.datetime, silence_s: float) -> list[dict]:
        out: list[dict[str, str]] = []
        if verdict == "crashed" and self.crash:
            err = self.crash["error"] or self.crash["marker"]
            out.append({"code": "server-crashed", "severity": "error", "message":
                        f"The server crashed (line {self.crash['line']}): {err}. Read the "
                        f"traceback there; with --tp > 1 the first rank's error is the cause."})
        if verdict == "exited" and self.shutdown:
            out += self._shutdown_findings()
        if verdict == "hung":
            cause, fix = hang_cause(self.phase)
            out.append({"code": "startup-hung", "severity": "error", "message":
                        f"No log line for {self.silence_s(now):.0f} s (silence window "
                        f"{silence_s:.0f} s) in phase {self.phase or 'launch'!r}. Likely: "
                        f"{cause} Fix: {fix}"})
        out += self._drafter_findings()
        accept = [d["accept_len"] for d in self.decode if d["accept_len"] is not None]
        if accept:
            mean = sum(accept) / len(accept)
            if mean <= COLLAPSE_ACCEPT_LEN:
                out.append({"code": "acceptance-collapse", "severity": "error", "message":
                            f"Speculation is on but accept len stayed at about 1.0 (mean "
                            f"{mean:.2f}, max {max(accept):.2f} over {len(accept)} decode "
                            f"lines): the target's bonus token is emitted, the draft "
                            f"tokens almost never. Typical of a drafter that loads but does "
                            f"not match (aux hidden states not captured so fc is skipped, "
                            f"aux layer ids shifted, d2t/t2d vocab map, ignored input_norm). "
                            f"Next: run the checkpoint doctor, `eagle3lab inspect DRAFT "
                            f"--target TARGET --engine {self.format}`."})
        elif self.decode:
            out.append({"code": "no-speculation", "severity": "info", "message":
                        f"{len(self.decode)} Decode batch lines carry no accept len: this "
                        f"server decodes without speculation."})
        return out

    def _shutdown_findings(self) -> list[dict[str, str]]:
        s = self.shutdown or {}
        who = "eagle3lab stopped the server" if s["by"] == "eagle3lab" else \
            "The server shut down"
        if self.stop and "SIGKILL" in self.stop["signals"]:
            who += " (it ignored SIGTERM for the grace period: SIGKILL)"
        where = f"(line {s['line']}: {s['marker'][:120]})"
        if s["ready_before"]:
            out = [{"code": "server-stopped", "severity": "info", "message":
                    f"{who} {where} after it was ready; the decode lines before it "
                    f"({s['decode_lines_before']}) are kept."}]
        else:
            out = [{"code": "stopped-before-ready", "severity": "warning", "message":
                    f"{who} {where} in phase {s['after_phase'] or 'launch'!r}, before it was "
                    f"ready. If the watchdog stopped it, NAME.watch.json says why (hung "
                    f"or crashed)."}]
        if s["error_lines"]:
            e = s["errors"][0]
            out.append({"code": "errors-during-shutdown", "severity": "info", "message":
                        f"{s['error_lines']} crash marker(s) after the shutdown began (first: "
                        f"line {e['line']}: {e['error'] or e['marker']}): processes stopped "
                        f"mid-call, not read as a crash."})
        return out

    def _drafter_findings(self) -> list[dict[str, str]]:
        d = self.drafter()
        if d is None or not d["model"]:
            return []
        name = f"the {d['method']} drafter {d['model']} ({d['num_spec_tokens']} draft tokens)"
        if not d["loaded"] and d["load_started"] and self.crash is not None:
            return [{"code": "drafter-load-failed", "severity": "error", "message":
                     f"vLLM began loading {name} (line {d['evidence'][0]['line']}) and "
                     f"crashed before `Model loading took` (line {self.crash['line']}): "
                     f"{self.crash.get('error') or self.crash['marker']}. The checkpoint "
                     f"does not fit what vLLM builds for it; `eagle3lab inspect DRAFTER "
                     f"--engine vllm --target T` names the tensor."}]
        if not d["loaded"]:
            if not (self.ready or self.shutdown):
                return []
            return [{"code": "drafter-unconfirmed", "severity": "warning", "message":
                     f"The speculative config names {name}, but no line shows it loaded "
                     f"(vLLM 0.25.1 prints `Loading drafter model...` with its V1 model "
                     f"runner, `Using Eagle3 auxiliary layers from ...` with its V2 one, "
                     f"then `Model loading took` once both are in)."}]
        if d["aux_layers"] is None:
            aux = ("no aux-layer line: vLLM's V1 model runner uses the target's default "
                   "layers (2, L // 2, L - 3) without saying so")
        else:
            src = "the drafter's config" if d["aux_layers_from"] == "config" else \
                "the target's default"
            aux = (f"the target's hidden states at the input of layers {d['aux_layers']} "
                   f"(vLLM ids, from {src}) feed it")
        return [{"code": "drafter-loaded", "severity": "info", "message":
                 f"vLLM loaded {name} (lines {d['evidence'][0]['line']}-"
                 f"{d['loaded_line']['line']}); {aux}."}]

    def report(self, *, now: dt.datetime | None = None, silence_s: float = 120.0) -> dict:
        """The `eagle3lab logs --json` object."""
        now = now or dt.datetime.now()
        verdict = self.verdict(now, silence_s)
        return {
            "verdict": verdict,
            "format": self.format,
            "phase": self.phase,
            "last_line_time": _iso(self.last_time),
            "silence_s": self.silence_s(now),
            "speculative": self.speculative,
            "phases": self.phases,
            "warnings": self.warnings.items(),
            "decode": self.decode,
            "prefill_batches": self.prefill_batches,
            "crash": self.crash,
            "shutdown": self.shutdown,
            "stop": self.stop,
            "facts": {k: v["value"] for k, v in self.facts.items()},
            "drafter": self.drafter(),
            "findings": self.findings(verdict, now, silence_s),
            "lines": self.lines,
        }


def analyse_log(source: str | Path | Iterable[str], *, now: dt.datetime | None = None,
                silence_s: float = 120.0) -> dict[str, Any]:
    """Analyse a log file (path) or its lines; see `LogAnalyzer.report`."""
    a = LogAnalyzer()
    if isinstance(source, (str, Path)):
        with open(source, encoding="utf-8", errors="replace") as f:
            for raw in f:
                a.feed(raw)
    else:
        for raw in source:
            a.feed(raw)
    return a.report(now=now, silence_s=silence_s)


class LogFollower:
    """Reads a growing log file incrementally (complete lines only) into an analyzer."""

    def __init__(self, path: str | Path, analyzer: LogAnalyzer | None = None):
        self.path = Path(path)
        self.analyzer = analyzer or LogAnalyzer()
        self.offset = 0
        self._partial = b""

    def poll(self) -> list[LogLine]:
        """Feed the lines appended since the last call; returns them."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        return [self.analyzer.feed(b.decode("utf-8", errors="replace")) for b in complete]


def parse_now(text: str | None) -> dt.datetime:
    """`--now` (ISO 8601; local time when naive) -> naive local time, as SGLang logs it."""
    if not text:
        return dt.datetime.now()
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        raise UserError(f"--now {text!r} is not an ISO time; write e.g. "
                        f"2025-01-01T12:00:00 (local time, as SGLang logs it).") from None
    return t.astimezone().replace(tzinfo=None) if t.tzinfo else t


def decode_over_time(log_path: str | Path, arm: str):
    """The server's `Decode batch` lines as a DataFrame, one row per line, with `t_s` in
    seconds since the first one (so arms started at different times share an axis)."""
    import pandas as pd

    dec = analyse_log(log_path)["decode"]
    df = pd.DataFrame(dec, columns=["time", "running_req", "accept_len", "accept_rate",
                                    "gen_throughput", "token", "token_usage", "queue_req",
                                    "graph", "per_position", "line", "tags"])
    df.insert(0, "arm", arm)
    if len(df):
        t = pd.to_datetime(df["time"])
        df["t_s"] = (t - t.iloc[0]).dt.total_seconds()
    else:
        df["t_s"] = []
    return df
