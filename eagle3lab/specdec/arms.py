"""The arms of an offline acceptance comparison (notebook 05): which drafters are measured,
and the failure arms built from the first of them.

Prevents a comparison that measures something other than what its labels say: drafters
given twice are measured once; with none given, the default drafter is used (the shipped
one for a preset target), and when there is none an UNTRAINED drafter is built and a note
says so (a tau of ~1.0 is then expected, not a finding); the failure arms (`last_layer`
features, an SGLang config over speculators' `layers.0.*` keys) are built from the SAME
drafter as the first healthy arm, so the drop in tau is the failure's and nothing else's.
A first drafter that SGLang's format cannot hold (a normed one: speculators' `eagle3`
defaults, the shipped default drafter since 2026-12-03) gets no SGLang-config arm, and a
note says why (SGLang cannot serve it at all, which the doctor and `convert` say), instead
of the whole comparison failing on the conversion's refusal.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from eagle3lab.formats.convert import VARIANT_CODES, ConversionError
from eagle3lab.formats.demo import make_speculators_draft
from eagle3lab.specdec.accept import Arm
from eagle3lab.specdec.failures import sglang_config_speculators_keys
from eagle3lab.targets.adapter import resolve_target_path
from eagle3lab.workdir import default_drafter

#: Names of the failure arms (what a broken server would feed or load).
LAST_LAYER_ARM = "last_layer features"
DROPPED_KEYS_ARM = "sglang config + layers.0 keys"


@dataclasses.dataclass
class ArmPlan:
    """The drafters measured (healthy arms first, one per drafter), the failure arms
    after them, and notes to show the reader."""

    drafts: list[str]
    arms: list[Arm]
    notes: list[str]

    @property
    def healthy(self) -> int:
        """How many arms (the first ones) are healthy drafters; the rest are failure arms."""
        return len(self.drafts)


def acceptance_arms(*, drafts: list, target: str | os.PathLike, workdir: str | os.PathLike,
                    compare_failures: bool = True) -> ArmPlan:
    """Arms for `measure_acceptance`: one per distinct drafter in `drafts` (named `healthy`
    when there is one, else by its last two path parts), else the default drafter of
    `target`, else an untrained one built in `workdir`; with `compare_failures` the two
    failure arms of the first drafter (their checkpoint is written in `workdir`)."""
    workdir = Path(workdir)
    notes: list[str] = []
    draft_list = list(dict.fromkeys(str(d) for d in drafts)) or [
        d for d in [default_drafter(target)] if d]
    if not draft_list:
        draft_list = [str(make_speculators_draft(workdir / "untrained",
                                                 target=resolve_target_path(target),
                                                 draft_vocab=4096))]
        notes.append("No trained drafter found: using an UNTRAINED one (expect tau ~1.0). "
                     "Train one with `eagle3lab train` or pass drafts=[...].")
    arms = [Arm("/".join(Path(d).parts[-2:]) if len(draft_list) > 1 else "healthy", d)
            for d in draft_list]
    if compare_failures:
        arms.append(Arm(LAST_LAYER_ARM, draft_list[0], "last_layer"))
        try:
            bad = sglang_config_speculators_keys(draft_list[0], workdir / "keys-mismatch",
                                                 target=resolve_target_path(target))
        except ConversionError as e:
            if e.code not in VARIANT_CODES:  # a broken checkpoint: said as it is
                raise
            notes.append(f"No '{DROPPED_KEYS_ARM}' arm: {draft_list[0]} cannot be written in "
                         f"SGLang's format, so SGLang cannot serve it at all ({e.reason})")
        else:
            arms.append(Arm(DROPPED_KEYS_ARM, str(bad), "fused", "sglang"))
    return ArmPlan(drafts=draft_list, arms=arms, notes=notes)
