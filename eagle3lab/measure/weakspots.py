"""The prompts a drafter fails on: per-prompt acceptance ranked, grouped by prompt length
and kind, the worst shown with the drafts beside what the target said, and exported as a
prompts file for `self-prompt --seed-prompts` and `regenerate --prompts`.

Prevents a drafter whose weak spots nobody sees: one tau over a whole prompt set hides
that it accepts almost nothing on, say, code or long prompts, and that more data of the
kind it already handles buys little. Per-prompt counts come from the offline engine
(`eagle3lab accept --json`: `per_request`, with the prompt, what the target said and the
rejected drafts) or from a server's per-request counts (`server_per_request`: SGLang's
meta_info, `eagle3lab serve`, vLLM with per-request stats; measure/client.py
`per_request_spec`). Every group's tau is a ratio of sums (accepted drafts + verify steps)
/ verify steps, never a mean of per-prompt ratios. Per prompt, tau is the decode-phase
number, 1 + accepted drafts / verify steps (SGLang's log line and vLLM's
mean_acceptance_length): completion tokens / verify steps would count the prefill token
too, and so favour short answers.

Weak spots found on the held-out eval prompts and fed back into training leak the eval
set: rank a separate slice (a prompts file of its own), and keep `--exclude eval` when
self-prompting from them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

from eagle3lab.data.prompts import chat_prompt_ids, load_prompts
from eagle3lab.data.remote import TargetInfo
from eagle3lab.errors import UserError
from eagle3lab.fsutil import atomic_path, atomic_write_json, read_json_object
from eagle3lab.measure.client import http_json, per_request_spec
from eagle3lab.specdec.stats import AcceptStats, decode_accept_length

SERVER_KIND = "eagle3lab-server-per-request"
#: prompt-length bins (tokens of the chat-templated prompt), upper edges
LENGTH_BINS = (32, 64, 128, 256)
_REQUIRED = ("verify_ct", "accept_histogram")


@dataclasses.dataclass
class WeakSpots:
    """`weak_spots`' answer: the ranking (one row per prompt, worst first), tau by prompt
    length and by kind, the worst prompts with their drafts, where the export went, and
    where the counts came from."""

    ranking: Any  # pandas DataFrame
    by_length: Any
    by_category: Any
    worst: list[dict[str, Any]]
    source: dict[str, Any]
    exported: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "exported": self.exported,
                "ranking": self.ranking.to_dict(orient="records"),
                "by_length": self.by_length.to_dict(orient="records"),
                "by_category": self.by_category.to_dict(orient="records"),
                "worst": self.worst}


def load_per_request(path: str | os.PathLike | dict[str, Any], *, arm: str | None = None
                     ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The per-prompt records of an `eagle3lab accept --json` output (a file, or
    `measure_acceptance`'s result itself; arm `arm`, default the first) or of
    `server_per_request`'s results, and where they came from. Anything else, or a record
    without its counts, is a UserError naming the file, record and fix."""
    if isinstance(path, dict):
        obj, path = path, "<measure_acceptance result>"
    else:
        obj = read_json_object(path, what="acceptance results",
                               fix="Write one with `eagle3lab accept --json > accept.json`.")
    if obj.get("kind") == SERVER_KIND:
        records, info = obj.get("per_request"), {"kind": "server", "server": obj.get("server"),
                                                 "api": obj.get("api"),
                                                 "prompts": obj.get("prompts")}
    elif isinstance(obj.get("arms"), list):
        arms = obj["arms"]
        names = [a.get("name") for a in arms]
        if not arms:
            raise UserError(f"{path}: the accept results hold no arms (no drafter measured).")
        pick = arms[0] if arm is None else next((a for a in arms if a.get("name") == arm),
                                                None)
        if pick is None:
            raise UserError(f"{path}: no arm {arm!r}; the arms are {names}. Pass one of them "
                            f"(--arm).")
        records, info = pick.get("per_request"), {"kind": "offline", "arm": pick.get("name"),
                                                  "arms": names, "prompts": obj.get("prompts"),
                                                  "settings": obj.get("settings")}
    else:
        raise UserError(f"{path}: neither `eagle3lab accept --json` output (no 'arms') nor "
                        f"weak-spots server results (kind {SERVER_KIND!r}). Write one with "
                        f"`eagle3lab accept --json > accept.json` or `eagle3lab weak-spots "
                        f"--server URL --save results.json`.")
    if not isinstance(records, list) or not records:
        raise UserError(f"{path}: no per-request records ('per_request' is missing or empty); "
                        f"re-run `eagle3lab accept --json` with this version.")
    for i, r in enumerate(records):
        missing = [k for k in _REQUIRED if not isinstance(r, dict) or k not in r]
        if missing or not isinstance(r["accept_histogram"], list):
            raise UserError(f"{path}: per_request[{i}] lacks {missing or ['accept_histogram']} "
                            f"(a list of verify steps per accepted-draft count); the file "
                            f"was not written by `eagle3lab accept --json`.")
    info["path"] = str(path)
    return records, info


