"""`eagle3lab logs`: read a saved or growing SGLang or vLLM log and say where the server
stands."""

from __future__ import annotations

import json
from pathlib import Path

from eagle3lab.cli.common import add_command, json_option


def add_parser(sub) -> None:
    p = add_command(
        sub, "logs", run,
        help="analyse an SGLang or vLLM server log: phase, verdict, warnings, accept length",
        description="Parse an SGLang, vLLM (format detected) or reference server log: start-up "
        "phases, a verdict "
        "(starting, ready, hung = not ready and no line for --silence-s, crashed = a "
        "traceback, a dead scheduler or engine core, exited = the log ends in the server's "
        "shutdown or eagle3lab's stop line), known warnings explained, the decode "
        "lines (SGLang's Decode batch; vLLM's stats and SpecDecoding metrics lines: accept "
        "len, accept rate, per-position acceptance, gen throughput, kept when the server "
        "then shut down), what a vLLM start proves (version, the drafter loaded, the aux "
        "layers it reads) and findings such as "
        "acceptance-collapse (speculation on, accept len ~1.0). Exit status: 0 ready, "
        "starting or exited, 1 crashed, hung or an error finding, 2 LOGFILE missing.",
        parents=[json_option()])
    p.add_argument("logfile", metavar="LOGFILE", help="the server's log file")
    p.add_argument("--now", default=None,
                   help="the time to judge silence against, ISO 8601 (SGLang logs local "
                   "time); default: now")
    p.add_argument("--silence-s", type=float, default=120.0,
                   help="seconds without a log line before a start that is not ready is hung")


def run(args) -> int:
    import sys

    from eagle3lab.serverlogs.analyzer import analyse_log, parse_now

    path = Path(args.logfile)
    if not path.is_file():
        print(f"eagle3lab logs: error: {path} does not exist or is not a file.",
              file=sys.stderr)
        return 2
    report = analyse_log(path, now=parse_now(args.now), silence_s=args.silence_s)
    bad = report["verdict"] in ("crashed", "hung") or any(
        f["severity"] == "error" for f in report["findings"])
    if args.json:
        print(json.dumps(report, indent=2))
        return 1 if bad else 0
    print(f"{path}: {report['format']} log, {report['verdict']} (phase {report['phase'] or '-'}, last line "
          f"{report['last_line_time'] or '-'}, {report['lines']} lines)")
    for p in report["phases"]:
        print(f"  {p['time'] or '-':<19}  {p['phase']:<20} line {p['line']}")
    if report["shutdown"]:
        s = report["shutdown"]
        who = "eagle3lab stop" if s["by"] == "eagle3lab" else "the server"
        print(f"shutdown: line {s['line']} ({who}): {s['marker'][:100]}")
    facts = {k: v for k, v in report["facts"].items() if isinstance(v, str)}
    if facts:
        print("facts: " + ", ".join(f"{k} {v}" for k, v in facts.items()))
    d = report["drafter"]
    if d:
        print(f"drafter: {d['method']} {d['model']} ({d['num_spec_tokens']} tokens), "
              f"{'loaded' if d['loaded'] else 'no line shows it loaded'}, aux layers "
              f"{d['aux_layers'] if d['aux_layers'] is not None else 'not logged'}"
              + (f" (from the {d['aux_layers_from']})" if d["aux_layers_from"] else ""))
    if report["warnings"]:
        print("warnings:")
        for w in report["warnings"]:
            print(f"  [{w['severity']}] x{w['count']} {w['match'][:100]}\n      -> "
                  f"{w['explanation']}")
    dec = report["decode"]
    if dec:
        acc = [d["accept_len"] for d in dec if d["accept_len"] is not None]
        tput = [d["gen_throughput"] for d in dec if d["gen_throughput"] is not None]
        line = f"decode: {len(dec)} Decode batch lines"
        if acc:
            line += f", accept len mean {sum(acc) / len(acc):.2f} (min {min(acc):.2f}, " \
                    f"max {max(acc):.2f})"
        if tput:
            line += f", gen throughput mean {sum(tput) / len(tput):.1f} token/s"
        print(line)
    for f in report["findings"]:
        print(f"{f['severity'].upper()} {f['code']}: {f['message']}")
    return 1 if bad else 0
