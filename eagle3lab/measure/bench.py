"""The benchmark run: baseline and speculative servers in sequence on the same requests,
and its result (`BenchResult`: tables, log findings, how each server stopped).

Prevents a benchmark that leaves servers behind or loses the evidence of a failed start:
each arm's server is stopped in a `finally` (also when a request fails), an arm whose
server does not become ready is recorded in `skipped` with the watchdog's reason instead
of aborting the others, and every arm's full log is analysed after its server stopped.
The key numbers the batch report shows (`summary_numbers`) come from the same tables the
notebook displays, so the report never quotes a number the notebook did not show.

Lower layers: `client` (HTTP), `workload` (the requests, raw counts), `tables` (ratios of
sums, per-position acceptance), `logs` (decode over time), `arms` (the arm plan).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from eagle3lab.fsutil import atomic_write_json, atomic_write_text
from eagle3lab.measure.client import server_info
from eagle3lab.measure.loadgen import sweep
from eagle3lab.measure.prometheus import MetricsPoller, positions_frame
from eagle3lab.measure.tables import per_position, summarize
from eagle3lab.measure.workload import build_requests, run_requests
from eagle3lab.preflight.run import PreflightRefused
from eagle3lab.serverlogs.analyzer import analyse_log, decode_over_time
from eagle3lab.serving.launch import start


@dataclasses.dataclass
class BenchResult:
    requests: Any  # DataFrame: one row per request and arm (raw counts)
    summary: Any  # DataFrame: one row per arm (tokens/s, speedup, accept length)
    positions: Any  # DataFrame: per arm and draft position
    decode: Any  # DataFrame: Decode batch lines of every arm's log
    watch: dict[str, dict[str, Any]]  # arm -> the watchdog's final start-up state
    logs: dict[str, dict[str, Any]]  # arm -> analysis of its full log (findings, warnings)
    infos: dict[str, dict | None]  # arm -> /get_server_info after the run
    stops: dict[str, dict[str, Any]]  # arm -> how its process group was stopped
    skipped: dict[str, str]  # arm -> why it has no benchmark rows
    sweep: Any = None  # DataFrame: per arm and concurrency level (loadgen.sweep)
    live: Any = None  # DataFrame: per arm, /metrics window and position (acceptance)

    def warnings_table(self):
        """Known warnings seen in each arm's log, explained (instead of the raw log)."""
        import pandas as pd

        rows = [{"arm": arm, "severity": w["severity"], "count": w["count"],
                 "message": w["match"], "explanation": w["explanation"]}
                for arm, rep in self.logs.items() for w in rep["warnings"]]
        return pd.DataFrame(rows, columns=["arm", "severity", "count", "message",
                                           "explanation"])

    def findings_table(self):
        import pandas as pd

        rows = [{"arm": arm, **f} for arm, rep in self.logs.items() for f in rep["findings"]]
        return pd.DataFrame(rows, columns=["arm", "code", "severity", "message"])

    def save(self, run_dir: str | Path) -> list[Path]:
        """requests.csv, summary.csv, positions.csv, decode.csv, bench.json in run_dir
        (and sweep.csv, live.csv when a concurrency sweep ran)."""
        run_dir = Path(run_dir)
        out = []
        for name in ("requests", "summary", "positions", "decode", "sweep", "live"):
            df = getattr(self, name)
            if df is not None:
                atomic_write_text(run_dir / f"{name}.csv", df.to_csv(index=False))
                out.append(run_dir / f"{name}.csv")
        atomic_write_json(run_dir / "bench.json", {
            "skipped": self.skipped, "infos": self.infos, "stops": self.stops,
            "verdicts": {a: st["verdict"] for a, st in self.watch.items()},
            "findings": {a: rep["findings"] for a, rep in self.logs.items()}})
        return out + [run_dir / "bench.json"]


def summary_numbers(result: BenchResult, *, engine: str) -> dict[str, Any]:
    """The live-server notebook's key numbers for the batch report: start-up verdicts,
    baseline and speculative tokens/s, speedup, accept length (incl. the bonus token) and
    cumulative acceptance per position of the `speculative` arm, log finding codes, and
    the arms that did not run (None where an arm has no row)."""
    import pandas as pd

    by_arm = result.summary.set_index("arm") if len(result.summary) else pd.DataFrame()

    def value(column: str, arm: str):
        return by_arm[column].get(arm) if len(by_arm) else None

    pos = result.positions
    return {
        "engine": engine,
        "verdicts": {arm: st["verdict"] for arm, st in result.watch.items()},
        "baseline_tokens_per_s": value("tokens_per_s", "baseline"),
        "spec_tokens_per_s": value("tokens_per_s", "speculative"),
        "speedup": value("speedup", "speculative"),
        "accept_length": value("accept_length", "speculative"),
        "acceptance_per_position": list(pos.loc[pos["arm"] == "speculative", "p_cumulative"])
        if len(pos) else [],
        "findings": sorted({f["code"] for rep in result.logs.values()
                            for f in rep["findings"]}),
        "skipped_arms": sorted(result.skipped),
        "sweep_tokens_per_s": {} if result.sweep is None else {
            arm: dict(zip(g["concurrency"].astype(int), g["throughput_tok_s"]))
            for arm, g in result.sweep.groupby("arm", sort=False)},
    }


