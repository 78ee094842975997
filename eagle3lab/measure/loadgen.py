"""Concurrent benchmark client: N requests in flight (asyncio + aiohttp), streaming, per
concurrency level throughput, time to first token, inter-token latency and accept length,
beside the acceptance the server's /metrics counted over the same window.

Prevents a speculative speed-up measured at batch 1 only and quoted for a loaded server:
acceptance and speed-up change with concurrency (SGLang caps running requests at 48 with
speculation, "Max running requests is reset to 48"; verify batches grow with load), so
each level is measured on its own, with the same requests, as SGLang's and vLLM's own
benchmark clients measure it. Per request, as `sglang/benchmark/serving.py`
`async_request_sglang_generate` (0.5.23) does: TTFT = time to the first chunk carrying
text; each later chunk's gap is spread over the tokens it added (ITL); the SGLang stream's
`meta_info.completion_tokens` is cumulative. The OpenAI stream (vLLM 0.25.1,
vllm/entrypoints/openai/completion/serving.py:282-497) carries per chunk the delta `text`
and, with `return_token_ids` (protocol.py:146-155), the delta ids in `choices[0].token_ids`;
with `stream_options: {"include_usage": true}` (sent only with `stream`: vLLM refuses it
otherwise, protocol.py:470-479) a last chunk with `choices: []` and `usage`, whose
`completion_tokens` is the request's count, as vLLM's own benchmark client reads it
(vllm/benchmarks/lib/endpoint_request_func.py:158-268); an error inside a stream is a
`data: {"error": {...}}` chunk (serving.py:490-496). Level numbers are ratios of sums:
throughput = all completion tokens / the level's wall time; accept length = summed tokens
/ summed verify steps (SGLang's meta_info definition, incl. the bonus token); from
/metrics, vLLM's 1 + accepted / drafts and per-position acceptance over the window.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

from eagle3lab import asyncutil
from eagle3lab.measure.client import HISTOGRAM_KEYS
from eagle3lab.measure.prometheus import scrape, window


def _payload(api: str, req: dict[str, Any], *, max_new_tokens: int, temperature: float,
             stream: bool, model: str | None) -> tuple[str, dict[str, Any]]:
    if api == "sglang":
        body = {k: v for k, v in req.items() if k in ("text", "input_ids")}
        body.update(stream=stream, sampling_params={
            "max_new_tokens": max_new_tokens, "temperature": temperature, "ignore_eos": True})
        return "/generate", body
    prompt = req.get("input_ids", req.get("text"))
    body = {"prompt": prompt, "max_tokens": max_new_tokens, "temperature": temperature,
            "ignore_eos": True, "stream": stream, "return_token_ids": True}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if model:
        body["model"] = model
    return "/v1/completions", body


def _openai_tokens(obj: dict[str, Any], tokens: int) -> tuple[int, int | None]:
    """One OpenAI chunk (or the whole response) -> (tokens so far, `usage.completion_tokens`
    when the chunk carries it)."""
    usage = (obj.get("usage") or {}).get("completion_tokens")
    ch = (obj.get("choices") or [{}])[0]
    ids = ch.get("token_ids")
    n = tokens + (len(ids) if ids is not None else int(bool(ch.get("text"))))
    return n, None if usage is None else int(usage)


async def _one(session, url: str, api: str, req: dict[str, Any], **kw) -> dict[str, Any]:
    path, body = _payload(api, req, **kw)
    row: dict[str, Any] = {"prompt_id": req["prompt_id"], "ok": False, "error": None,
                           "completion_tokens": 0, "ttft_s": math.nan, "latency_s": math.nan,
                           "itl": [], "spec_verify_ct": None, "accept_histogram": None}
    t0 = last = time.perf_counter()
    tokens, usage = 0, None
    try:
        async with session.post(url + path, json=body) as resp:
            if resp.status != 200:
                row["error"] = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return row
            async for raw in resp.content:
                raw = raw.strip()
                if not raw or raw.startswith(b":"):  # an SSE comment (a ping)
                    continue
                data = raw[6:] if raw.startswith(b"data: ") else raw
                if data == b"[DONE]":
                    continue
                obj = json.loads(data)
                if isinstance(obj, dict) and obj.get("error"):  # both engines stream errors so
                    err = obj["error"]
                    raise RuntimeError("error chunk: " + str(
                        err.get("message", err) if isinstance(err, dict) else err))
                now = time.perf_counter()
                if api == "sglang":
                    meta = obj.get("meta_info") or {}
                    n = int(meta.get("completion_tokens", tokens))
                    if meta.get("spec_verify_ct"):
                        row["spec_verify_ct"] = int(meta["spec_verify_ct"])
                        row["accept_histogram"] = next(
                            (meta[k] for k in HISTOGRAM_KEYS if meta.get(k)), None)
                else:
                    n, u = _openai_tokens(obj, tokens)
                    usage = usage if u is None else u
                if n > tokens:
                    if tokens == 0:
                        row["ttft_s"] = now - t0
                    else:
                        row["itl"] += [(now - last) / (n - tokens)] * (n - tokens)
                    tokens, last = n, now
        row.update(ok=True, completion_tokens=tokens if usage is None else usage,
                   latency_s=time.perf_counter() - t0)
    except Exception as e:  # a failed request is a row with its error, the level goes on
        row["error"] = f"{type(e).__name__}: {e}"
    return row


async def _level(url: str, requests: list[dict[str, Any]], *, concurrency: int, api: str,
                 timeout_s: float, **kw) -> list[dict[str, Any]]:
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(
            total=timeout_s), read_bufsize=10 * 1024 ** 2) as session:
        async def bounded(r):
            async with sem:
                return await _one(session, url, api, r, **kw)
        return await asyncio.gather(*(bounded(r) for r in requests))


def run_level(url: str, requests: list[dict[str, Any]], *, concurrency: int,
              api: str = "sglang", max_new_tokens: int = 64, temperature: float = 0.0,
              stream: bool = True, model: str | None = None, timeout_s: float = 3600.0,
              metrics: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """All `requests` with `concurrency` in flight: (one row per request, the level's
    summary). `metrics`: scrape URL/metrics before and after (acceptance over the level)."""
    if api not in ("sglang", "openai"):
        raise ValueError(f"api={api!r}; expected sglang or openai")
    before = scrape(url) if metrics else None
    t0 = time.perf_counter()
    rows = asyncutil.run(_level(url, requests, concurrency=concurrency, api=api,
                              timeout_s=timeout_s, max_new_tokens=max_new_tokens,
                              temperature=temperature, stream=stream, model=model))
    wall = time.perf_counter() - t0
    win = window(before, scrape(url)) if metrics else None
    return rows, summarize_level(rows, concurrency=concurrency, wall_s=wall, window=win)


def summarize_level(rows: list[dict[str, Any]], *, concurrency: int, wall_s: float,
                    window: dict[str, Any] | None) -> dict[str, Any]:
    """One level's numbers (ratios of sums; TTFT/ITL means and percentiles)."""
    import numpy as np

    ok = [r for r in rows if r["ok"]]
    tokens = sum(r["completion_tokens"] for r in ok)
    ttft = [r["ttft_s"] for r in ok if not math.isnan(r["ttft_s"])]
    itl = [x for r in ok for x in r["itl"]]
    verify = [r for r in ok if r["spec_verify_ct"]]
    pct = (lambda xs, q: float(np.percentile(xs, q)) if xs else math.nan)
    return {
        "concurrency": concurrency, "requests": len(rows), "failed": len(rows) - len(ok),
        "completion_tokens": tokens, "wall_s": wall_s,
        "throughput_tok_s": tokens / wall_s if wall_s > 0 else math.nan,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else math.nan,
        "ttft_mean_s": float(np.mean(ttft)) if ttft else math.nan, "ttft_p50_s": pct(ttft, 50),
        "ttft_p99_s": pct(ttft, 99), "itl_mean_s": float(np.mean(itl)) if itl else math.nan,
        "itl_p50_s": pct(itl, 50),
        "latency_mean_s": float(np.mean([r["latency_s"] for r in ok])) if ok else math.nan,
        "accept_length": (sum(r["completion_tokens"] for r in verify)
                          / sum(r["spec_verify_ct"] for r in verify)) if verify else math.nan,
        "metrics_source": window["source"] if window else None,
        "metrics_drafts": window["drafts"] if window else None,
        "metrics_accept_length": window["accept_length"] if window else math.nan,
        "metrics_per_position": window["per_position"] if window else [],
        "errors": sorted({r["error"] for r in rows if r["error"]})[:3],
    }


def sweep(url: str, requests: list[dict[str, Any]], *, levels=(1, 4, 16), arm: str = "arm",
          log=print, **kw):
    """`run_level` for each concurrency level (the same requests each time) -> (levels
    DataFrame with an `arm` column, per-request DataFrame)."""
    import pandas as pd

    summaries, all_rows = [], []
    for c in levels:
        rows, s = run_level(url, requests, concurrency=int(c), **kw)
        summaries.append({"arm": arm, **s})
        all_rows += [{"arm": arm, "concurrency": c, **{k: v for k, v in r.items()
                                                        if k != "itl"}} for r in rows]
        # per request (SGLang's meta_info), else the level's /metrics window (vLLM)
        acc, src = ((s["accept_length"], "requests") if not math.isnan(s["accept_length"])
                    else (s["metrics_accept_length"], "/metrics"))
        log(f"[{arm}] concurrency {c:>3}: {s['throughput_tok_s']:8.1f} tok/s, TTFT "
            f"{s['ttft_mean_s'] * 1e3:7.1f} ms, ITL {s['itl_mean_s'] * 1e3:6.1f} ms, accept "
            f"length {acc:.2f} ({src}), failed {s['failed']}")
    return pd.DataFrame(summaries), pd.DataFrame(all_rows)
