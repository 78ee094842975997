"""What an offline acceptance measurement says (notebook 05): the chain-model fit, the
verdict on the failure arms, the speed line, one position of one arm, and the key numbers
for the batch report, all computed from `measure_acceptance`'s result.

Prevents conclusions that drift from the numbers they rest on: the sentences and the key
numbers are derived in one tested place, so a failure arm is compared with the healthy
drafter it was built from (the first arm), a conditional acceptance of a position never
reached (None) never enters the chain fit, "reproduced plain greedy" is claimed only at
temperature 0 with every output equal, and the report quotes what the notebook printed.
Definitions (tau includes the bonus token; cumulative and conditional acceptance) are
those of eagle3lab.specdec.stats.
"""

from __future__ import annotations

from typing import Any


def chain_fit(points: list[dict[str, Any]]) -> float:
    """The i.i.d. acceptance a of the chain model (1 - a^(g+1)) / (1 - a): the mean
    conditional acceptance over the positions reached on the LONGEST chain measured
    (`measure_chain_lengths` points, shortest first); 0.0 when none was reached."""
    if not points:
        return 0.0
    cond = [c for c in points[-1]["conditional"] if c is not None]
    return sum(cond) / len(cond) if cond else 0.0


def failure_verdict(result: dict[str, Any], *, healthy: int = 1) -> str:
    """The first arm's tau, speedups and ceiling; each failure arm (every arm after the
    first `healthy` ones) against it; and whether every output equalled plain greedy."""
    first = result["arms"][0]
    tau = first["stats"]["tau"]
    lines = [f"Healthy drafter: tau {tau:.2f}, measured speedup "
             f"x{first['speedup_measured']:.2f} (predicted from tau and step costs "
             f"x{first['speedup_predicted']:.2f}, ceiling x{first['speedup_ceiling']:.2f})."]
    for a in result["arms"][healthy:]:
        drop = tau - a["stats"]["tau"]
        verdict = ("acceptance collapsed to ~1.0" if a["stats"]["tau"] < 1.1
                   else "acceptance reduced")
        lines.append(f"{a['name']}: tau {a['stats']['tau']:.2f}, {drop:.2f} below the "
                     f"healthy drafter: {verdict}.")
    mism = [a for a in result["arms"] if a["matches_plain"] != result["requests"]]
    lines.append("Every arm reproduced the plain greedy output token for token."
                 if not mism and result["settings"]["temperature"] == 0
                 else f"Outputs differing from plain: {[a['name'] for a in mism]}")
    return "\n".join(lines)


def speed_text(speed: dict[str, Any]) -> str:
    """One line for `measure_speed`'s result: configuration, tau, plain and speculative
    tokens/s, measured/predicted/ceiling speedup, step costs, outputs equal to plain."""
    s, a = speed["settings"], speed["arms"][0]
    return (f"{s['dtype']}, {s['threads']} thread(s), {speed['requests']} prompts x "
            f"{s['max_new_tokens']} tokens, S={s['steps']}: tau {a['stats']['tau']:.2f}; "
            f"plain {speed['plain']['tokens_per_s']:.1f} tok/s, speculative "
            f"{a['stats']['tokens_per_s']:.1f} tok/s: speedup x{a['speedup_measured']:.2f} "
            f"(predicted x{a['speedup_predicted']:.2f}, ceiling "
            f"x{a['speedup_ceiling']:.2f}); step costs: plain "
            f"{speed['plain']['step_s'] * 1e3:.1f} ms, verify {a['verify_step_s'] * 1e3:.1f} "
            f"ms, drafting {a['draft_per_verify_s'] * 1e3:.1f} ms; "
            f"{a['matches_plain']}/{speed['requests']} outputs identical to plain.")


def position_text(result: dict[str, Any], *, arm: str, position: int) -> str | None:
    """Cumulative and conditional acceptance of `arm` at draft `position` (1-based), and
    its tau; None when the arm drafted fewer positions."""
    a = next(x for x in result["arms"] if x["name"] == arm)
    k = position - 1
    cum, cond = a["stats"]["acceptance_cumulative"], a["stats"]["acceptance_conditional"]
    if not 0 <= k < len(cum):
        return None
    return (f"{arm}: position {position}: cumulative {cum[k]:.3f}, conditional "
            f"{cond[k] if cond[k] is not None else float('nan'):.3f}, "
            f"tau {a['stats']['tau']:.3f}")


def summary_numbers(result: dict[str, Any], *, speed: dict[str, Any] | None = None,
                    healthy: int = 1) -> dict[str, Any]:
    """The acceptance notebook's key numbers for the batch report: the first arm's tau,
    per-position acceptance, speedups, tokens/s and equality with plain decoding; the
    failure arms' tau (arms after the first `healthy`); and, with `speed`
    (`measure_speed`), the fastest configuration's tau and speedup (else None)."""
    first = result["arms"][0]
    st = first["stats"]
    return {
        "arm": first["name"], "tau": st["tau"],
        "acceptance_per_position": st["acceptance_cumulative"],
        "conditional_per_position": st["acceptance_conditional"],
        "speedup_measured": first["speedup_measured"],
        "speedup_predicted": first["speedup_predicted"],
        "plain_tokens_per_s": result["plain"]["tokens_per_s"],
        "spec_tokens_per_s": st["tokens_per_s"],
        "same_as_plain": f"{first['matches_plain']}/{result['requests']}",
        "failure_arms_tau": {a["name"]: a["stats"]["tau"] for a in result["arms"][healthy:]},
        "fast_config": (f"{speed['settings']['dtype']}, {speed['settings']['threads']} "
                        f"thread(s)" if speed else None),
        "fast_tau": speed["arms"][0]["stats"]["tau"] if speed else None,
        "fast_speedup_measured": speed["arms"][0]["speedup_measured"] if speed else None,
    }