def prompt_row(r: dict[str, Any]) -> dict[str, Any]:
    """One prompt's raw counts and rates: tau = 1 + accepted / verify steps (decode
    phase), accept_length = completion tokens / verify steps (SGLang's meta_info), and
    acc@k = P(draft positions 1..k all accepted) from its histogram."""
    hist = [int(c) for c in r["accept_histogram"]]
    steps = int(r["verify_ct"]) or sum(hist)
    accepted = sum(k * c for k, c in enumerate(hist))
    row = {"prompt": r.get("prompt"), "category": r.get("category") or "unknown",
           "prompt_tokens": r.get("prompt_tokens"),
           "completion_tokens": r.get("completion_tokens"), "verify_ct": steps,
           "accepted": accepted,
           "tau": decode_accept_length(accepted, steps),
           "accept_length": (r["completion_tokens"] / steps
                             if steps and r.get("completion_tokens") is not None else math.nan)}
    cum = (AcceptStats(histogram=hist).cumulative() if sum(hist)
           else [math.nan] * (len(hist) - 1))  # the one definition (specdec/stats.py)
    for k, a in enumerate(cum, 1):
        row[f"acc@{k}"] = a
    return row


def rank_prompts(records: list[dict[str, Any]]):
    """One row per prompt that was verified at least once, lowest tau first (ties: fewer
    verify steps last, then the prompt id)."""
    import pandas as pd

    rows = [prompt_row(r) for r in records]
    df = pd.DataFrame([r for r in rows if r["verify_ct"]])
    if df.empty:
        raise UserError("No prompt was verified even once (every answer ended at its first "
                        "token); raise max_new_tokens.")
    return df.sort_values(["tau", "verify_ct", "prompt"], ascending=[True, False, True],
                          kind="stable").reset_index(drop=True)


def length_bin(tokens: Any, bins: tuple[int, ...] = LENGTH_BINS) -> str:
    """The bin label of a prompt length in tokens ('<=32', ..., '>256', 'unknown')."""
    if tokens is None or (isinstance(tokens, float) and math.isnan(tokens)):
        return "unknown"
    for edge in bins:
        if tokens <= edge:
            return f"<={edge}"
    return f">{bins[-1]}"


def tau_by(ranking, column: str):
    """tau per group of `column` as a ratio of sums, with the prompts, the verify steps
    and the per-prompt range; worst group first."""
    import pandas as pd

    rows = []
    for key, g in ranking.groupby(column, sort=False, dropna=False):
        steps, acc = int(g["verify_ct"].sum()), int(g["accepted"].sum())
        rows.append({column: key, "prompts": len(g), "verify_ct": steps,
                     "tau": decode_accept_length(acc, steps),
                     "tau_min": float(g["tau"].min()), "tau_max": float(g["tau"].max())})
    return pd.DataFrame(rows).sort_values("tau", kind="stable").reset_index(drop=True)


