"""SGLang and vLLM log lines -> start-up phases, a verdict, decode statistics and findings.

Prevents reading a server's state wrong from a raw log: a start that hung for ten minutes
looks like a slow start, a scheduler traceback scrolls past under import-error noise, and
an accept length stuck at 1.00 (a drafter that is loaded but never accepted, e.g. fed
the wrong aux layers: eagle3lab/target/auxlayers.py) looks like a working speculative server. `LogAnalyzer` is fed lines one at
a time (a saved log, or a growing one via `follow`), keeps raw counts, and `report()`
returns the JSON object of `eagle3lab logs --json`.

The format is detected per line: a vLLM-stamped line (vllm_logs.py, which cites vLLM's
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
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from pathlib import Path
from typing import Any, Iterable

from eagle3lab.server import vllm_logs
from eagle3lab.server.warnings import WarningTally, hang_cause

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

#: accept len at or below this, on average over the decode lines, is "about 1.0".
COLLAPSE_ACCEPT_LEN = 1.05


@dataclasses.dataclass
class LogLine:
    lineno: int
    time: dt.datetime | None  # SGLang's local wall-clock time; None for untimed lines
    tags: tuple[str, ...]  # rank tags such as ("TP0",), empty without
    message: str  # the text after the timestamp (the whole line when untimed)
    engine: str | None = None  # "vllm" for a vLLM-stamped line; None otherwise


def parse_line(raw: str, lineno: int = 0) -> LogLine:
    """One log line, ANSI colours removed; timestamp and rank tags split off (SGLang's
    stamp, else vLLM's: its tags are the process names and the level)."""
    line = _ANSI.sub("", raw.rstrip("\r\n"))
    m = _STAMP.match(line)
    if not m:
        v = vllm_logs.parse_stamp(line)
        if v is not None:
            return LogLine(lineno, v[0], v[1], v[2], "vllm")
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
        self.warnings = WarningTally()
        self._expect_exc = False
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
        for name, rx in (vllm_logs.PHASES if self.format == "vllm" else PHASES):
            if rx.search(msg):
                if not self.phases or self.phases[-1]["phase"] != name:
                    self.phases.append({"phase": name, "time": _iso(ln.time),
                                        "line": ln.lineno, "message": msg.strip()[:200]})
                break
        d = parse_decode(msg) or vllm_logs.parse_stats(msg)
        spec = None if d is not None else vllm_logs.parse_spec(msg)
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
        if _CRASH.search(msg) or vllm_logs.CRASH.search(msg):
            if self.crash is None:
                self.crash = {"line": ln.lineno, "marker": msg.strip()[:200], "error": None}
            self._expect_exc = True
        elif self._expect_exc and _EXC_LINE.match(msg):
            self.crash["error"] = msg.strip()[:300]  # type: ignore[index]
            self._expect_exc = False
        self.warnings.feed(msg, ln.lineno)
        return ln

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

    def silence_s(self, now: dt.datetime) -> float | None:
        return (now - self.last_time).total_seconds() if self.last_time else None

    def verdict(self, now: dt.datetime, silence_s: float) -> str:
        if self.crash is not None:
            return "crashed"
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
        if verdict == "hung":
            cause, fix = hang_cause(self.phase)
            out.append({"code": "startup-hung", "severity": "error", "message":
                        f"No log line for {self.silence_s(now):.0f} s (silence window "
                        f"{silence_s:.0f} s) in phase {self.phase or 'launch'!r}. Likely: "
                        f"{cause} Fix: {fix}"})
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
    from eagle3lab.errors import UserError

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
