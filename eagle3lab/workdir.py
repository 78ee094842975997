"""The layout of a work directory, and where the shipped default drafter is found.

Prevents two stages (or a stage and a notebook, the report's wiring, the GPU bench) from
disagreeing about where one writes and the next reads: every path between the pipeline's
stages is spelled once, here, as a property of `WorkDir`, and every caller asks it
instead of joining strings. Likewise `default_drafter` is the one lookup of "the drafter
to use when none is given" (`eagle3lab accept`, `eagle3lab serve --speculative`, the
notebooks, the report), so they cannot each pick a different one.

Layout of a work directory (data/runs/default by default):
  prompts/self.jsonl                             prompts the target wrote (bench/gpu_pipeline)
  responses/{train,eval}.jsonl (+ .meta.json)   regenerated conversations
  shards/{train,eval}/                           shards + manifest.json
  shards/train/vocab_map.safetensors             draft vocab map (train split only)
  train/                                         the drafter's training run (final/ inside)
  converted/sglang/                              the drafter in SGLang's format
  stages/NAME.json                               one record per pipeline stage
  studies/NAME/                                  studies on these shards (notebook 06)
  drafter-RUN/, accept-RUN.json                  a run packed for shipping, its acceptance

Imports only `eagle3lab.config`, `eagle3lab.errors` and the shard format's file names, so
every layer may use it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from eagle3lab.config import DEFAULT_TARGET, TARGET_PRESETS, repo_root, runs_dir
from eagle3lab.data.shards import VOCAB_MAP
from eagle3lab.errors import UserError

#: Name of the pipeline's training run inside a work directory.
TRAIN_RUN = "train"
#: The finished drafter inside a training run (written by eagle3lab.train.checkpoints).
FINAL = "final"
#: a step checkpoint carried without its frozen tensors holds this record of them (their
#: sha256; eagle3lab.train.checkpoints): it resumes, but is no drafter to serve or decode
LEFT_OUT = "left-out.json"


@dataclasses.dataclass(frozen=True)
class WorkDir:
    """One work directory; each property is where one stage writes and the next reads."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @classmethod
    def default(cls) -> "WorkDir":
        """data/runs/default (under EAGLE3LAB_DATA when set): the demo's work dir."""
        return cls(runs_dir() / "default")

    # -- data ---------------------------------------------------------------------------
    @property
    def self_prompts(self) -> Path:
        return self.root / "prompts" / "self.jsonl"

    def responses(self, split: str) -> Path:
        """Conversations JSONL of one split (train, eval, or a part such as `self`)."""
        return self.root / "responses" / f"{split}.jsonl"

    def shards(self, split: str) -> Path:
        return self.root / "shards" / split

    @property
    def responses_train(self) -> Path:
        return self.responses("train")

    @property
    def responses_eval(self) -> Path:
        return self.responses("eval")

    @property
    def shards_train(self) -> Path:
        return self.shards("train")

    @property
    def shards_eval(self) -> Path:
        return self.shards("eval")

    @property
    def vocab_map(self) -> Path:
        return self.shards_train / VOCAB_MAP

    # -- training and what is made of the trained drafter --------------------------------
    def run(self, name: str = TRAIN_RUN) -> Path:
        """A training run directory (the pipeline's is `train`; others may sit beside it)."""
        return self.root / name

    def final_of(self, name: str = TRAIN_RUN) -> Path:
        return self.run(name) / FINAL

    def packed(self, name: str = TRAIN_RUN) -> Path:
        """Run `name`'s drafter packed for shipping (eagle3lab.train.pack_drafter)."""
        return self.root / f"drafter-{name}"

    def accept_record(self, name: str = TRAIN_RUN) -> Path:
        """Offline acceptance of the packed drafter of run `name` (JSON)."""
        return self.root / f"accept-{name}.json"

    @property
    def train_run(self) -> Path:
        return self.run()

    @property
    def final(self) -> Path:
        return self.final_of()

    @property
    def sglang_copy(self) -> Path:
        return self.root / "converted" / "sglang"

    # -- records and studies -------------------------------------------------------------
    @property
    def stages(self) -> Path:
        return self.root / "stages"

    def stage_record(self, name: str) -> Path:
        return self.stages / f"{name}.json"

    @property
    def studies(self) -> Path:
        return self.root / "studies"

    def study(self, name: str) -> Path:
        return self.studies / name

    def as_dict(self) -> dict[str, Path]:
        """The fixed paths by name (for records, and the report's wiring placeholders)."""
        names = ("root", "self_prompts", "responses_train", "responses_eval", "shards_train",
                 "shards_eval", "vocab_map", "train_run", "final", "sglang_copy", "stages",
                 "studies")
        return {n: getattr(self, n) for n in names}


