"""The benchmark's tables from per-request rows: one row per arm, and per-position
acceptance per arm.

Prevents two ways a speculative speed-up gets misreported: averaging per-request ratios
(every ratio here is taken last, over the arm's summed counts: tokens/s = summed
completion tokens / summed request seconds, accept length = summed tokens / summed verify
steps, incl. the bonus token), and quoting the server's cumulative number as the run's
own (`/get_server_info`'s `avg_spec_accept_length` counts since boot; it is a column next
to the client's, not a replacement). Per-position acceptance comes from the summed
histogram H[n] = verify steps that accepted exactly n drafts: cumulative P(k) =
sum_{n>=k} H[n] / sum H, conditional P(k | k-1) = sum_{n>=k} H / sum_{n>=k-1} H.
"""

from __future__ import annotations

import math

from eagle3lab.measure.client import avg_spec_accept_length


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


def offline_positions(result: dict, arm: int = 0):
    """`per_position`'s table for one arm of an offline measurement
    (`eagle3lab.specdec.accept.measure_acceptance`'s result): the prediction a live
    server's per-position acceptance is read against, on the same drafter and prompts."""
    import pandas as pd

    rows = [{"arm": "offline", "accept_histogram": r["accept_histogram"]}
            for r in result["arms"][arm]["per_request"]]
    return per_position(pd.DataFrame(rows, columns=["arm", "accept_histogram"]))