def benchmark_arms(arms: dict, *, prompts: list, run_dir: str | Path, tokenizer=None,
                   max_new_tokens: int = 64, temperature: float = 0.0,
                   startup_timeout_s: float = 600.0, silence_s: float = 120.0,
                   baseline: str = "baseline",
                   on_change: Callable[[dict], None] | None = None,
                   log: Callable[[str], None] = print, force: bool = False,
                   preflights: dict | None = None, concurrency_levels=(),
                   metrics_interval_s: float = 1.0,
                   sweep_max_new_tokens: int | None = None) -> BenchResult:
    """Start each arm's server (LaunchConfig) in turn, wait for it with the watchdog,
    send the same requests, read its info and log, stop it (always, also on error). An
    arm whose server does not become ready, or whose preflight finds an error (unless
    `force`; `preflights`: reports already made per arm), is recorded in `skipped` with
    the reason. `concurrency_levels`: also run the concurrent benchmark client at these
    levels on each arm's server (streaming, the same requests), polling its /metrics every
    `metrics_interval_s` for per-position acceptance over time (`sweep`, `live`), with
    `sweep_max_new_tokens` per request (default: max_new_tokens)."""
    import pandas as pd

    requests = build_requests(prompts, tokenizer)
    frames, decode, watch, logs, infos, stops, skipped = [], [], {}, {}, {}, {}, {}
    sweeps, lives = [], []
    for arm, cfg in arms.items():
        try:
            handle = start(cfg, run_dir=run_dir, name=arm, force=force,
                           preflight=(preflights or {}).get(arm))
        except PreflightRefused as e:
            skipped[arm] = str(e)
            log(f"[{arm}] not started: {e}")
            continue
        log(f"[{arm}] {' '.join(handle.argv)}")
        for note in handle.notes:
            log(f"[{arm}] {note}")
        try:
            st = handle.watchdog(silence_s=silence_s).wait(
                startup_timeout_s, on_change=on_change and (lambda s, a=arm: on_change(
                    {**s, "arm": a})))
            watch[arm] = st
            if st["verdict"] != "ready":
                skipped[arm] = f"server {st['verdict']}: {st.get('reason')}"
                continue
            frames.append(run_requests(handle.url, requests, arm=arm,
                                       max_new_tokens=max_new_tokens,
                                       temperature=temperature))
            infos[arm] = server_info(handle.url)
            if concurrency_levels:
                _sweep_arm(handle.url, arm, requests, concurrency_levels, sweeps, lives,
                           max_new_tokens=sweep_max_new_tokens or max_new_tokens,
                           temperature=temperature, interval_s=metrics_interval_s, log=log)
        finally:
            stops[arm] = handle.stop()
        logs[arm] = analyse_log(handle.log_path, silence_s=silence_s)
        decode.append(decode_over_time(handle.log_path, arm))
    req_df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["arm", "prompt_id", "completion_tokens", "latency_s", "spec_verify_ct",
                 "accept_histogram"])
    return BenchResult(requests=req_df, summary=summarize(req_df, infos=infos,
                                                          baseline=baseline),
                       positions=per_position(req_df),
                       decode=pd.concat(decode, ignore_index=True) if decode else None,
                       watch=watch, logs=logs, infos=infos, stops=stops, skipped=skipped,
                       sweep=pd.concat(sweeps, ignore_index=True) if sweeps else None,
                       live=pd.concat(lives, ignore_index=True) if lives else None)


def _sweep_arm(url, arm, requests, levels, sweeps, lives, *, max_new_tokens, temperature,
               interval_s, log) -> None:
    """The concurrency sweep on one running server, /metrics polled throughout."""
    with MetricsPoller(url, interval_s=interval_s) as poller:
        levels_df, _ = sweep(url, requests, levels=levels, arm=arm,
                             max_new_tokens=max_new_tokens, temperature=temperature, log=log)
    sweeps.append(levels_df)
    live = positions_frame(poller.windows(), label=arm)
    lives.append(live.rename(columns={"label": "arm"}))
