"""The offline engine's acceptance against a live server's, position by position, with the
noise of the counts.

Prevents two misreadings of "the offline prediction matches the server": comparing
differently defined numbers (the engine's tau counts the prefill token, vLLM's mean
acceptance length is 1 + accepted drafts / drafts), and calling a gap real (or noise)
without the token counts behind it. Both sides are reduced to the same raw counts first:
verify steps (vLLM: `num_drafts`) and, per draft position k, the steps that accepted at
least k drafts (vLLM: `num_accepted_tokens_per_pos[k-1]`, which counts position k only
when 1..k-1 were accepted, since acceptance stops at the first rejection:
vllm/v1/spec_decode/metrics.py, vLLM 0.25.1). Then, per position, the cumulative
acceptance P(k) on each side, the difference, its standard error
sqrt(p1 q1 / n1 + p2 q2 / n2) and the difference in standard errors (z); and the mean
accept length 1 + E[accepted] with the standard error of each mean (from the histogram
implied by the counts). A gap within `z_noise` (default 3) standard errors is read as
the noise of the counts.
"""

from __future__ import annotations

import math
from typing import Any


def counts_from_histogram(histogram: list[int]) -> dict[str, Any]:
    """Offline engine counts: H[n] = verify steps that accepted exactly n drafts."""
    steps = sum(histogram)
    at_least = [sum(histogram[k:]) for k in range(1, len(histogram))]
    return {"steps": steps, "at_least": at_least}


def counts_from_window(window: dict[str, Any]) -> dict[str, Any]:
    """Server counts from a /metrics window (`metrics.window`, vLLM counters): drafts and
    the accepted count per position, as the counters gave them."""
    return {"steps": int(window.get("drafts") or 0),
            "at_least": [int(n) for n in window.get("per_position_accepted") or []]}


def _mean_and_se(counts: dict[str, Any]) -> tuple[float, float]:
    """1 + E[accepted drafts per step] and its standard error, from cumulative counts."""
    n, c = counts["steps"], counts["at_least"]
    if not n:
        return math.nan, math.nan
    hist = [n - (c[0] if c else 0)] + [c[k] - (c[k + 1] if k + 1 < len(c) else 0)
                                       for k in range(len(c))]
    mean = sum(i * h for i, h in enumerate(hist)) / n
    var = sum(i * i * h for i, h in enumerate(hist)) / n - mean ** 2
    return 1.0 + mean, math.sqrt(max(var, 0.0) / n)


def compare(offline: dict[str, Any], server: dict[str, Any], *,
            z_noise: float = 3.0) -> dict[str, Any]:
    """offline, server: counts ({"steps", "at_least": [k=1..]}) -> per-position rows and
    the accept-length comparison; `agree` when every gap is within `z_noise` SEs."""
    rows = []
    for k in range(1, max(len(offline["at_least"]), len(server["at_least"])) + 1):
        n1, n2 = offline["steps"], server["steps"]
        a1 = offline["at_least"][k - 1] if k <= len(offline["at_least"]) else None
        a2 = server["at_least"][k - 1] if k <= len(server["at_least"]) else None
        p1 = a1 / n1 if a1 is not None and n1 else math.nan
        p2 = a2 / n2 if a2 is not None and n2 else math.nan
        se = math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2) if n1 and n2 and not (
            math.isnan(p1) or math.isnan(p2)) else math.nan
        diff = p2 - p1
        rows.append({"position": k, "offline_steps": n1, "offline_accepted": a1,
                     "offline_p": p1, "server_steps": n2, "server_accepted": a2,
                     "server_p": p2, "diff": diff, "se": se,
                     "z": diff / se if se and not math.isnan(se) else math.nan})
    m1, s1 = _mean_and_se(offline)
    m2, s2 = _mean_and_se(server)
    se = math.hypot(s1, s2)
    length = {"offline": m1, "offline_se": s1, "server": m2, "server_se": s2,
              "diff": m2 - m1, "z": (m2 - m1) / se if se else math.nan}
    zs = [abs(r["z"]) for r in rows if not math.isnan(r["z"])] + (
        [abs(length["z"])] if not math.isnan(length["z"]) else [])
    return {"positions": rows, "accept_length": length, "z_noise": z_noise,
            "agree": bool(zs) and max(zs) <= z_noise,
            "max_abs_z": max(zs) if zs else math.nan}


def table(result: dict[str, Any]) -> str:
    """The comparison as a few text lines (position, offline, server, diff, z)."""
    L = result["accept_length"]
    lines = [f"{'pos':>3} {'offline':>8} {'server':>8} {'diff':>7} {'z':>6}"]
    for r in result["positions"]:
        lines.append(f"{r['position']:>3} {r['offline_p']:8.3f} {r['server_p']:8.3f} "
                     f"{r['diff']:+7.3f} {r['z']:+6.1f}")
    lines.append(f"accept length: offline {L['offline']:.3f} +- {L['offline_se']:.3f}, "
                 f"server {L['server']:.3f} +- {L['server_se']:.3f} (z {L['z']:+.1f}); "
                 f"{'within' if result['agree'] else 'OUTSIDE'} {result['z_noise']:g} SE")
    return "\n".join(lines)
