"""The training run's settings: `TrainConfig` (strict) and the serving engines' flags.

Prevents two silent failures:
- options the serving engine ignores: `serve_engine` picks the speculators flags that
  engine actually implements (ENGINE_PROFILES) and the run records the choice;
- a resumed run that is not the same run: resuming with other settings (those that change
  what is computed) is refused naming both values; a typo'd, mistyped or out-of-range key
  is refused instead of ignored (`StrictConfig`).

`eagle3lab train`'s options are generated from TrainConfig's fields: their names, types,
defaults and help (each field's `description`), in the option group each field names
(`OPTION_GROUPS`), so the CLI and the library cannot drift. A run reads shards (`data`),
or trains online (`online`: the target computes the states from `conversations` inside
the loop, train/online.py); `check` refuses a config that mixes the two, in one line.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from eagle3lab.config import StrictConfig, cli_group
from eagle3lab.errors import UserError
from eagle3lab.targets.auxlayers import AUX_IDS_SYNTAX, AuxIds

#: Speculators EAGLE-3 flags each serving engine implements (checked against the engines'
#: llama_eagle3.py): "sglang" is what EVERY SGLang release seen serves (the doctor's
#: portable profile): the releases with the midlayer loader have no input_norm
#: (norm_before_fc; `input_norm.weight` dropped silently) and feed back the pre-norm state
#: (no norm_output); no release keeps a normed residual (norm_before_residual) or has
#: sliding-window draft attention (0.5.23 adds input_norm and norm_output, not those).
#: vLLM 0.25.1 reads all four norm flags. A run may set the flags itself
#: (`norm_before_residual`, `norm_before_fc`, `norm_output`: `drafter_flags`); which
#: engines serve the result is the doctor's answer (formats.doctor.serving_engines).
ENGINE_PROFILES: dict[str, dict[str, Any]] = {
    "sglang": {"norm_before_residual": False, "norm_before_fc": False, "fc_norm": False,
               "norm_output": False, "full_attention": True},
    "vllm": {"norm_before_residual": True, "norm_before_fc": True, "fc_norm": False,
             "norm_output": False, "full_attention": True},
}


#: The speculators flags a run may set itself (None: its serve_engine's ENGINE_PROFILES).
FLAG_FIELDS = ("norm_before_residual", "norm_before_fc", "norm_output")

#: speculators 0.9.0's defaults for `speculators train --speculator-type eagle3`, as
#: TrainConfig overrides (the study's recipe arm applies them; this dict is the one place
#: they are written). Read in its source: speculators/train/config/schema.py (DraftArgs:
#: norm_before_residual True; norm_before_fc / norm_output None -> True for eagle3 in
#: `TrainConfig._resolve_derived_defaults`, the "Eagle 3.1" settings of speculators PR
#: #692; fc_norm False; num_layers 1; LossArgs: kl_div, ttt_steps 3, decay 1.0;
#: OptimizerArgs lr 1e-3, weight_decay 0.01 (its AdamW group); SchedulerArgs linear;
#: DataArgs total_seq_len 8192), speculators/train/trainer.py (clip_grad_norm_ 1.0; warmup
#: 1% of the steps when unset: `_resolve_scheduler_steps`), speculators/model.py (the draft
#: head and the embedding frozen). Not expressible here, so NOT applied (docs/training.md
#: "Recipes"): its Muon optimizer for 2-D weights (muon_lr = lr, momentum 0.95, weight
#: decay 0.1), the 1% warmup (a step count here: the caller sets warmup_steps), and
#: sliding-window attention (window 2048) on every draft layer (full attention here, as
#: the static engine and SGLang need). The newest speculators source in the library
#: (vllm-project/speculators c05b95b, 2026-08-20, after v0.7.0) predates 0.9.0 and has the
#: same flag defaults, with lr 1e-4.
SPECULATORS_EAGLE3_DEFAULTS: dict[str, Any] = {
    "norm_before_residual": True, "norm_before_fc": True, "norm_output": True,
    "num_layers": 1, "ttt_steps": 3, "ttt_step_loss_decay": 1.0, "loss_fn": "kl_div",
    "lr": 1e-3, "weight_decay": 0.01, "schedule": "linear", "grad_clip": 1.0,
    "train_lm_head": False, "max_tokens_per_batch": 8192,
}


def engine_profiles_text() -> str:
    """ENGINE_PROFILES in words (what `train --help` says of --serve-engine): per engine,
    the speculators flags it sets, and those it leaves off."""
    def names(flags: list[str]) -> str:
        return ", ".join(flags[:-1]) + " and " + flags[-1] if len(flags) > 1 else flags[0]

    parts = []
    for engine, flags in ENGINE_PROFILES.items():
        on = [k for k, v in flags.items() if v]
        off = [k for k, v in flags.items() if not v]
        parts.append(f"{engine} sets {names(on) if on else 'none of them'}"
                     + (f" ({names(off)} off)" if off else ""))
    return "; ".join(parts)


#: `eagle3lab train --help`'s option groups (title -> what they hold), in help order; each
#: TrainConfig field names its group in `json_schema_extra`.
OPTION_GROUPS: dict[str, str] = {
    "data": "the shards (or, online, the conversations and the target that computes their "
            "states), the held-out split, how steps are packed and read",
    "model": "the drafter, its loss and its initialisation",
    "optimiser": "AdamW, the learning-rate schedule, gradients",
    "schedule": "how long to train, when to evaluate and log",
    "checkpoints": "the run directory, checkpoints, resuming",
    "distributed": "devices, threads and torchrun's ranks",
}


class TrainConfig(StrictConfig):
    WHERE: ClassVar[str] = "train config"

    data: str | None = Field(None, description="train shard directory (made by `eagle3lab "
                             "extract`, with a vocab map); not with online",
                             json_schema_extra=cli_group("data"))
    data_format: Literal["auto", "eagle3lab", "specforge", "speculators"] = Field(
        "auto", description="format of data (eval_data: detected): eagle3lab shards, SpecForge's "
        "rows_*/data_*.ckpt or speculators' hidden_states/hs_*.safetensors (auto: detected)",
        json_schema_extra=cli_group("data"))
    out: str = Field(description="run directory: run.json, metrics.jsonl, checkpoints/, "
                     "final/", json_schema_extra=cli_group("checkpoints"))
    eval_data: str | None = Field(None, description="held-out shards; None = hold out "
                                  "eval_fraction of data", json_schema_extra=cli_group("data"))
    eval_fraction: float = Field(0.05, gt=0, lt=1, description="used only without eval_data",
                                 json_schema_extra=cli_group("data"))
    data_fraction: float = Field(1.0, gt=0, le=1, description="train on this fraction of the "
                                 "samples (nested subsets)", json_schema_extra=cli_group("data"))
    data_seed: int = Field(0, description="picks the held-out and data_fraction subsets "
                           "(not the data order)", json_schema_extra=cli_group("data"))
    epochs: int = Field(1, ge=1, description="passes over the (fraction of the) data; "
                        "max_steps/max_tokens cut it", json_schema_extra=cli_group("schedule"))
    max_steps: int | None = Field(None, description="stop after this many optimizer steps",
                                  json_schema_extra=cli_group("schedule"))
    max_tokens: int | None = Field(None, description="stop once this many tokens were "
                                   "processed (equal compute)",
                                   json_schema_extra=cli_group("schedule"))
    max_tokens_per_batch: int = Field(2048, ge=16, description="packed tokens per step "
                                      "(speculators' total_seq_len)",
                                      json_schema_extra=cli_group("data"))
    pad_batches: bool = Field(False, description="pad batches to max_tokens_per_batch "
                              "(always on CUDA: compile)", json_schema_extra=cli_group("data"))
    lr: float = Field(3e-4, gt=0, description="peak learning rate (AdamW)",
                      json_schema_extra=cli_group("optimiser"))
    schedule: Literal["constant", "cosine", "linear"] = Field(
        "cosine", description="learning-rate schedule after warmup",
        json_schema_extra=cli_group("optimiser"))
    warmup_steps: int = Field(0, description="steps of linear warmup from 0 to lr",
                              json_schema_extra=cli_group("optimiser"))
    weight_decay: float = Field(0.01, description="AdamW weight decay",
                                json_schema_extra=cli_group("optimiser"))
    grad_clip: float = Field(1.0, description="max global grad norm; 0 = off",
                             json_schema_extra=cli_group("optimiser"))
    ttt_steps: int = Field(3, ge=1, description="TTT unroll depth (speculators 3, "
                           "SpecForge/EAGLE 7)", json_schema_extra=cli_group("model"))
    ttt_step_loss_decay: float = Field(1.0, description="loss weight decay**i at position i "
                                       "(EAGLE: 0.8)", json_schema_extra=cli_group("model"))
    loss_fn: str = Field("kl_div", description="speculators loss name or JSON mix, eager "
                         "implementation", json_schema_extra=cli_group("model"))
    num_layers: int = Field(1, ge=1, description="draft decoder layers",
                            json_schema_extra=cli_group("model"))
    train_lm_head: bool = Field(False, description="train the draft head too (speculators "
                                "freezes it)", json_schema_extra=cli_group("model"))
    serve_engine: Literal["sglang", "vllm"] = Field("sglang", description="picks "
                                                    "ENGINE_PROFILES flags",
                                                    json_schema_extra=cli_group("model"))
    norm_before_residual: bool | None = Field(
        None, description="speculators flag: the first layer's residual is the normed "
        "hidden state (None: serve_engine's; SGLang never applies it)",
        json_schema_extra=cli_group("model"))
    norm_before_fc: bool | None = Field(
        None, description="speculators flag: one RMSNorm over the aux states before fc "
        "(None: serve_engine's)", json_schema_extra=cli_group("model"))
    norm_output: bool | None = Field(
        None, description="speculators flag: feed the post-norm state back across TTT "
        "steps, EAGLE-3.1 (None: serve_engine's)", json_schema_extra=cli_group("model"))
    draft_attn: Literal["sdpa", "eager", "simple_flex_attention", "auto"] = Field(
        "sdpa", description="attention implementation of the draft decoder layer: sdpa / "
        "eager (a dense mask over the packed batch), simple_flex_attention (a block-sparse "
        "mask; CUDA only: no backward on the CPU; max_tokens_per_batch a multiple of 128), "
        "auto (flex on CUDA when it can run, else sdpa; run.json records the choice)",
        json_schema_extra=cli_group("model"))
    eval_every: int = Field(50, description="steps between evals (0 = only at the start and "
                            "the end)", json_schema_extra=cli_group("schedule"))
    eval_at_tokens: list[int] = Field(default_factory=list, description="extra evals, at the "
                                      "first step reaching each of these token counts",
                                      json_schema_extra=cli_group("schedule"))
    eval_at_start: bool = Field(True, description="evaluate the untrained drafter (step 0)",
                                json_schema_extra=cli_group("schedule"))
    log_every: int = Field(1, description="steps between metrics lines (eval steps always "
                           "log)", json_schema_extra=cli_group("schedule"))
    checkpoint_every: int = Field(0, description="steps between checkpoints (0 = only the "
                                  "final one)", json_schema_extra=cli_group("checkpoints"))
    keep_checkpoints: int = Field(2, description="newest step checkpoints kept",
                                  json_schema_extra=cli_group("checkpoints"))
    seed: int = Field(0, description="model init and data order",
                      json_schema_extra=cli_group("model"))
    device: str = Field("auto", description="auto / cpu / cuda[:i]",
                        json_schema_extra=cli_group("distributed"))
    cpu_threads: int = Field(0, description="torch threads on CPU (0: default; 1 helps on a "
                             "CPU shared by jobs)", json_schema_extra=cli_group("distributed"))
    target: str | None = Field(None, description="offline: the target dir if it moved since "
                               "extraction (hash-checked); online: the target that computes "
                               "the states (preset name, directory or hub id)",
                               json_schema_extra=cli_group("data"))
    # Online training (train/online.py): the states computed by the target in the loop,
    # with extract's capture, settings and defaults, so online == offline.
    online: bool = Field(False, description="compute the aux states with the target inside "
                         "the loop instead of reading shards (needs conversations and target; "
                         "no data workers: the target runs on the training device, in this "
                         "process)", json_schema_extra=cli_group("data"))
    conversations: str | None = Field(None, description="online: the train conversations "
                                      "(JSONL from `eagle3lab regenerate`)",
                                      json_schema_extra=cli_group("data"))
    eval_conversations: str | None = Field(None, description="online: held-out conversations "
                                           "JSONL; None = hold out eval_fraction of "
                                           "conversations", json_schema_extra=cli_group("data"))
    aux_ids: AuxIds | None = Field(None, description=f"online: explicit aux layer ids, "
                                   f"{AUX_IDS_SYNTAX} (None: the engines' default, as "
                                   f"extract)", json_schema_extra=cli_group("data"))
    aux_convention: Literal["sglang", "vllm"] = Field(
        "sglang", description="online: how aux_ids are meant, as extract's --aux-convention "
        "(sglang: id k = output of layer k; vllm: id k = input of layer k)",
        json_schema_extra=cli_group("data"))
    model_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="online: dtype the target runs in (extract's --model-dtype)",
        json_schema_extra=cli_group("data"))
    states_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "bfloat16", description="online: dtype the captured states are rounded to before "
        "training (extract's --dtype: a shard set's storage dtype)",
        json_schema_extra=cli_group("data"))
    max_seq_len: int = Field(2048, ge=1, description="online: longer conversations are "
                             "truncated to this many tokens (extract's --max-seq-len)",
                             json_schema_extra=cli_group("data"))
    forward_tokens: int = Field(16384, ge=1, description="online: padded tokens per target "
                                "forward; a micro-batch's conversations, longest first, are "
                                "split into forwards of at most this (1: one conversation "
                                "per forward)", json_schema_extra=cli_group("data"))
    draft_vocab_size: int = Field(8192, ge=1, description="online: draft vocabulary size, "
                                  "built from the train conversations' loss-masked tokens "
                                  "as `eagle3lab vocab` builds it from their shards",
                                  json_schema_extra=cli_group("data"))
    vocab_map: str | None = Field(None, description="online: a vocab_map.safetensors to use "
                                  "instead of building one", json_schema_extra=cli_group("data"))
    target_compile: bool = Field(False, description="online: compile the target's forward "
                                 "(torch.compile, dynamic shapes; the first forwards wait for "
                                 "the compile): fewer, fused kernels where launching them sets "
                                 "the pace; the states differ by rounding, and the run "
                                 "records it", json_schema_extra=cli_group("data"))
    states_cache: bool = Field(False, description="online: keep each sample's states in "
                               "memory on the training device after its first use, so later "
                               "epochs run no target forward", json_schema_extra=cli_group("data"))
    init_from: str | None = Field(None, description="speculators drafter to fine-tune (must "
                                  "match shards)", json_schema_extra=cli_group("model"))
    resume: bool = Field(False, description="continue the run in `out` from its newest "
                         "checkpoint", json_schema_extra=cli_group("checkpoints"))
    stop_after_steps: int | None = Field(None, description="stop (as if killed) after this "
                                         "step; for tests", json_schema_extra=cli_group("schedule"))
    progress: bool = Field(True, description="tqdm bar", json_schema_extra=cli_group("schedule"))
    profile_steps: list[int] = Field(default_factory=list, description="FIRST LAST: record "
                                     "optimizer steps FIRST..LAST (1-based, main rank) with "
                                     "torch.profiler into RUN/profile/ (summary.json: the "
                                     "device's busy share, the host's time in synchronising "
                                     "calls; ops.txt: the top ops); empty: off",
                                     json_schema_extra=cli_group("schedule"))
    # Many processes (torchrun; eagle3lab/train/distributed.py). One process: grad_accum only.
    grad_accum: int = Field(1, ge=1, description="micro-batches per rank per optimizer step "
                            "(gradients accumulated)", json_schema_extra=cli_group("optimiser"))
    fsdp: bool = Field(False, description="under torchrun: shard parameters, gradients and "
                       "Adam state with FSDP2 instead of DDP",
                       json_schema_extra=cli_group("distributed"))
    dist_timeout: float = Field(300.0, gt=0, description="seconds a collective waits for the "
                                "other ranks before the job fails (torchrun)",
                                json_schema_extra=cli_group("distributed"))
    data_workers: int = Field(-1, ge=-1, description="DataLoader processes that read and "
                              "collate the next steps while the device computes (-1: 2 on "
                              "CUDA, 0 on CPU; online: 0)", json_schema_extra=cli_group("data"))
    prefetch: bool = Field(True, description="fetch the next step's batch (online: the "
                           "target's forward) before the host waits for this step's numbers, "
                           "so the device computes while the host prepares; changes nothing "
                           "computed", json_schema_extra=cli_group("data"))
    grad_reduce_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="under torchrun: dtype the gradients are averaged across ranks "
        "in (bfloat16 halves the bytes; DDP's bf16 compress hook / FSDP2's reduce_dtype)",
        json_schema_extra=cli_group("distributed"))

    def check(self, where: str) -> None:
        """Shards or online, not both, each with what it needs (one line each); a profile
        window of two steps in order."""
        p = self.profile_steps
        if p and (len(p) != 2 or not 1 <= p[0] <= p[1]):
            raise UserError(f"{where}: profile_steps (--profile-steps) takes two step "
                            f"numbers FIRST LAST with 1 <= FIRST <= LAST, not {p}.")
        if self.online:
            missing = [f"{n} (--{n})" for n in ("conversations", "target")
                       if not getattr(self, n)]
            if missing:
                raise UserError(f"{where}: online training (--online) computes the states "
                                f"from conversations with the target: give "
                                f"{' and '.join(missing)}, e.g. --conversations R.jsonl "
                                f"--target T.")
            given = [f"{n} (--{n.replace('_', '-')})" for n in ("data", "eval_data")
                     if getattr(self, n)]
            if given:
                raise UserError(f"{where}: online training reads no shards: drop "
                                f"{' and '.join(given)} (held-out conversations: "
                                f"--eval-conversations).")
            if self.data_workers > 0:
                raise UserError(f"{where}: online training has no data workers (the target "
                                f"computes the states in this process): leave data_workers "
                                f"(--data-workers) at -1 or 0, not {self.data_workers}.")
            return
        if self.data is None:
            raise UserError(f"{where}: give data (--data SHARDS), the shard directory to "
                            f"train on, or train online (--online --conversations R.jsonl "
                            f"--target T).")
        online_only = [f"{n} (--{n.replace('_', '-')})" for n in
                       ("conversations", "eval_conversations", "aux_ids", "vocab_map",
                        "states_cache", "target_compile")
                       if getattr(self, n) not in (None, False)]
        if online_only:
            raise UserError(f"{where}: {', '.join(online_only)} "
                            f"{'is' if len(online_only) == 1 else 'are'} for online training: "
                            f"add --online, or drop {'it' if len(online_only) == 1 else 'them'} "
                            f"(shards record their own).")

    def drafter_flags(self) -> dict[str, Any]:
        """The speculators flags this run builds its drafter with (and records as the
        drafter's engine_profile): serve_engine's ENGINE_PROFILES entry, with the flags the
        run sets itself (FLAG_FIELDS not None) in its place."""
        return {**ENGINE_PROFILES[self.serve_engine],
                **{k: getattr(self, k) for k in FLAG_FIELDS if getattr(self, k) is not None}}


def check_train_overrides(overrides: dict[str, Any], where: str, *, reserved: set[str],
                          set_by: str, online: bool = False) -> None:
    """Check a `train:` section of overrides (a pipeline's, a study's): the fields `set_by`
    sets itself (`reserved`) are refused, the rest must be valid TrainConfig fields (of an
    online run with `online`: its runs train online, so online-only fields are allowed)."""
    if bad := sorted(set(overrides) & reserved):
        raise UserError(f"{where}.train: {', '.join(bad)} are set by {set_by}; remove them.")
    base = ({"online": True, "conversations": "-", "target": "-"} if online
            else {"data": ""})
    TrainConfig.from_dict({**base, "out": "", **overrides}, f"{where}.train")


#: Settings that may differ when resuming (they do not change what is computed).
_RESUME_FREE = {"resume", "stop_after_steps", "progress", "profile_steps", "device", "out",
                "cpu_threads", "dist_timeout", "grad_accum",  # world size x grad_accum:
                "data_workers", "prefetch"}  # distributed.py


def check_resume_settings(run_config: dict[str, Any], cfg: TrainConfig, out) -> None:
    """Refuse to resume the run in `out` (whose run.json holds `run_config`) with settings
    that change what is computed, naming both values of each."""
    # fields newer than the run take their defaults
    old = {k: v for k, v in {**TrainConfig.defaults(), **run_config}.items()
           if k not in _RESUME_FREE}
    new = {k: v for k, v in cfg.model_dump().items() if k not in _RESUME_FREE}
    diff = [f"{k}: run {old.get(k)!r}, now {new.get(k)!r}" for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k)]
    if diff:
        raise UserError(f"Cannot resume {out} with other settings (" + "; ".join(diff)
                        + "). Resume with the run's own settings or start a new run.")
