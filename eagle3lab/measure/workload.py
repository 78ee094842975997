"""The benchmark's requests: one fixed prompt set, sent to a server's native `/generate`,
one row of raw counts per request.

Prevents comparing speculative and baseline runs made on different inputs: the chat
template is applied here, once, and the same `input_ids` go to every server (a server
that templated the text itself could tokenize differently), with the same token budget
and temperature (greedy by default). Each row keeps the raw counts SGLang returns in
`meta_info` (completion tokens, latency, `spec_verify_ct`, the accept histogram) so that
ratios are taken later over sums, never averaged per request. Accept length per request =
completion tokens / verify steps, as SGLang's meta_info defines it, INCLUDING the bonus
token (the first token, from prefill, counts too, so short requests read a little above
the server's decode-phase number).

SGLang field names (python/sglang/srt/managers/tokenizer_manager.py): `spec_verify_ct`,
`spec_accept_length`, `spec_accept_rate`, and the histogram as `spec_accept_histogram`
or (0.5.23) `spec_correct_drafts_histogram`; both are read. A request the server refuses
is a `UserError` naming the prompt and the server's answer.
"""

from __future__ import annotations

import math
import time
from typing import Any

from eagle3lab.data.prompts import chat_prompt_ids
from eagle3lab.errors import UserError
from eagle3lab.measure.client import HISTOGRAM_KEYS, http_json


def build_requests(prompts: list, tokenizer=None) -> list[dict[str, Any]]:
    """Prompts (eagle3lab Prompt objects or strings) -> requests. With a tokenizer the
    chat template is applied here and `input_ids` are sent (identical for every server);
    without one the raw `text` is sent."""
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


def request_row(arm: str, req: dict[str, Any], resp: dict[str, Any], latency: float) -> dict:
    """One request's raw counts from `/generate`'s answer (meta_info), and its latency."""
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
        rows.append(request_row(arm, req, resp, latency))
    return pd.DataFrame(rows)
