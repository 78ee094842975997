"""Train an EAGLE-3 drafter (speculators' model and loss) on eagle3lab shards.

Prevents three silent failures of drafter training:
- a drafter built for other features: its hidden size, aux layers (written in the vLLM
  convention = capture points, with the SGLang ids and the convention recorded beside
  them), target vocab and draft vocab map all come from the shard manifest, and shards
  that do not match the drafter (eval split, resumed run, `init_from` checkpoint) are
  refused before any step, naming both values;
- options the serving engine ignores: `serve_engine` picks the speculators flags that
  engine actually implements (ENGINE_PROFILES) and records the choice;
- a run that cannot be trusted after a crash: checkpoints are written atomically with the
  optimizer, scheduler, data position and RNG, so `resume=True` logs exactly what an
  uninterrupted run logs; a NaN/inf loss stops the run naming the step and the samples,
  keeping the last good checkpoint.

The loop is ours, around speculators' real pieces: `Eagle3DraftModel.forward` (TTT unroll,
loss and per-position metrics), `shift_batch` + `CollateFn` (its input pairing and
packing) and `MultipackDistributedBatchSamplerV2` (its data order). speculators'
`Trainer` is not used: without an accelerator it fails at `model.to(local_rank)` (rank 0
means CUDA) and then at `torch.accelerator.synchronize()`; it evaluates only at epoch
ends, hard-codes grad clip 1.0 and resumes without RNG state. (bench/train.py runs it with
those two calls shimmed: same tokens/s as this loop.)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Literal

from . import __version__
from .config import strict_from_dict
from .errors import UserError
from .fsutil import atomic_dir, atomic_write_json, atomic_write_text, check_writable_dir
from .metrics import METRIC_DEFINITIONS, step_counts, summarize_counts

RUN_FORMAT = "eagle3lab-run"
RUN_VERSION = 1

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

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "train config") -> "TrainConfig":
        cfg = strict_from_dict(cls, d, where)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        checks = [(0 < self.data_fraction <= 1, "data_fraction must be in (0, 1]"),
                  (0 < self.eval_fraction < 1, "eval_fraction must be in (0, 1)"),
                  (self.epochs >= 1, "epochs must be >= 1"),
                  (self.ttt_steps >= 1, "ttt_steps must be >= 1"),
                  (self.max_tokens_per_batch >= 16, "max_tokens_per_batch must be >= 16"),
                  (self.lr > 0, "lr must be > 0"), (self.num_layers >= 1, "num_layers >= 1")]
        for ok, msg in checks:
            if not ok:
                raise UserError(f"train config: {msg}.")


# ---------------------------------------------------------------------------------------
# The drafter
# ---------------------------------------------------------------------------------------
def draft_layer_config(target_path: str, *, num_layers: int = 1, attn: str = "sdpa",
                       full_attention: bool = True):
    """A `num_layers`-layer Llama copy of the target's config, as `speculators train`
    builds it (create_transformer_layer_config), with the chosen attention kernel."""
    from speculators.train.cli import create_transformer_layer_config

    tl = create_transformer_layer_config(
        target_path, num_layers=num_layers, draft_arch="llama", hidden_act=None,
        sliding_window=2048, full_attention_indices=list(range(num_layers))
        if full_attention else [])
    tl._attn_implementation = attn
    return tl


def build_drafter(*, target_path: str, aux, d2t, t2d, serve_engine: str = "sglang",
                  ttt_steps: int = 3, num_layers: int = 1, attn: str = "sdpa"):
    """speculators' Eagle3DraftModel for these shards' target, aux layers and vocab map:
    aux ids written as `aux.vllm_ids` (capture points); embeddings, draft head (rows of
    the target head, by t2d) and the frozen verifier norm/head come from the target via
    speculators' `load_verifier_weights`."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    prof = ENGINE_PROFILES[serve_engine]
    tl = draft_layer_config(target_path, num_layers=num_layers, attn=attn,
                            full_attention=prof["full_attention"])
    verifier = VerifierConfig.from_pretrained(target_path)
    cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=tl, draft_vocab_size=int(d2t.numel()),
        norm_before_residual=prof["norm_before_residual"],
        norm_before_fc=prof["norm_before_fc"], fc_norm=prof["fc_norm"],
        norm_output=prof["norm_output"], eagle_aux_hidden_state_layer_ids=aux.vllm_ids,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", default_proposal_method="greedy", verifier=verifier,
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=ttt_steps)]))
    model = Eagle3DraftModel(cfg)
    model.load_vocab_mappings(t2d, d2t)
    model.load_verifier_weights()
    return model