def worst_prompts(records: list[dict[str, Any]], ranking, n: int = 10,
                  *, chars: int = 240) -> list[dict[str, Any]]:
    """The `n` lowest-tau prompts: the prompt, what the target said (first `chars`
    characters) and, where the engine kept them, the first rejected drafts beside the
    target's tokens at that position."""
    by_id = {r.get("prompt"): r for r in records}
    out = []
    for row in ranking.head(n).to_dict(orient="records"):
        r = by_id.get(row["prompt"], {})
        said = r.get("target_text")
        out.append({"prompt": row["prompt"], "category": row["category"],
                    "tau": row["tau"], "verify_ct": row["verify_ct"],
                    "text": r.get("text"),
                    "target_said": said[:chars] if isinstance(said, str) else None,
                    "mismatches": r.get("mismatches_shown") or []})
    return out


def export_weakest(records: list[dict[str, Any]], ranking, out: str | os.PathLike, *,
                   n: int, source: dict[str, Any]) -> Path:
    """The `n` lowest-tau prompts as a prompts JSONL (eagle3lab.data.prompts' format: id,
    prompt, category; plus tau), worst first, and OUT.meta.json with where they came from.
    Prompts without their text (an older accept output) are a UserError."""
    by_id = {r.get("prompt"): r for r in records}
    rows = ranking.head(n).to_dict(orient="records")
    lines = []
    for row in rows:
        text = by_id.get(row["prompt"], {}).get("text")
        if not isinstance(text, str) or not text.strip():
            raise UserError(f"prompt {row['prompt']!r} has no text in {source.get('path')}: "
                            f"it was written before per-prompt texts were kept. Re-run "
                            f"`eagle3lab accept --json` to export.")
        lines.append(json.dumps({"id": f"weak-{row['prompt']}", "prompt": text,
                                 "category": row["category"], "tau": round(row["tau"], 4)},
                                ensure_ascii=False))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    atomic_write_json(out.with_name(out.name + ".meta.json"),  # data/regenerate's convention
                      {"kind": "eagle3lab-weak-spots", "source": source, "prompts": len(lines),
                       "tau": [round(r["tau"], 4) for r in rows]})
    return out