def drafters_dir() -> Path:
    """Shipped drafters, one per preset target (data/drafters/<target>), and for the default
    target also an SGLang-servable one (data/drafters/<target>-sglang); always the
    repository's (like prompts)."""
    return repo_root() / "data" / "drafters"


#: The suffix of a preset's SGLang-servable shipped drafter (data/drafters/<target>-sglang),
#: shipped where the default drafter is one SGLang refuses (normed: docs/study.md).
SGLANG_SUFFIX = "-sglang"


def _serves_where(drafter: Path) -> str:
    """Which engines serve a shipped drafter, from its config: SGLang's LlamaForCausalLMEagle3
    has none of speculators' optional norms, so a normed drafter is vLLM's (and the
    reference engine's) only."""
    import json

    cfg = json.loads((drafter / "config.json").read_text())
    normed = [k for k in ("norm_before_fc", "norm_before_residual", "norm_output") if cfg.get(k)]
    return (f"vLLM and the reference engine; SGLang refuses it ({', '.join(normed)})"
            if normed else "SGLang (convert it: eagle3lab convert --to sglang), vLLM and "
            "the reference engine")


def shipped_drafters() -> dict[str, str]:
    """Every shipped drafter's directory name -> which engines serve it."""
    root = drafters_dir()
    return {d.name: _serves_where(d) for d in sorted(root.iterdir())
            if (d / "config.json").is_file()} if root.is_dir() else {}


def default_drafter(target: str | os.PathLike = DEFAULT_TARGET, *,
                    work: WorkDir | None = None, engine: str | None = None) -> str | None:
    """The drafter to use when none is given: the one shipped for a preset target
    (data/drafters/<target>; for `engine="sglang"` its SGLang-servable one,
    data/drafters/<target>-sglang, where one is shipped), else the trained drafter of
    `work` when it exists (without `work`: the demo's work dir, for preset targets only:
    that is what the demo trains for), else None."""
    name = str(target)
    if name in TARGET_PRESETS:
        for candidate in ([name + SGLANG_SUFFIX] if engine == "sglang" else []) + [name]:
            if (drafters_dir() / candidate / "config.json").is_file():
                return str(drafters_dir() / candidate)
    if work is None and name in TARGET_PRESETS:
        work = WorkDir.default()
    if work is not None and (work.final / "config.json").is_file():
        return str(work.final)
    return None


def drafter_or_default(draft: str | os.PathLike | None, target: str | os.PathLike,
                       option: str = "--draft", *, engine: str | None = None) -> str:
    """`draft` when given, else the default drafter for `target` (and `engine`: SGLang gets
    the SGLang-servable shipped drafter); a UserError naming `option` when there is
    neither."""
    if draft:
        return str(draft)
    found = default_drafter(target, engine=engine)
    if found is None:
        shipped = "; ".join(f"{name}: {where}" for name, where in shipped_drafters().items())
        raise UserError(f"No drafter given ({option}) and no default drafter for target "
                        f"{str(target)!r}: none is shipped in {drafters_dir()}/ for it and "
                        f"none is trained in {WorkDir.default().final} (a default is picked "
                        f"for a preset's name only: {', '.join(sorted(TARGET_PRESETS))}; a "
                        f"directory holding a preset's weights takes its shipped drafter "
                        f"by path). Shipped drafters (the first is the default, the "
                        f"-sglang one the default for --engine sglang): "
                        f"{shipped or 'none'}. Pass {option} CHECKPOINT (a drafter "
                        f"directory).")
    return found