def load_drafter(path: str | os.PathLike, *, attn: str = "sdpa", target: str | None = None):
    """Load a saved drafter with speculators' own `from_pretrained` (verifier weights are
    read from the target recorded in its config, or from `target` when given: the path in
    config.json may be another machine's), forcing a CPU-capable attention.

    A drafter saved without `embed_tokens` (packed for shipping: engines use the target's
    embedding) would come out of from_pretrained with a ZERO embedding, since speculators
    refills only NaN ones (measured on the default eval shards: position-0 accuracy 0.11
    instead of 0.59); the target's embedding is loaded instead, as the engines do."""
    from safetensors import safe_open
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.utils.loading import load_model_layers

    cfg = Eagle3SpeculatorConfig.from_pretrained(str(path))
    cfg.transformer_layer_config._attn_implementation = attn
    if target is not None:
        cfg.speculators_config.verifier.name_or_path = str(target)
    model = Eagle3DraftModel.from_pretrained(str(path), config=cfg)
    names: set[str] = set()
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            names.update(h.keys())
    if "embed_tokens.weight" not in names:
        w = load_model_layers(["embed_tokens.weight"],
                              str(cfg.speculators_config.verifier.name_or_path))
        model.embed_tokens.load_state_dict({"weight": w["embed_tokens.weight"]})
    return model


def check_drafter_against_shards(drafter_cfg: dict[str, Any], shards, d2t, what: str) -> None:
    """Refuse shards whose features/vocab differ from a drafter config (config.json dict)."""
    import torch

    tl = drafter_cfg["transformer_layer_config"]
    hidden = drafter_cfg.get("target_hidden_size") or tl["hidden_size"]
    t = shards.manifest["target"]
    problems = []
    if hidden != t["hidden_size"]:
        problems.append(f"hidden size: shards {t['hidden_size']}, {what} {hidden}")
    if tl["vocab_size"] != t["vocab_size"]:
        problems.append(f"target vocab size: shards {t['vocab_size']}, {what} {tl['vocab_size']}")
    ids = drafter_cfg.get("eagle_aux_hidden_state_layer_ids")
    if ids is not None and list(ids) != shards.aux.vllm_ids:
        problems.append(f"aux layer ids (vLLM convention = capture points): shards "
                        f"{shards.aux.vllm_ids}, {what} {list(ids)}")
    if drafter_cfg.get("d2t") is not None and not torch.equal(drafter_cfg["d2t"], d2t):
        problems.append(f"draft vocab map: {what} has another d2t than the shards' "
                        f"vocab_map.safetensors (regenerating d2t destroys a trained drafter)")
    if problems:
        raise UserError(f"The shards in {shards.path} do not match {what}: "
                        + "; ".join(problems) + ". Use shards extracted for this drafter "
                        "(same target, aux layers and vocab map), or train a new one.")


