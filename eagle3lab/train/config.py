"""The training run's settings: `TrainConfig` (strict) and the serving engines' flags.

Prevents two silent failures:
- options the serving engine ignores: `serve_engine` picks the speculators flags that
  engine actually implements (ENGINE_PROFILES) and the run records the choice;
- a resumed run that is not the same run: resuming with other settings (those that change
  what is computed) is refused naming both values; a typo'd or mistyped key is refused
  instead of ignored (`strict_from_dict`).

`eagle3lab train`'s options are generated from TrainConfig's fields, their help from each
field's trailing comment (`commands/train.py` reads this class's source): keep one field a
line, `name: type = default  # help`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from eagle3lab.config import strict_from_dict
from eagle3lab.errors import UserError

#: Speculators EAGLE-3 flags each serving engine implements (checked against the engines'
#: llama_eagle3.py): SGLang 0.5.x has no input_norm (norm_before_fc) and silently drops
#: `input_norm.weight`, keeps the un-normed residual, feeds back the pre-norm state and has
#: no sliding-window draft attention. vLLM reads norm_before_residual and input_norm.
ENGINE_PROFILES: dict[str, dict[str, Any]] = {
    "sglang": {"norm_before_residual": False, "norm_before_fc": False, "fc_norm": False,
               "norm_output": False, "full_attention": True},
    "vllm": {"norm_before_residual": True, "norm_before_fc": True, "fc_norm": False,
             "norm_output": False, "full_attention": True},
}


@dataclasses.dataclass
class TrainConfig:
    data: str  # train shard directory (made by `eagle3lab extract`, with a vocab map)
    out: str  # run directory: run.json, metrics.jsonl, checkpoints/, final/
    eval_data: str | None = None  # held-out shards; None = hold out eval_fraction of data
    eval_fraction: float = 0.05  # used only without eval_data
    data_fraction: float = 1.0  # train on this fraction of the samples (nested subsets)
    data_seed: int = 0  # picks the held-out and data_fraction subsets (not the data order)
    epochs: int = 1  # passes over the (fraction of the) data; max_steps/max_tokens cut it
    max_steps: int | None = None  # stop after this many optimizer steps
    max_tokens: int | None = None  # stop once this many tokens were processed (equal compute)
    max_tokens_per_batch: int = 2048  # packed tokens per step (speculators' total_seq_len)
    pad_batches: bool = False  # pad batches to max_tokens_per_batch (always on CUDA: compile)
    lr: float = 3e-4  # peak learning rate (AdamW)
    schedule: Literal["constant", "cosine", "linear"] = "cosine"  # after warmup
    warmup_steps: int = 0
    weight_decay: float = 0.01
    grad_clip: float = 1.0  # max global grad norm; 0 = off
    ttt_steps: int = 3  # TTT unroll depth (speculators 3, SpecForge/EAGLE 7)
    ttt_step_loss_decay: float = 1.0  # loss weight decay**i at position i (EAGLE: 0.8)
    loss_fn: str = "kl_div"  # speculators loss name or JSON mix, eager implementation
    num_layers: int = 1  # draft decoder layers
    train_lm_head: bool = False  # train the draft head too (speculators freezes it)
    serve_engine: Literal["sglang", "vllm"] = "sglang"  # picks ENGINE_PROFILES flags
    draft_attn: Literal["sdpa", "eager", "simple_flex_attention"] = "sdpa"
    eval_every: int = 50  # steps between evals (0 = only at the start and the end)
    eval_at_tokens: list[int] = dataclasses.field(default_factory=list)  # extra evals
    eval_at_start: bool = True  # evaluate the untrained drafter (step 0)
    log_every: int = 1  # steps between metrics lines (eval steps always log)
    checkpoint_every: int = 0  # steps between checkpoints (0 = only the final one)
    keep_checkpoints: int = 2  # newest step checkpoints kept
    seed: int = 0  # model init and data order
    device: str = "auto"  # auto / cpu / cuda[:i]
    cpu_threads: int = 0  # torch threads on CPU (0: default; 1 helps on a CPU shared by jobs)
    target: str | None = None  # target dir if it moved since extraction (hash-checked)
    init_from: str | None = None  # speculators drafter to fine-tune (must match shards)
    resume: bool = False  # continue the run in `out` from its newest checkpoint
    stop_after_steps: int | None = None  # stop (as if killed) after this step; for tests
    progress: bool = True  # tqdm bar
    # Many processes (torchrun; eagle3lab/train/distributed.py). One process: grad_accum only.
    grad_accum: int = 1  # micro-batches per rank per optimizer step (gradients accumulated)
    fsdp: bool = False  # under torchrun: shard params, grads, Adam state (FSDP2), not DDP
    dist_timeout: float = 300.0  # seconds a collective waits for the other ranks, then fails

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "train config") -> "TrainConfig":
        cfg = strict_from_dict(cls, d, where)
        cfg.validate()
        return cfg

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every field that has a default, with it (a dict a partial config is laid over)."""
        missing = dataclasses.MISSING
        return {f.name: f.default if f.default is not missing else f.default_factory()
                for f in dataclasses.fields(cls)
                if f.default is not missing or f.default_factory is not missing}

    def validate(self) -> None:
        checks = [(0 < self.data_fraction <= 1, "data_fraction must be in (0, 1]"),
                  (0 < self.eval_fraction < 1, "eval_fraction must be in (0, 1)"),
                  (self.epochs >= 1, "epochs must be >= 1"),
                  (self.ttt_steps >= 1, "ttt_steps must be >= 1"),
                  (self.max_tokens_per_batch >= 16, "max_tokens_per_batch must be >= 16"),
                  (self.lr > 0, "lr must be > 0"), (self.num_layers >= 1, "num_layers >= 1"),
                  (self.grad_accum >= 1, "grad_accum must be >= 1"),
                  (self.dist_timeout > 0, "dist_timeout must be > 0")]
        for ok, msg in checks:
            if not ok:
                raise UserError(f"train config: {msg}.")


#: Settings that may differ when resuming (they do not change what is computed).
_RESUME_FREE = {"resume", "stop_after_steps", "progress", "device", "out", "cpu_threads",
                "dist_timeout", "grad_accum"}  # world size x grad_accum: distributed.py


def check_resume_settings(run_config: dict[str, Any], cfg: TrainConfig, out) -> None:
    """Refuse to resume the run in `out` (whose run.json holds `run_config`) with settings
    that change what is computed, naming both values of each."""
    # fields newer than the run take their defaults
    old = {k: v for k, v in {**TrainConfig.defaults(), **run_config}.items()
           if k not in _RESUME_FREE}
    new = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _RESUME_FREE}
    diff = [f"{k}: run {old.get(k)!r}, now {new.get(k)!r}" for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k)]
    if diff:
        raise UserError(f"Cannot resume {out} with other settings (" + "; ".join(diff)
                        + "). Resume with the run's own settings or start a new run.")
