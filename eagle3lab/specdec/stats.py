"""Acceptance statistics from raw counts, in the forms SGLang reports.

Prevents comparing numbers that measure different things: every rate here is derived
last from summed raw counts (verify steps, completion tokens, the accept histogram), and
each definition is stated once:
- tau (accept length) = completion tokens / verify steps, INCLUDING the target's bonus
  token (floor 1.0; the first token, from prefill, is not a verify step — SGLang's
  completion_tokens / spec_verify_ct).
- decode-phase accept length = 1 + accepted drafted tokens / verify steps: vLLM's
  mean acceptance length and SGLang's log line (`decode_accept_length`). It leaves out the
  prefill's token and a last step cut short by a token limit, so per-prompt rankings of
  short decodes use it (one prefill token in 20 would move tau by 5%); over a long
  decode the two agree within 1 / verify steps.
- histogram H[n] = verify steps that accepted exactly n drafted tokens (SGLang's
  `spec_accept_histogram`).
- cumulative acceptance at draft position k (1-based) = P(positions 1..k all accepted)
  = sum_{n>=k} H[n] / sum H.
- conditional acceptance at position k = P(k accepted | k-1 accepted)
  = sum_{n>=k} H[n] / sum_{n>=k-1} H[n].
- chain model (Leviathan et al. 2023, Thm 3.8): with i.i.d. acceptance a and g drafts,
  expected tokens per verify = (1 - a**(g+1)) / (1 - a).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable


def decode_accept_length(accepted: int, verify_steps: int) -> float:
    """1 + accepted drafted tokens / verify steps (NaN without a verify step)."""
    return 1 + accepted / verify_steps if verify_steps else math.nan


@dataclasses.dataclass
class AcceptStats:
    """Summed raw counts over many generations."""

    requests: int = 0
    completion_tokens: int = 0
    verify_ct: int = 0
    histogram: list[int] = dataclasses.field(default_factory=list)
    decode_s: float = 0.0
    verify_s: float = 0.0
    draft_s: float = 0.0

    @classmethod
    def from_results(cls, results: Iterable[Any]) -> "AcceptStats":
        s = cls()
        for r in results:
            s.add(r)
        return s

    def add(self, r) -> None:
        self.requests += 1
        self.completion_tokens += r.completion_tokens
        self.verify_ct += r.verify_ct
        h = list(r.accept_histogram)
        if len(h) > len(self.histogram):
            self.histogram += [0] * (len(h) - len(self.histogram))
        for i, v in enumerate(h):
            self.histogram[i] += v
        self.decode_s += r.decode_s
        self.verify_s += r.verify_s
        self.draft_s += r.draft_s

    # --- ratios, taken last ----------------------------------------------------------------
    @property
    def tau(self) -> float:
        return self.completion_tokens / self.verify_ct if self.verify_ct else 1.0

    @property
    def mean_accepted(self) -> float:
        """Drafted tokens accepted per verify step (tau without the bonus token)."""
        total = sum(self.histogram)
        return sum(n * h for n, h in enumerate(self.histogram)) / total if total else 0.0

    def cumulative(self) -> list[float]:
        """P(draft positions 1..k all accepted), k = 1..len(histogram)-1."""
        total = sum(self.histogram)
        return [sum(self.histogram[k:]) / total if total else 0.0
                for k in range(1, len(self.histogram))]

    def conditional(self) -> list[float | None]:
        """P(position k accepted | position k-1 accepted); None where k-1 never was."""
        out: list[float | None] = []
        for k in range(1, len(self.histogram)):
            reached = sum(self.histogram[k - 1:])
            out.append(sum(self.histogram[k:]) / reached if reached else None)
        return out

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.decode_s if self.decode_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests, "completion_tokens": self.completion_tokens,
            "verify_ct": self.verify_ct, "accept_histogram": list(self.histogram),
            "tau": self.tau, "mean_accepted_drafts": self.mean_accepted,
            "acceptance_cumulative": self.cumulative(),
            "acceptance_conditional": self.conditional(),
            "decode_s": self.decode_s, "tokens_per_s": self.tokens_per_s,
            "verify_s": self.verify_s, "draft_s": self.draft_s,
        }


def chain_expected_tau(a: float, g: int) -> float:
    """Expected tokens per verify for i.i.d. acceptance a with g drafts (incl. bonus)."""
    if a >= 1.0:
        return float(g + 1)
    return (1 - a ** (g + 1)) / (1 - a)


def predicted_speedup(*, tau: float, plain_step_s: float, verify_step_s: float,
                      draft_per_verify_s: float) -> float:
    """Speedup over plain decoding predicted from tau and measured step costs:
    tau tokens per (one verify forward + the drafting for it), vs one token per plain step."""
    per_iter = verify_step_s + draft_per_verify_s
    return tau * plain_step_s / per_iter if per_iter > 0 else 0.0