# ---------------------------------------------------------------------------------------
# Data: speculators' pairing, packing and order over a subset of a ShardSet
# ---------------------------------------------------------------------------------------
class PackedData:
    """Samples `indices` of `shards` packed into batches of <= max_tokens by speculators'
    multipack sampler (its order depends only on seed + epoch, so a resumed run replays
    it), paired by `shift_batch` and collated by `CollateFn` exactly as its trainer does."""

    def __init__(self, shards, indices, max_tokens: int, *, pad: bool = False):
        import numpy as np

        self.shards, self.max_tokens, self.pad = shards, max_tokens, pad
        self.indices = np.asarray(indices, dtype=np.int64)
        all_lengths = np.asarray(shards.lengths(), dtype=np.int64)
        self.lengths = all_lengths[self.indices]
        self._length_of = dict(zip(self.indices.tolist(), self.lengths.tolist()))
        self._cache: tuple[tuple[int, int], list] | None = None

    def batches(self, seed: int, epoch: int) -> list:
        import warnings

        from speculators.train.distributed_batch_sampler import (
            MultipackDistributedBatchSamplerV2)

        if self._cache is None or self._cache[0] != (seed, epoch):
            with warnings.catch_warnings():  # "samples longer than max ... truncated"
                warnings.simplefilter("ignore")
                s = MultipackDistributedBatchSamplerV2(
                    batch_max_length=self.max_tokens, lengths=self.lengths, num_replicas=1,
                    rank=0, seed=seed)
                self._cache = ((seed, epoch),
                               [self.indices[b] for b in s._generate_batches(epoch)])
        return self._cache[1]

    def batch_tokens(self, batch) -> int:
        """Positions trained on: each sample loses one token to the shift."""
        n = sum(max(min(self._length_of[int(i)], self.max_tokens) - 1, 0) for i in batch)
        return min(n, self.max_tokens)

    def collate(self, batch, dtype) -> dict[str, Any]:
        import torch
        from speculators.models.eagle3.data import shift_batch
        from speculators.train.data import CollateFn

        samples = []
        for i in batch:
            s = self.shards[int(i)]
            n = int(s["input_ids"].shape[0])
            s["lengths"] = torch.tensor([n], dtype=torch.long)
            s["position_ids"] = torch.arange(n, dtype=torch.long)
            samples.append(s)
        hidden = int(samples[0]["verifier_last_hidden_states"].shape[-1])
        width = self.max_tokens if self.pad else max(self.batch_tokens(batch), 1)
        out = CollateFn(width, hidden, int(samples[0]["hidden_states"].shape[-1]) // hidden,
                        dtype=dtype, preprocess=shift_batch)(samples)
        return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def split_samples(n: int, *, eval_fraction: float | None, data_fraction: float,
                  data_seed: int):
    """(train indices, held-out indices). One permutation by data_seed: the held-out part
    comes first, and data fractions take a prefix of the rest, so smaller fractions are
    subsets of larger ones and never touch the held-out samples."""
    import numpy as np

    perm = np.random.default_rng(data_seed).permutation(n)
    k = max(1, round(n * eval_fraction)) if eval_fraction else 0
    pool = perm[k:]
    m = max(1, math.ceil(len(pool) * data_fraction))
    return np.sort(pool[:m]), np.sort(perm[:k])


def shard_identity(shards) -> dict[str, Any]:
    """What a run records about a shard set, and what must match to resume into it."""
    m = shards.manifest
    return {"path": str(Path(shards.path).resolve()), "target": m["target"],
            "aux_layers": m["aux_layers"], "dtype": m.get("dtype"),
            "conversations_sha256": m.get("conversations", {}).get("sha256"),
            "vocab_map_sha256": (m.get("vocab_map") or {}).get("sha256"),
            "samples": len(shards), "tokens": shards.num_tokens}


_IDENTITY_CHECKS = (("hidden size", ("target", "hidden_size")),
                    ("target vocab size", ("target", "vocab_size")),
                    ("target config sha256", ("target", "config_sha256")),
                    ("aux capture points", ("aux_layers", "capture_points")),
                    ("vocab map sha256", ("vocab_map_sha256",)))


def _compare_identity(old: dict, new: dict, what: str, path) -> None:
    def get(d, keys):
        for k in keys:
            d = (d or {}).get(k)
        return d

    diff = [f"{name}: {what} {get(old, ks)}, shards {get(new, ks)}"
            for name, ks in _IDENTITY_CHECKS if get(old, ks) != get(new, ks)]
    if diff:
        raise UserError(f"The shards in {path} do not match {what}: " + "; ".join(diff)
                        + ". Resume with the shards the run was started on, or start a new "
                        "run directory.")


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------
class TrainingDiverged(UserError):
    """A non-finite loss or gradient stopped the run (the last good checkpoint is kept)."""