def weak_spots(source: str | os.PathLike | dict[str, Any], *, arm: str | None = None, worst: int = 10,
               export: str | os.PathLike | None = None, export_n: int | None = None,
               bins: tuple[int, ...] = LENGTH_BINS) -> WeakSpots:
    """Rank the prompts of `source` (an `eagle3lab accept --json` output, or
    `server_per_request`'s file) by tau; tau by prompt length (`bins`, tokens) and by
    kind (the prompt's category); the `worst` lowest with their drafts; with `export`,
    the `export_n` (default `worst`) lowest written as a prompts JSONL."""
    for name, v in (("worst", worst), ("export_n", export_n)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise UserError(f"{name} (--{name.replace('_', '-')}) must be a whole number of "
                            f"at least 1, got {v!r}.")
    if not bins or list(bins) != sorted(set(bins)) or bins[0] < 1:
        raise UserError(f"bins (--bins) must be increasing token counts >= 1, got {bins!r}.")
    records, info = load_per_request(source, arm=arm)
    ranking = rank_prompts(records)
    ranking["length"] = [length_bin(t, tuple(bins)) for t in ranking["prompt_tokens"]]
    order = {f"<={e}": i for i, e in enumerate(bins)} | {f">{bins[-1]}": len(bins),
                                                        "unknown": len(bins) + 1}
    by_length = tau_by(ranking, "length")
    by_length = by_length.sort_values("length", key=lambda s: s.map(order),
                                      kind="stable").reset_index(drop=True)
    exported = None
    if export is not None:
        exported = str(export_weakest(records, ranking, export, n=export_n or worst,
                                      source=info))
    return WeakSpots(ranking=ranking, by_length=by_length,
                     by_category=tau_by(ranking, "category"),
                     worst=worst_prompts(records, ranking, worst), source=info,
                     exported=exported)


def worst_text(ws: WeakSpots, *, mismatches: int = 2) -> str:
    """The worst prompts as lines of text (the CLI and notebook 05 print it): each prompt,
    its kind and tau, what the target said, and its first rejected drafts beside the
    target's tokens."""
    lines = []
    for x in ws.worst:
        lines.append(f"- {x['prompt']} [{x['category']}] tau {x['tau']:.2f} over "
                     f"{x['verify_ct']} steps: {(x['text'] or '')[:100]!r}")
        if x["target_said"]:
            lines.append(f"    target said: {x['target_said'][:120]!r}")
        for m in x["mismatches"][:mismatches]:
            lines.append(f"    at token {m['position']} after {m['before'][-40:]!r}: "
                         f"drafted {m['draft']!r}, target {m['target']!r}")
    return "\n".join(lines)


def server_per_request(url: str, *, prompts: Any = "eval", target: Any = None,
                       api: str = "sglang", limit: int | None = None,
                       max_new_tokens: int = 128, temperature: float = 0.0,
                       save: str | os.PathLike | None = None,
                       timeout_s: float = 600.0) -> dict[str, Any]:
    """Send each prompt (chat-templated here with the target's tokenizer, as token ids) to
    a running server and keep its own per-request speculative counts: SGLang's or
    `eagle3lab serve`'s `/generate` (api "sglang"), vLLM's `/v1/completions` (api "vllm";
    only a vLLM with per-request speculative stats has them). The first answer without
    them stops the run with one line (measure/client.py `NO_PER_REQUEST_STATS`). Returns
    (and with `save`, writes) a results object `weak_spots` reads."""
    if api not in ("sglang", "vllm"):
        raise UserError(f"api (--api) must be 'sglang' or 'vllm', got {api!r}.")
    tok = TargetInfo(target).tokenizer
    url = url.rstrip("/")
    records = []
    for p in load_prompts(prompts, limit=limit):
        ids = chat_prompt_ids(tok, p.prompt)
        if api == "sglang":
            path, body = "/generate", {"input_ids": ids, "sampling_params": {
                "max_new_tokens": max_new_tokens, "temperature": temperature}}
        else:
            path, body = "/v1/completions", {"prompt": ids, "max_tokens": max_new_tokens,
                                             "temperature": temperature,
                                             "return_token_ids": True}
        status, resp = http_json(url + path, body, timeout_s=timeout_s)
        if status != 200:
            raise UserError(f"{url}{path} answered {status} for prompt {p.id!r}: "
                            f"{str(resp)[:300]}")
        c = per_request_spec(resp, where=f"{url}{path}")
        text = (resp.get("text") if api == "sglang"
                else ((resp.get("choices") or [{}])[0]).get("text"))
        records.append({"prompt": p.id, "text": p.prompt, "category": p.category,
                        "prompt_tokens": len(ids), "completion_tokens": c["completion_tokens"],
                        "verify_ct": c["verify_ct"], "accept_histogram": c["accept_histogram"]
                        or _histogram_unknown(c), "num_draft_tokens": c["num_draft_tokens"],
                        "target_text": text, "source": c["source"]})
    out = {"kind": SERVER_KIND, "server": url, "api": api, "prompts": str(prompts),
           "settings": {"max_new_tokens": max_new_tokens, "temperature": temperature},
           "per_request": records}
    if save is not None:
        atomic_write_json(save, out)
    return out


def _histogram_unknown(c: dict[str, Any]) -> list[int]:
    """No histogram in the answer (an SGLang that sent none): the accepted total alone,
    as one bucket per step would misstate it; refused."""
    raise UserError("The server sent spec_verify_ct but no accept histogram "
                    "(spec_correct_drafts_histogram / spec_accept_histogram); per-position "
                    "acceptance cannot be derived. Use SGLang 0.5.23 or `eagle3lab serve`.")
