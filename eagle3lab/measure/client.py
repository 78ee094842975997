"""The HTTP client for a running server: JSON in, (status, JSON or text) out, and the
server's own info.

Prevents a benchmark that dies with a traceback (or records garbage) when a server answers
an error page or a non-JSON body: every answer comes back as (status, parsed JSON or the
text), an HTTP error status included, so the caller can name the request that failed. It
also prevents reading "no server info" from a newer SGLang: `/get_server_info` was renamed
`/server_info`, and both are asked. `avg_spec_accept_length` in that info is cumulative
since the server started; callers report it next to their own window's number, never
instead of it.

`per_request_spec` reads one answer's own speculative counts, the same raw counts the
offline engine keeps (completion tokens, verify steps, the histogram H[n] = steps that
accepted exactly n drafts), from either engine:
- SGLang `/generate` `meta_info` (sglang/srt/managers/tokenizer_manager.py
  `_calculate_spec_decoding_metrics`, SGLang 0.5.23): `spec_verify_ct`,
  `spec_num_correct_drafts`, `spec_num_proposed_drafts` (= verify steps x drafts per step),
  `spec_accept_length` (completion tokens / verify steps), `spec_accept_rate`, and the
  histogram `spec_correct_drafts_histogram`, only as long as the largest count seen
  (schedule_batch.py `update_spec_correct_drafts_histogram`); older releases and later
  ones (as an alias) call it `spec_accept_histogram`. Both are read; the list is padded.
- vLLM: 0.25.1 returns no per-request speculative counts. Its `/v1/completions` answer's
  `metrics` (`PerRequestMetrics`, vllm/entrypoints/generate/base/protocol.py) carries
  timing only; `metrics.speculative_decoding` (`mean_acceptance_length`,
  `acceptance_histogram` of length k + 1, `num_spec_steps`, `num_accepted_draft_tokens`,
  `num_draft_tokens`, `num_spec_tokens`) came with vLLM pull request #48915 (merged
  2026-08, after 0.27; read in vLLM's main branch, commit 022e555d, and its docs page
  "Per-Request Acceptance Metrics") behind `vllm serve
  --per-request-spec-decode-metrics summary|detailed`. It is read where present; where
  absent the answer is `NO_PER_REQUEST_STATS`, one line.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from eagle3lab.errors import UserError

#: SGLang's per-request histogram keys in meta_info: `spec_accept_histogram` (older releases,
#: later ones' alias, and `eagle3lab serve`, full length) first, then 0.5.23's
#: `spec_correct_drafts_histogram` (as long as the largest count seen: padded where read).
HISTOGRAM_KEYS = ("spec_accept_histogram", "spec_correct_drafts_histogram")

NO_PER_REQUEST_STATS = (
    "{where}: this server reports no per-request speculative stats ({why}). Per-prompt "
    "acceptance needs SGLang's /generate (meta_info.spec_verify_ct), `eagle3lab serve`, "
    "vLLM started with --per-request-spec-decode-metrics summary (releases after 0.27; "
    "0.25.1 has none), or the offline engine: `eagle3lab accept --json > accept.json`, "
    "then `eagle3lab weak-spots accept.json`.")


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
    """The server's cumulative accept length (`internal_states[0]`), None when absent."""
    states = (info or {}).get("internal_states") or [{}]
    v = states[0].get("avg_spec_accept_length") if isinstance(states[0], dict) else None
    return float(v) if v is not None else None


def per_request_spec(resp: Any, *, where: str = "the server") -> dict[str, Any]:
    """One answer's speculative raw counts: {completion_tokens, prompt_tokens, verify_ct,
    accepted_drafts, num_draft_tokens, accept_histogram (n = 0..num_draft_tokens),
    source}. resp: SGLang's `/generate` answer (meta_info) or a vLLM `/v1/completions`
    answer (metrics.speculative_decoding). An answer without them is a UserError of one
    line (`NO_PER_REQUEST_STATS`) naming `where`."""
    if not isinstance(resp, dict):
        raise UserError(NO_PER_REQUEST_STATS.format(
            where=where, why=f"the answer is not a JSON object: {str(resp)[:80]!r}"))
    if isinstance(resp.get("meta_info"), dict):
        return _sglang_counts(resp["meta_info"], resp, where)
    if "choices" in resp:
        return _vllm_counts(resp, where)
    raise UserError(NO_PER_REQUEST_STATS.format(
        where=where, why="the answer has neither SGLang's meta_info nor vLLM's choices"))


def _sglang_counts(meta: dict[str, Any], resp: dict[str, Any], where: str) -> dict[str, Any]:
    verify = meta.get("spec_verify_ct")
    if not verify:
        raise UserError(NO_PER_REQUEST_STATS.format(
            where=where, why="meta_info has no spec_verify_ct: is it speculating?"))
    verify = int(verify)
    hist = next((list(meta[k]) for k in HISTOGRAM_KEYS if meta.get(k)), None)
    proposed = meta.get("spec_num_proposed_drafts")
    per_step = int(proposed) // verify if proposed else (len(hist) - 1 if hist else 0)
    correct = meta.get("spec_num_correct_drafts")
    if correct is None and hist is not None:
        correct = sum(k * int(c) for k, c in enumerate(hist))
    if hist is not None:
        hist = [int(c) for c in hist] + [0] * max(0, per_step + 1 - len(hist))
    n = meta.get("completion_tokens", len(resp.get("output_ids") or []))
    return {"completion_tokens": int(n), "prompt_tokens": meta.get("prompt_tokens"),
            "verify_ct": verify, "accepted_drafts": int(correct or 0),
            "num_draft_tokens": per_step, "accept_histogram": hist,
            "source": "sglang meta_info"}


def _vllm_counts(resp: dict[str, Any], where: str) -> dict[str, Any]:
    sd = (resp.get("metrics") or {}).get("speculative_decoding")
    if not isinstance(sd, dict):
        why = ("no metrics.speculative_decoding in the answer: vLLM 0.25.1 has none, later "
               "releases only with --per-request-spec-decode-metrics summary and n == 1")
        raise UserError(NO_PER_REQUEST_STATS.format(where=where, why=why))
    usage = resp.get("usage") or {}
    k = int(sd["num_spec_tokens"])
    hist = [int(c) for c in sd["acceptance_histogram"]]
    return {"completion_tokens": int(usage.get("completion_tokens", 0)),
            "prompt_tokens": usage.get("prompt_tokens"),
            "verify_ct": int(sd["num_spec_steps"]),
            "accepted_drafts": int(sd["num_accepted_draft_tokens"]),
            "num_draft_tokens": k, "accept_histogram": hist + [0] * max(0, k + 1 - len(hist)),
            "source": "vllm metrics.speculative_decoding"}