def train(**kwargs) -> dict[str, Any]:
    """Keyword form of `train_run` (notebooks and the CLI call this). Unknown or mistyped
    keys are refused. Returns the run summary (also stored in RUN_DIR/run.json)."""
    return train_run(TrainConfig.from_dict(kwargs))


def read_run(run_dir: str | os.PathLike) -> dict[str, Any]:
    p = Path(run_dir) / "run.json"
    if not p.exists():
        raise UserError(f"{run_dir} is not a training run directory (no run.json).")
    return json.loads(p.read_text())


def is_finished(run_dir: str | os.PathLike) -> bool:
    p = Path(run_dir) / "run.json"
    return p.exists() and json.loads(p.read_text()).get("status") == "done"


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"eagle3lab": __version__}
    for pkg in ("speculators", "torch", "transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _scheduler(opt, cfg: TrainConfig, total_steps: int):
    from transformers import (get_constant_schedule_with_warmup,
                              get_cosine_schedule_with_warmup,
                              get_linear_schedule_with_warmup)

    if cfg.schedule == "constant":
        return get_constant_schedule_with_warmup(opt, cfg.warmup_steps)
    fn = (get_cosine_schedule_with_warmup if cfg.schedule == "cosine"
          else get_linear_schedule_with_warmup)
    return fn(opt, cfg.warmup_steps, max(total_steps, 1))


def _plan_steps(data: PackedData, cfg: TrainConfig) -> tuple[int, int]:
    """(total optimizer steps, tokens they process): epochs, cut by max_steps/max_tokens."""
    steps = tokens = 0
    for epoch in range(cfg.epochs):
        for b in data.batches(cfg.seed, epoch):
            steps += 1
            tokens += data.batch_tokens(b)
            if (cfg.max_steps and steps >= cfg.max_steps) or (
                    cfg.max_tokens and tokens >= cfg.max_tokens):
                return steps, tokens
    return steps, tokens


def _rng_state() -> dict[str, Any]:
    import random

    import numpy as np
    import torch

    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def _set_rng_state(s: dict[str, Any]) -> None:
    import random

    import numpy as np
    import torch

    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def _save_pretrained(model, directory: Path) -> None:
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(directory)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _checkpoints(out: Path) -> list[Path]:
    """Complete checkpoints (atomic dirs that contain trainer_state.pt), oldest first."""
    found = [p for p in (out / "checkpoints").glob("step-*") if (p / "trainer_state.pt").exists()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def _save_checkpoint(out: Path, model, opt, sched, state: dict, keep: int) -> Path:
    import shutil

    import torch

    final = out / "checkpoints" / f"step-{state['step']}"
    with atomic_dir(final) as tmp:
        _save_pretrained(model, tmp)
        torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                    "state": state, "rng": _rng_state()}, tmp / "trainer_state.pt")
        atomic_write_json(tmp / "checkpoint.json", {"step": state["step"],
                                                     "tokens": state["tokens"],
                                                     "epoch": state["epoch"]})
    for old in _checkpoints(out)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _load_checkpoint(ckpt: Path, model, opt, sched) -> dict:
    import torch
    from safetensors.torch import load_file

    weights = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    bad = [k for k in missing if not k.startswith("verifier_")] + list(unexpected)
    if bad:
        raise UserError(f"Checkpoint {ckpt} does not fit this drafter (keys {bad[:5]}); "
                        f"it was made with another configuration.")
    blob = torch.load(ckpt / "trainer_state.pt", weights_only=False, map_location="cpu")
    opt.load_state_dict(blob["optimizer"])
    sched.load_state_dict(blob["scheduler"])
    _set_rng_state(blob["rng"])
    return blob["state"]


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop lines logged after `step` (work lost in the interruption) and torn lines."""
    keep = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                if json.loads(line)["step"] <= step:
                    keep.append(line)
            except (json.JSONDecodeError, KeyError):
                continue
    atomic_write_text(path, "".join(x + "\n" for x in keep))


def evaluate(model, data: PackedData, *, ttt_steps: int, decay: float = 1.0,
             loss_fn: str = "kl_div", device: str = "cpu") -> dict:
    """Eval metrics (ratios + raw counts) of `model` on `data`'s fixed batches (seed 0,
    epoch 0: every run and every reload evaluates the same batches)."""
    import contextlib

    import torch
    from speculators.losses import resolve_loss_config

    cuda = device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    ctx = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda \
        else contextlib.nullcontext
    kwargs = {"ttt_steps": ttt_steps, "ttt_step_loss_decay": decay,
              "loss_config": resolve_loss_config(loss_fn, "eager")}
    was_training = model.training
    model.eval()
    total: dict[str, float] = {}
    with torch.no_grad():
        for b in data.batches(0, 0):
            batch = {k: v.to(device) for k, v in data.collate(b, dtype).items()}
            with ctx():
                _, _, m = model(**batch, **kwargs)
            for k, v in step_counts(m, batch["loss_mask"], ttt_steps, decay).items():
                total[k] = total.get(k, 0.0) + v
    model.train(was_training)
    return summarize_counts(total, ttt_steps, decay)


def _nonfinite_samples(data: PackedData, batch) -> list[int]:
    import torch

    bad = []
    for i in batch:
        s = data.shards[int(i)]
        if not (torch.isfinite(s["hidden_states"].float()).all()
                and torch.isfinite(s["verifier_last_hidden_states"].float()).all()):
            bad.append(int(i))
    return bad


def _finite(x) -> bool:
    return x is not None and math.isfinite(float(x.detach() if hasattr(x, "detach") else x))


def _prepare_data(cfg: TrainConfig):
    """Open and cross-check the shards; return (train ShardSet, train PackedData,
    eval PackedData, eval note, d2t, t2d, target path)."""
    from transformers import AutoConfig

    from .shards import ShardSet
    from .target import config_sha256

    shards = ShardSet(cfg.data)
    d2t, t2d = shards.vocab_map()
    t = shards.manifest["target"]
    target_path = cfg.target or t["path"]
    if not (Path(target_path) / "config.json").is_file():
        raise UserError(f"The target these shards were extracted from ({t['path']}) has no "
                        f"config.json; pass target=<its directory> (--target) if it moved.")
    got = config_sha256(AutoConfig.from_pretrained(target_path).to_dict())
    if got != t["config_sha256"]:
        raise UserError(f"The target at {target_path} is not the one the shards in "
                        f"{shards.path} were extracted from: config sha256 {got[:12]}..., "
                        f"manifest {t['config_sha256'][:12]}.... Pass the right --target.")
    if cfg.eval_data:
        ev = ShardSet(cfg.eval_data)
        ev.check_against(hidden_size=t["hidden_size"], aux=shards.aux,
                         vocab_size=t["vocab_size"], config_sha256=t["config_sha256"],
                         what=f"the training shards ({shards.path})")
        train_idx, _ = split_samples(len(shards), eval_fraction=None,
                                     data_fraction=cfg.data_fraction, data_seed=cfg.data_seed)
        eval_data = PackedData(ev, range(len(ev)), cfg.max_tokens_per_batch)
        note = f"eval split: {ev.path} ({len(ev)} samples)"
    else:
        train_idx, eval_idx = split_samples(len(shards), eval_fraction=cfg.eval_fraction,
                                            data_fraction=cfg.data_fraction,
                                            data_seed=cfg.data_seed)
        eval_data = PackedData(shards, eval_idx, cfg.max_tokens_per_batch)
        note = (f"warning: no eval_data given; holding out {len(eval_idx)} of {len(shards)} "
                f"training samples (eval_fraction={cfg.eval_fraction}). Held-out prompts "
                f"(`--eval-data`) measure generalisation better.")
        print(note)
    train_data = PackedData(shards, train_idx, cfg.max_tokens_per_batch, pad=cfg.pad_batches)
    return shards, train_data, eval_data, note, d2t, t2d, target_path


def train_run(cfg: TrainConfig) -> dict[str, Any]:
    """Train (or resume) one drafter run into cfg.out; see the module docstring.

    cpu_threads: with 2 OpenMP threads on 2 cores that other jobs also use, every op waits
    for a descheduled thread (steps measured ~20x slower than with 1 thread); 1 avoids it.
    """
    import torch

    before = torch.get_num_threads()
    if cfg.cpu_threads > 0:
        torch.set_num_threads(cfg.cpu_threads)
    try:
        return _train_run(cfg)
    finally:
        torch.set_num_threads(before)


def _train_run(cfg: TrainConfig) -> dict[str, Any]:
    import contextlib

    import torch
    from speculators.losses import resolve_loss_config
    from tqdm.auto import tqdm

    from .target import resolve_device

    cfg.validate()
    out = check_writable_dir(cfg.out, "run directory")
    run_path, metrics_path = out / "run.json", out / "metrics.jsonl"
    previous = read_run(out) if run_path.exists() else None
    if previous and not cfg.resume:
        raise UserError(f"{out} already holds a run (status {previous.get('status')!r}). Pass "
                        f"resume=True (--resume) to continue it, or choose a new directory.")
    if previous:
        missing = dataclasses.MISSING  # fields newer than the run take their defaults
        defaults = {f.name: f.default if f.default is not missing else f.default_factory()
                    for f in dataclasses.fields(TrainConfig)
                    if f.default is not missing or f.default_factory is not missing}
        old = {k: v for k, v in {**defaults, **previous["config"]}.items()
               if k not in _RESUME_FREE}
        new = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _RESUME_FREE}
        diff = [f"{k}: run {old.get(k)!r}, now {new.get(k)!r}" for k in sorted(set(old) | set(new))
                if old.get(k) != new.get(k)]
        if diff:
            raise UserError(f"Cannot resume {out} with other settings (" + "; ".join(diff)
                            + "). Resume with the run's own settings or start a new run.")
        if previous.get("status") == "done":
            return previous["summary"]

    shards, train_data, eval_data, eval_note, d2t, t2d, target_path = _prepare_data(cfg)
    if previous:
        _compare_identity(previous["data"]["train"], shard_identity(shards),
                          f"the run in {out}", shards.path)
    dev = resolve_device(cfg.device)
    cuda = dev.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32  # CPU: fp32 (bf16 is ~5x slower)
    train_data.pad = cfg.pad_batches or cuda  # speculators compiles forward on CUDA
    torch.manual_seed(cfg.seed)
    aux = shards.aux
    model = build_drafter(target_path=target_path, aux=aux, d2t=d2t, t2d=t2d,
                          serve_engine=cfg.serve_engine, ttt_steps=cfg.ttt_steps,
                          num_layers=cfg.num_layers, attn=cfg.draft_attn)
    if cfg.init_from:
        _init_from(model, cfg.init_from, shards, d2t)
    if cfg.train_lm_head:
        model.lm_head.weight.requires_grad_(True)
    model.to(dev).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    total_steps, total_tokens = _plan_steps(train_data, cfg)
    sched = _scheduler(opt, cfg, total_steps)
    fwd_kw = {"ttt_steps": cfg.ttt_steps, "ttt_step_loss_decay": cfg.ttt_step_loss_decay,
              "loss_config": resolve_loss_config(cfg.loss_fn, "eager")}
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda \
        else contextlib.nullcontext  # as speculators: fp32 master weights, bf16 compute
    ev_kw = {"ttt_steps": cfg.ttt_steps, "decay": cfg.ttt_step_loss_decay,
             "loss_fn": cfg.loss_fn, "device": dev}
    state = {"step": 0, "epoch": 0, "batch": 0, "tokens": 0, "loss_tokens": 0, "wall_s": 0.0}
    ckpts = _checkpoints(out) if cfg.resume else []
    if ckpts:
        state = _load_checkpoint(ckpts[-1], model, opt, sched)
        print(f"train: resuming {out} from {ckpts[-1].name} (step {state['step']}).")
    _truncate_metrics(metrics_path, state["step"] if ckpts else -1)
    info = {
        "format": RUN_FORMAT, "version": RUN_VERSION, "status": "running",
        "config": dataclasses.asdict(cfg), "versions": _versions(),
        "data": {"train": shard_identity(shards), "eval_note": eval_note,
                 "eval": shard_identity(eval_data.shards),
                 "train_samples": len(train_data.indices),
                 "eval_samples": len(eval_data.indices),
                 "tokens_per_epoch": sum(train_data.batch_tokens(b)
                                         for b in train_data.batches(cfg.seed, 0))},
        "drafter": {"serve_engine": cfg.serve_engine,
                    "engine_profile": ENGINE_PROFILES[cfg.serve_engine],
                    "aux": {"capture_points": list(aux.capture_points),
                            "written_ids": aux.vllm_ids, "written_convention": "vllm",
                            "vllm_ids": aux.vllm_ids, "sglang_ids": aux.sglang_ids,
                            "extracted_convention": aux.convention},
                    "draft_vocab_size": int(d2t.numel()), "num_layers": cfg.num_layers,
                    "hidden_size": int(shards.hidden_size),
                    "trainable_params": sum(p.numel() for p in params),
                    "device": dev, "compute_dtype": str(dtype).replace("torch.", "")},
        "plan": {"total_steps": total_steps, "total_tokens": total_tokens},
        "metric_definitions": METRIC_DEFINITIONS, "progress": dict(state), "summary": None,
    }
    atomic_write_json(run_path, info)

    pending = sorted(t for t in cfg.eval_at_tokens if t > state["tokens"])
    t0 = time.time() - state["wall_s"]
    ckpt_path = ckpts[-1] if ckpts else None

    def log(line: dict) -> None:
        with open(metrics_path, "a") as f:
            f.write(json.dumps(line) + "\n")

    def base_line() -> dict:
        return {"step": state["step"], "epoch": state["epoch_f"] if "epoch_f" in state else 0.0,
                "tokens": state["tokens"], "loss_tokens": state["loss_tokens"],
                "wall_s": round(time.time() - t0, 3), "lr": opt.param_groups[0]["lr"]}

    def fail(msg: str) -> None:
        info.update(status="failed", error=msg, progress=dict(state))
        atomic_write_json(run_path, info)
        raise TrainingDiverged(msg + " The last good checkpoint is kept: "
                               + (str(ckpt_path) if ckpt_path else "none was written yet "
                                  "(set checkpoint_every)") + f"; {run_path} records the failure.")

    if state["step"] == 0 and cfg.eval_at_start:
        log({**base_line(), "train": None,
             "eval": evaluate(model, eval_data, **ev_kw)})
    bar = tqdm(total=total_steps, initial=state["step"], desc="train", unit="step",
               disable=not cfg.progress)
    stopped = False
    while state["step"] < total_steps and not stopped:
        batches = train_data.batches(cfg.seed, state["epoch"])
        for bi in range(state["batch"], len(batches)):
            ids = batches[bi]
            batch = {k: v.to(dev, non_blocking=True)
                     for k, v in train_data.collate(ids, dtype).items()}
            with autocast():
                _, loss, m = model(**batch, **fwd_kw)
            if not _finite(loss):
                per_pos = [float(m[f"loss_{i}_sum"]) for i in range(cfg.ttt_steps)]
                bad = _nonfinite_samples(train_data, ids)
                fail(f"Training stopped at step {state['step'] + 1} (epoch {state['epoch']}): "
                     f"the loss is {float(loss.detach())} (per TTT position {per_pos}) at lr "
                     f"{opt.param_groups[0]['lr']:.3g}. "
                     + (f"The input features of sample(s) {bad} in {shards.path} are not "
                        f"finite: re-extract those conversations or drop them." if bad else
                        "The inputs are finite, so training diverged: lower lr, add "
                        "warmup_steps, or tighten grad_clip."))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(
                params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
            if not _finite(gn):
                fail(f"Training stopped at step {state['step'] + 1}: the gradient norm is "
                     f"{float(gn)} at lr {opt.param_groups[0]['lr']:.3g}; lower lr or set "
                     f"grad_clip.")
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            counts = step_counts(m, batch["loss_mask"], cfg.ttt_steps, cfg.ttt_step_loss_decay)
            state["step"] += 1
            state["tokens"] += train_data.batch_tokens(ids)
            state["loss_tokens"] += int(batch["loss_mask"].sum())
            state["epoch_f"] = state["epoch"] + (bi + 1) / len(batches)
            state["epoch"], state["batch"] = ((state["epoch"] + 1, 0) if bi + 1 == len(batches)
                                              else (state["epoch"], bi + 1))
            last = state["step"] >= total_steps
            do_eval = last or (cfg.eval_every and state["step"] % cfg.eval_every == 0)
            while pending and state["tokens"] >= pending[0]:
                pending.pop(0)
                do_eval = True
            if do_eval or state["step"] % max(cfg.log_every, 1) == 0:
                train_m = summarize_counts(counts, cfg.ttt_steps, cfg.ttt_step_loss_decay)
                train_m.update(objective=float(loss.detach()), grad_norm=float(gn))
                line = {**base_line(), "lr": lr, "train": train_m}
                if do_eval:
                    line["eval"] = evaluate(model, eval_data, **ev_kw)
                log(line)
                bar.set_postfix(loss=f"{train_m['objective']:.3f}",
                                acc0=f"{train_m['full_acc'][0]:.2f}")
            bar.update(1)
            state["wall_s"] = time.time() - t0
            if cfg.checkpoint_every and state["step"] % cfg.checkpoint_every == 0 and not last:
                ckpt_path = _save_checkpoint(out, model, opt, sched, state, cfg.keep_checkpoints)
                info["progress"] = dict(state)
                atomic_write_json(run_path, info)
            if cfg.stop_after_steps and state["step"] >= cfg.stop_after_steps and not last:
                stopped = True
            if last or stopped:
                break
    bar.close()
    state["wall_s"] = time.time() - t0
    info["progress"] = dict(state)
    if stopped:
        info["status"] = "stopped"
        atomic_write_json(run_path, info)
        return {"run_dir": str(out), "status": "stopped", "step": state["step"]}
    with atomic_dir(out / "final") as tmp:
        _save_pretrained(model, tmp)
        atomic_write_json(tmp / "eagle3lab.json", {k: info[k] for k in (
            "format", "version", "versions", "data", "drafter", "metric_definitions")})
    summary = {"run_dir": str(out), "status": "done", "final": str(out / "final"),
               "steps": state["step"], "tokens": state["tokens"],
               "wall_s": round(state["wall_s"], 2),
               "tokens_per_s": state["tokens"] / state["wall_s"] if state["wall_s"] else None}
    info.update(status="done", summary=summary)
    atomic_write_json(run_path, info)
    return summary


#: Settings that may differ when resuming (they do not change what is computed).
_RESUME_FREE = {"resume", "stop_after_steps", "progress", "device", "out", "cpu_threads"}


def _init_from(model, path: str, shards, d2t) -> None:
    """Start from a saved speculators drafter after checking it fits the shards."""
    from safetensors.torch import load_file

    p = Path(path)
    if not (p / "config.json").is_file():
        raise UserError(f"init_from {path!r} is not a speculators checkpoint (no config.json).")
    cfg = json.loads((p / "config.json").read_text())
    weights = {}
    for f in sorted(p.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    cfg["d2t"] = weights.get("d2t")
    check_drafter_against_shards(cfg, shards, d2t, f"the drafter in {path}")
    model.load_state_dict(weights, strict=False)
