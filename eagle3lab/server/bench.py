"""The benchmark client: a fixed prompt set against a running server's native `/generate`,
baseline and speculative servers in sequence, one table.

Prevents three ways a speculative speed-up gets misreported: comparing runs made on
different prompts or token budgets (both arms here get the same requests, greedy by
default), averaging per-request ratios (raw counts are kept per request: completion
tokens, latency, `spec_verify_ct`, the accept histogram; ratios are taken last over the
sums), and quoting a server-wide number from a different window (`/get_server_info`'s
`avg_spec_accept_length` is cumulative since boot; it is reported next to the client's
own, not instead of it). Accept length per request = completion tokens / verify steps, as
SGLang's meta_info defines it, INCLUDING the bonus token (REFERENCE.md "Acceptance
definitions"; the first token, from prefill, counts too, so short requests read a little
above the server's decode-phase number); per-position acceptance comes from
the histogram H[n] = verify steps that accepted exactly n drafts: cumulative P(k) =
sum_{n>=k} H[n] / sum H, conditional P(k | k-1) = sum_{n>=k} H / sum_{n>=k-1} H.

SGLang field names (python/sglang/srt/managers/tokenizer_manager.py): `spec_verify_ct`,
`spec_accept_length`, `spec_accept_rate`, and the histogram as `spec_accept_histogram`
or (0.5.23) `spec_correct_drafts_histogram`; both are read.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

HISTOGRAM_KEYS = ("spec_accept_histogram", "spec_correct_drafts_histogram")


def http_json(url: str, body: Any = None, *, timeout_s: float = 600.0) -> tuple[int, Any]:
    """GET (body None) or POST JSON; returns (status, parsed JSON or text)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return status, raw.decode(errors="replace")


def server_info(url: str) -> dict[str, Any] | None:
    """`/get_server_info` (or the newer `/server_info`); None when neither answers."""
    for path in ("/get_server_info", "/server_info"):
        try:
            status, obj = http_json(url + path, timeout_s=30)
        except (urllib.error.URLError, OSError):
            return None
        if status == 200 and isinstance(obj, dict):
            return obj
    return None


def avg_spec_accept_length(info: dict[str, Any] | None) -> float | None:
    states = (info or {}).get("internal_states") or [{}]
    v = states[0].get("avg_spec_accept_length") if isinstance(states[0], dict) else None
    return float(v) if v is not None else None


def build_requests(prompts: list, tokenizer=None) -> list[dict[str, Any]]:
    """Prompts (eagle3lab Prompt objects or strings) -> requests. With a tokenizer the
    chat template is applied here and `input_ids` are sent (identical for every server);
    without one the raw `text` is sent."""
    from eagle3lab.data.prompts import chat_prompt_ids

    out = []
    for i, p in enumerate(prompts):
        pid, text = (p.id, p.prompt) if hasattr(p, "prompt") else (f"p{i}", str(p))
        req: dict[str, Any] = {"prompt_id": pid}
        if tokenizer is not None:
            req["input_ids"] = chat_prompt_ids(tokenizer, text)
        else:
            req["text"] = text
        out.append(req)
    return out


def _row(arm: str, req: dict[str, Any], resp: dict[str, Any], latency: float) -> dict:
    meta = resp.get("meta_info", {})
    n = int(meta.get("completion_tokens", len(resp.get("output_ids") or [])))
    verify = meta.get("spec_verify_ct")
    hist = next((meta[k] for k in HISTOGRAM_KEYS if meta.get(k)), None)
    fr = meta.get("finish_reason")
    return {
        "arm": arm, "prompt_id": req["prompt_id"],
        "prompt_tokens": meta.get("prompt_tokens"), "completion_tokens": n,
        "latency_s": latency, "tokens_per_s": n / latency if latency > 0 else math.nan,
        "finish_reason": fr.get("type") if isinstance(fr, dict) else fr,
        "spec_verify_ct": int(verify) if verify else None,
        "accept_length": n / verify if verify else math.nan,
        "server_accept_length": meta.get("spec_accept_length", math.nan),
        "spec_accept_rate": meta.get("spec_accept_rate", math.nan),
        "accept_histogram": list(hist) if hist else None,
        "text": resp.get("text", ""),
    }


def run_requests(url: str, requests: list[dict[str, Any]], *, arm: str,
                 max_new_tokens: int = 64, temperature: float = 0.0,
                 timeout_s: float = 600.0):
    """Send each request to URL/generate in turn; one DataFrame row per request."""
    import pandas as pd

    from eagle3lab.errors import UserError

    rows = []
    for req in requests:
        body = {k: v for k, v in req.items() if k in ("text", "input_ids")}
        body["sampling_params"] = {"max_new_tokens": max_new_tokens,
                                   "temperature": temperature}
        t0 = time.perf_counter()
        status, resp = http_json(url + "/generate", body, timeout_s=timeout_s)
        latency = time.perf_counter() - t0
        if status != 200 or not isinstance(resp, dict):
            raise UserError(f"{url}/generate answered {status} for prompt "
                            f"{req['prompt_id']!r}: {str(resp)[:300]}")
        rows.append(_row(arm, req, resp, latency))
    return pd.DataFrame(rows)


