"""What one generation returns, as raw counts (ratios are taken last, by the reader).

Definitions, shared by the offline engine, the
reference server and the SGLang log/metric readers so that numbers compare directly:
- verify_ct: target forward passes in the decode phase (plain decoding: one per token).
- accept_histogram[n]: verify steps that accepted exactly n draft tokens (SGLang's
  `spec_accept_histogram` form); len = num_draft_tokens + 1.
- accept length tau = completion tokens / verify_ct, INCLUDING the target's bonus token,
  so the floor is 1.0.
- mismatches (speculative decoding, eager and static engines alike; None for plain
  decoding): one `[position, drafts, target]` per verify step that rejected a draft, where position indexes `output_ids` (the token the
  target emitted there is `target`), `drafts` the draft tokens from that position on (the
  first is the one the target refused; a tree's: the candidate children of the last
  accepted node). Kept so a weak prompt can show what the drafter proposed next to what
  the target said (eagle3lab.measure.weakspots).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class GenerationResult:
    output_ids: list[int]  # new tokens only (the stop token included when it ended the text)
    finish_reason: str  # "stop" or "length"
    verify_ct: int
    accept_histogram: list[int]
    num_draft_tokens: int  # drafts proposed per verify step (0 for plain decoding)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    verify_s: float = 0.0  # decode-phase time in target forwards (plain: all of decode_s)
    draft_s: float = 0.0  # decode-phase time in drafter forwards and tree building
    mismatches: list[list] | None = None  # [position, draft ids, target id] per rejection

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def accept_length(self) -> float:
        return self.completion_tokens / self.verify_ct if self.verify_ct else 1.0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["completion_tokens"] = self.completion_tokens
        d["accept_length"] = self.accept_length
        return d