def summarize(requests_df, *, infos: dict[str, dict | None] | None = None,
              baseline: str = "baseline"):
    """Per arm: tokens/s over the summed counts, speedup vs `baseline`, accept length
    (sum tokens / sum verify steps, incl. the bonus token) and the server's own number."""
    import pandas as pd

    rows = []
    for arm, g in requests_df.groupby("arm", sort=False):
        tokens, wall = int(g["completion_tokens"].sum()), float(g["latency_s"].sum())
        verify = g["spec_verify_ct"].dropna()
        rows.append({
            "arm": arm, "requests": len(g), "completion_tokens": tokens, "latency_s": wall,
            "tokens_per_s": tokens / wall if wall > 0 else math.nan,
            "verify_steps": int(verify.sum()) if len(verify) else None,
            "accept_length": (g.loc[verify.index, "completion_tokens"].sum() / verify.sum()
                              if len(verify) and verify.sum() else math.nan),
            "server_avg_accept_length": avg_spec_accept_length((infos or {}).get(arm)),
        })
    out = pd.DataFrame(rows, columns=["arm", "requests", "completion_tokens", "latency_s",
                                      "tokens_per_s", "verify_steps", "accept_length",
                                      "server_avg_accept_length"])
    base = out.loc[out["arm"] == baseline, "tokens_per_s"]
    out["speedup"] = out["tokens_per_s"] / float(base.iloc[0]) if len(base) else math.nan
    return out


def per_position(requests_df):
    """Per arm and draft position k: verify steps that accepted at least k drafts, and the
    cumulative and conditional acceptance probabilities (from the summed histogram)."""
    import pandas as pd

    rows = []
    for arm, g in requests_df.groupby("arm", sort=False):
        hists = [h for h in g["accept_histogram"] if h]
        if not hists:
            continue
        width = max(len(h) for h in hists)
        total = [sum(h[n] if n < len(h) else 0 for h in hists) for n in range(width)]
        steps = sum(total)
        for k in range(1, width):
            at_least_k = sum(total[k:])
            at_least_prev = sum(total[k - 1:])
            rows.append({"arm": arm, "position": k, "verify_steps": steps,
                         "accepted_at_least_k": at_least_k,
                         "p_cumulative": at_least_k / steps if steps else math.nan,
                         "p_conditional": at_least_k / at_least_prev if at_least_prev
                         else math.nan})
    return pd.DataFrame(rows, columns=["arm", "position", "verify_steps",
                                       "accepted_at_least_k", "p_cumulative",
                                       "p_conditional"])


def decode_over_time(log_path: str | Path, arm: str):
    """The server's `Decode batch` lines as a DataFrame (seconds since the first one)."""
    import pandas as pd

    from eagle3lab.server.logs import analyse_log

    dec = analyse_log(log_path)["decode"]
    df = pd.DataFrame(dec, columns=["time", "running_req", "accept_len", "accept_rate",
                                    "gen_throughput", "token", "token_usage", "queue_req",
                                    "graph", "line", "tags"])
    df.insert(0, "arm", arm)
    if len(df):
        t = pd.to_datetime(df["time"])
        df["t_s"] = (t - t.iloc[0]).dt.total_seconds()
    else:
        df["t_s"] = []
    return df


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
        """requests.csv, summary.csv, positions.csv, decode.csv, bench.json in run_dir."""
        from eagle3lab.fsutil import atomic_write_json, atomic_write_text

        run_dir = Path(run_dir)
        out = []
        for name in ("requests", "summary", "positions", "decode"):
            df = getattr(self, name)
            if df is not None:
                atomic_write_text(run_dir / f"{name}.csv", df.to_csv(index=False))
                out.append(run_dir / f"{name}.csv")
        atomic_write_json(run_dir / "bench.json", {
            "skipped": self.skipped, "infos": self.infos, "stops": self.stops,
            "verdicts": {a: st["verdict"] for a, st in self.watch.items()},
            "findings": {a: rep["findings"] for a, rep in self.logs.items()}})
        return out + [run_dir / "bench.json"]


def plan_arms(*, engine: str, target: str, draft: str | None, steps: int = 3, topk: int = 1,
              draft_tokens: int | None = None, tp: int = 1, cuda_graph: bool = True,
              device: str = "auto", env: dict[str, str] | None = None,
              extra_args: list[str] | None = None) -> tuple[dict, list[str]]:
    """The notebook's arms: `baseline` (no draft) and, when a draft is given,
    `speculative`; plus notes saying why an arm is skipped. Ports are picked free."""
    from eagle3lab.server.launch import LaunchConfig

    common = dict(engine=engine, target=target, tp=tp, cuda_graph=cuda_graph, port=0,
                  device=device, env=dict(env or {}), extra_args=list(extra_args or []))
    arms = {"baseline": LaunchConfig(**common)}
    notes = []
    if not draft:
        notes.append("No draft checkpoint given (parameter `draft`): the speculative arm is "
                     "skipped and only the baseline runs. Set `draft` to an EAGLE-3 "
                     "checkpoint directory to compare.")
        return arms, notes
    arms["speculative"] = LaunchConfig(**common, draft=draft, steps=steps, topk=topk,
                                       draft_tokens=draft_tokens or None)
    return arms, notes


def benchmark_arms(arms: dict, *, prompts: list, run_dir: str | Path, tokenizer=None,
                   max_new_tokens: int = 64, temperature: float = 0.0,
                   startup_timeout_s: float = 600.0, silence_s: float = 120.0,
                   baseline: str = "baseline",
                   on_change: Callable[[dict], None] | None = None,
                   log: Callable[[str], None] = print) -> BenchResult:
    """Start each arm's server (LaunchConfig) in turn, wait for it with the watchdog,
    send the same requests, read its info and log, stop it (always, also on error). An
    arm whose server does not become ready is recorded in `skipped` with the reason."""
    import pandas as pd

    from eagle3lab.server.launch import start
    from eagle3lab.server.logs import analyse_log

    requests = build_requests(prompts, tokenizer)
    frames, decode, watch, logs, infos, stops, skipped = [], [], {}, {}, {}, {}, {}
    for arm, cfg in arms.items():
        handle = start(cfg, run_dir=run_dir, name=arm)
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
                       watch=watch, logs=logs, infos=infos, stops=stops, skipped=skipped)
