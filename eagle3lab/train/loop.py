"""The training loop: `train(**kw)` / `train_run(cfg)`, one drafter run into a directory.

Prevents silently training on NaN: a NaN/inf loss or gradient stops the run naming the
step, the per-position losses, the lr and any samples with non-finite features, marks the
run failed in run.json and keeps the last good checkpoint (`TrainingDiverged`).

Online (`cfg.online`, train/online.py) the same loop reads an online set: the target
computes each micro-batch's states as it is collated, in this process (no data workers).

Under torchrun every rank runs this loop (train/distributed.py: DDP or FSDP2, the data
shared out per optimizer step by `PackedData.steps`, one all-reduce per step for the raw
counts and the NaN flag, so every rank stops at the same step; rank 0 logs and writes). One
optimizer step = world_size x grad_accum micro-batches, each loss (speculators' per-batch
mean) weighted 1 / (world_size x grad_accum): the gradient is the mean of the micro-batch
gradients, exactly as one process accumulating the same micro-batches.

The loop is ours, around speculators' real pieces: `Eagle3DraftModel.forward` (TTT unroll,
loss and per-position metrics), `shift_batch` + `CollateFn` (its input pairing and
packing) and `MultipackDistributedBatchSamplerV2` (its data order). speculators'
`Trainer` is not used: without an accelerator it fails at `model.to(local_rank)` (rank 0
means CUDA) and then at `torch.accelerator.synchronize()`; it evaluates only at epoch
ends, hard-codes grad clip 1.0 and resumes without RNG state. (bench/train.py runs it with
those two calls shimmed: same tokens/s as this loop.)
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from eagle3lab.data.rendering import unknown
from eagle3lab.distributed import Ranks, session
from eagle3lab.errors import UserError
from eagle3lab.fsutil import atomic_write_json, check_writable_dir
from eagle3lab.targets.adapter import resolve_device
from eagle3lab.train import distributed
from eagle3lab.train.checkpoints import (RUN_FORMAT, RUN_VERSION, check_resume_rendering,
                                         list_checkpoints, load_checkpoint, read_run,
                                         save_checkpoint, save_final, truncate_metrics,
                                         versions)
from eagle3lab.train.config import TrainConfig, check_resume_settings
from eagle3lab.train.counts import (METRIC_DEFINITIONS, count_keys, step_count_tensor,
                                    summarize_counts)
from eagle3lab.train.data import PackedData, compare_identity, prepare_data, shard_identity
from eagle3lab.train.evaluation import evaluate
from eagle3lab.train.model import (FLEX, build_drafter, init_from, match_final_state,
                                   resolve_draft_attn)
from eagle3lab.train.online import prepare_online, warm_cache
from eagle3lab.train.profile import PROFILE_DIR, REGIONS, StepProfiler, labelled
from eagle3lab.workdir import FINAL


class TrainingDiverged(UserError):
    """A non-finite loss or gradient stopped the run (the last good checkpoint is kept)."""


#: `eagle3lab train`'s exit code when SIGTERM stopped it after checkpointing its step (the
#: shell's code for the signal), so a supervisor (bench/study_gpu.py train) does not take
#: the run for finished, nor for failed
SIGTERM_EXIT = 128 + 15


class _TermFlag:
    """SIGTERM while a one-process run trains (the study's deadline, a session's end): the
    loop finishes its step, writes a checkpoint of it and stops, so the next call resumes
    from the step reached instead of the last periodic checkpoint (up to 1/8 of a study
    run: ~150 s of an H200's 1,800 s session at 128M tokens). Under torchrun (several
    ranks) the default stays: a rank stopping alone would hang the others' collectives.
    Off the main thread a handler cannot be installed: the default stays too."""

    def __init__(self, *, one_process: bool) -> None:
        import signal
        import threading

        self.set = False
        self._old = None
        if one_process and threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum, frame) -> None:
        self.set = True

    def restore(self) -> None:
        import signal

        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
            self._old = None


class _Ahead:
    """An iterator that can fetch its next item early (`prefetch`): the loop fetches step
    k+1's batch after queuing step k's forward and backward and before it waits for step
    k's numbers, so a device computes step k while the host makes the batch (online: the
    target's forward, queued behind step k). The items and their order are unchanged."""

    def __init__(self, items) -> None:
        self._it = iter(items)
        self._next: list[Any] = []

    def __iter__(self) -> "_Ahead":
        return self

    def __next__(self) -> Any:
        return self._next.pop() if self._next else next(self._it)

    def prefetch(self) -> None:
        if not self._next:
            try:
                self._next.append(next(self._it))
            except StopIteration:
                pass


def train(*, verify: bool = True, **kwargs) -> dict[str, Any]:
    """Keyword form of `train_run` (notebooks and the CLI call this). Unknown or mistyped
    keys are refused. Returns the run summary (also stored in RUN_DIR/run.json).

    verify: check the shards' recorded sha256s before training (cached by size and mtime,
    see `ShardSet.verify`); not a TrainConfig field, as it changes nothing computed."""
    return train_run(TrainConfig.from_dict(kwargs), verify=verify)


def _scheduler(opt, cfg: TrainConfig, total_steps: int):
    from transformers import (get_constant_schedule_with_warmup,
                              get_cosine_schedule_with_warmup,
                              get_linear_schedule_with_warmup)

    if cfg.schedule == "constant":
        return get_constant_schedule_with_warmup(opt, cfg.warmup_steps)
    fn = (get_cosine_schedule_with_warmup if cfg.schedule == "cosine"
          else get_linear_schedule_with_warmup)
    return fn(opt, cfg.warmup_steps, max(total_steps, 1))


def _step_tokens(data: PackedData, cfg: TrainConfig, d: Ranks,
                 epoch: int) -> list[int]:
    """Tokens of each optimizer step of an epoch: all ranks' micro-batches, summed."""
    steps = data.steps(cfg.seed, epoch, rank=d.rank, world_size=d.world_size,
                       grad_accum=cfg.grad_accum)
    return [int(t) for t in d.sum([sum(data.batch_tokens(b) for b in micro)
                                   for micro in steps])]


def _plan_steps(data: PackedData, cfg: TrainConfig, d: Ranks) -> tuple[int, int]:
    """(total optimizer steps, tokens they process): epochs, cut by max_steps/max_tokens."""
    steps = tokens = 0
    for epoch in range(cfg.epochs):
        for t in _step_tokens(data, cfg, d, epoch):
            steps += 1
            tokens += t
            if (cfg.max_steps and steps >= cfg.max_steps) or (
                    cfg.max_tokens and tokens >= cfg.max_tokens):
                return steps, tokens
    return steps, tokens


def _nonfinite_samples(data: PackedData, batch) -> list[int]:
    import torch

    bad = []
    for i in batch:
        s = data.shards[int(i)]
        if not (torch.isfinite(s["hidden_states"].float()).all()
                and torch.isfinite(s["verifier_last_hidden_states"].float()).all()):
            bad.append(int(i))
    return bad


def _loss_problem(seen, state, opt, cfg, data: PackedData, shards,
                  rank_note: str) -> str | None:
    """The message for this rank's first non-finite micro-batch loss of the step, or None
    (asked only once the step's all-reduced flag says some rank saw one)."""
    bad = [(loss, m, ids) for loss, m, ids in seen if not _finite(loss)]
    if not bad:
        return None
    loss, m, ids = bad[0]
    per_pos = [float(m[f"loss_{i}_sum"]) for i in range(cfg.ttt_steps)]
    samples = _nonfinite_samples(data, ids)
    return (f"Training stopped at step {state['step'] + 1} (epoch {state['epoch']}"
            f"{rank_note}): the loss is {float(loss)} (per TTT position {per_pos}) at lr "
            f"{opt.param_groups[0]['lr']:.3g}. "
            + (f"The input features of sample(s) {samples} in {shards.path} are not finite: "
               f"re-extract those conversations or drop them." if samples else
               "The inputs are finite, so training diverged: lower lr, add warmup_steps, or "
               "tighten grad_clip."))


def _finite(x) -> bool:
    return x is not None and math.isfinite(float(x.detach() if hasattr(x, "detach") else x))


def train_run(cfg: TrainConfig, *, verify: bool = True) -> dict[str, Any]:
    """Train (or resume) one drafter run into cfg.out; see the module docstring.

    cpu_threads: with 2 OpenMP threads on 2 cores that other jobs also use, every op waits
    for a descheduled thread (steps measured ~20x slower than with 1 thread); 1 avoids it.
    """
    import torch

    before = torch.get_num_threads()
    if cfg.cpu_threads > 0:
        torch.set_num_threads(cfg.cpu_threads)
    try:
        return _train_run(cfg, verify)
    finally:
        torch.set_num_threads(before)


def _train_run(cfg: TrainConfig, verify: bool) -> dict[str, Any]:
    distributed.check_launch(fsdp=cfg.fsdp)
    with session(device=resolve_device(cfg.device), timeout=cfg.dist_timeout) as d:
        d = distributed.with_health_group(d)
        where: dict[str, Any] = {"step": None, "checkpoint": None}  # step None: not begun
        try:
            return _train_ranks(cfg, d, d.device, where, verify)
        except Exception as e:
            if d.active and not isinstance(e, UserError) and distributed.is_comm_error(e):
                raise distributed.comm_failure(d, e, step=where["step"],
                                               checkpoint=where["checkpoint"]) from None
            raise


def _train_ranks(cfg: TrainConfig, d: Ranks, dev: str,
                 where: dict[str, Any], verify: bool) -> dict[str, Any]:
    """The run on every rank (one process: d is rank 0 of 1). `where` follows the step and
    the last checkpoint, for the message of a failed collective."""
    import contextlib

    import torch
    from speculators.losses import resolve_loss_config
    from torch.profiler import record_function
    from tqdm.auto import tqdm

    out = check_writable_dir(cfg.out, "run directory")
    distributed.check_shared_dir(d, out)
    run_path, metrics_path = out / "run.json", out / "metrics.jsonl"
    previous = read_run(out) if run_path.exists() else None
    if previous and not cfg.resume:
        raise UserError(f"{out} already holds a run (status {previous.get('status')!r}). Pass "
                        f"resume=True (--resume) to continue it, or choose a new directory.")
    ranks = distributed.describe(d, fsdp=cfg.fsdp, grad_accum=cfg.grad_accum)
    if previous:
        check_resume_settings(previous["config"], cfg, out)
        if previous.get("status") == "done":
            return previous["summary"]
        distributed.check_resume_world(previous.get("distributed"), ranks, out)

    # before the data (an online set loads its target): a flex that cannot run is refused
    attn = resolve_draft_attn(cfg.draft_attn, device=dev, max_tokens=cfg.max_tokens_per_batch)
    shards, train_data, eval_data, eval_note, d2t, t2d, target_path = (
        prepare_online(cfg, dist=d, verbose=d.main, previous=previous) if cfg.online
        else prepare_data(cfg, verify=verify, verbose=d.main))
    rendering = getattr(shards, "rendering", None) or unknown("the data records no rendering")
    if previous:
        compare_identity(previous["data"]["train"], shard_identity(shards),
                         f"the run in {out}", shards.path)
        check_resume_rendering(previous.get("rendering"), rendering, out)
    cuda = dev.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32  # CPU: fp32 (bf16 is ~5x slower)
    train_data.pad = cfg.pad_batches or cuda  # speculators compiles forward on CUDA
    if attn == FLEX:  # its BlockMask grows by whole blocks: every batch padded, eval too
        train_data.pad = eval_data.pad = True
    if cuda:
        # speculators compiles the draft forward; dynamo's recompile limit (8 a function)
        # counts every run of the process, and past it flex runs UNcompiled, with the dense
        # score matrix (45 GiB at 16k tokens: the OOM of bench/online.py's second kernel on
        # the H200). Each run starts with dynamo's caches empty (inductor's disk cache stays).
        torch._dynamo.reset()
    torch.manual_seed(cfg.seed)
    aux = shards.aux
    drafter = build_drafter(target_path=target_path, aux=aux, d2t=d2t, t2d=t2d,
                            serve_engine=cfg.serve_engine, ttt_steps=cfg.ttt_steps,
                            num_layers=cfg.num_layers, attn=attn,
                            flags=cfg.drafter_flags(), warn=d.main)
    match_final_state(drafter, shards)
    if cfg.init_from:
        init_from(drafter, cfg.init_from, shards, d2t)
    if cfg.train_lm_head:
        drafter.lm_head.weight.requires_grad_(True)
    drafter.to(dev).train()
    # model: what the steps call (DDP wrapper, or the drafter); drafter: what is saved
    model, drafter = distributed.wrap_model(drafter, d, fsdp=cfg.fsdp, device=dev,
                                           reduce_dtype=cfg.grad_reduce_dtype)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    total_steps, total_tokens = _plan_steps(train_data, cfg, d)
    sched = _scheduler(opt, cfg, total_steps)
    fwd_kw = {"ttt_steps": cfg.ttt_steps, "ttt_step_loss_decay": cfg.ttt_step_loss_decay,
              "loss_config": resolve_loss_config(cfg.loss_fn, "eager")}
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda \
        else contextlib.nullcontext  # as speculators: fp32 master weights, bf16 compute
    ev_kw = {"ttt_steps": cfg.ttt_steps, "decay": cfg.ttt_step_loss_decay,
             "loss_fn": cfg.loss_fn, "device": dev, "dist": d}
    eval_model = drafter  # DDP: the drafter itself (no collective in its forward)
    state = {"step": 0, "epoch": 0, "batch": 0, "tokens": 0, "loss_tokens": 0, "wall_s": 0.0}
    ckpts = d.broadcast(list_checkpoints(out) if cfg.resume and d.main else [])
    if ckpts:
        state = load_checkpoint(ckpts[-1], drafter, opt, sched, dist=d)
        if d.main:
            print(f"train: resuming {out} from {ckpts[-1].name} (step {state['step']}).")
        if cfg.online and cfg.states_cache:
            warm_cache(train_data, cfg, d, state)
    d.barrier()  # every rank has read the run directory before rank 0 rewrites it
    if d.main:
        truncate_metrics(metrics_path, state["step"] if ckpts else -1)
    info = {
        "format": RUN_FORMAT, "version": RUN_VERSION, "status": "running",
        "config": cfg.model_dump(), "versions": versions(),
        "data": {"train": shard_identity(shards), "eval_note": eval_note,
                 "eval": shard_identity(eval_data.shards),
                 "train_samples": len(train_data.indices),
                 "eval_samples": len(eval_data.indices),
                 "tokens_per_epoch": sum(_step_tokens(train_data, cfg, d, 0))},
        "drafter": {"serve_engine": cfg.serve_engine,
                    "engine_profile": cfg.drafter_flags(),
                    "aux": {"capture_points": list(aux.capture_points),
                            "written_ids": aux.vllm_ids, "written_convention": "vllm",
                            "vllm_ids": aux.vllm_ids, "sglang_ids": aux.sglang_ids,
                            "extracted_convention": aux.convention},
                    "draft_vocab_size": int(d2t.numel()), "num_layers": cfg.num_layers,
                    "hidden_size": int(shards.hidden_size),
                    "trainable_params": sum(p.numel() for p in params),
                    "device": dev, "compute_dtype": str(dtype).replace("torch.", ""),
                    "draft_attn": attn},  # config's draft_attn resolved ("auto")
        "distributed": ranks,
        "plan": {"total_steps": total_steps, "total_tokens": total_tokens},
        "rendering": rendering,  # how the training text was rendered (data/rendering.py)
        "metric_definitions": METRIC_DEFINITIONS, "progress": dict(state), "summary": None,
    }

    def write_run() -> None:
        if d.main:
            atomic_write_json(run_path, info)

    write_run()
    pending = sorted(t for t in cfg.eval_at_tokens if t > state["tokens"])
    t0 = time.time() - state["wall_s"]
    where["checkpoint"] = ckpts[-1] if ckpts else None

    def log(line: dict) -> None:
        if d.main:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(line) + "\n")

    def base_line() -> dict:
        return {"step": state["step"], "epoch": state["epoch_f"] if "epoch_f" in state else 0.0,
                "tokens": state["tokens"], "loss_tokens": state["loss_tokens"],
                "wall_s": round(time.time() - t0, 3), "lr": opt.param_groups[0]["lr"]}

    def fail(msg: str) -> None:
        info.update(status="failed", error=msg, progress=dict(state))
        write_run()
        ckpt_path = where["checkpoint"]
        raise TrainingDiverged(msg + " The last good checkpoint is kept: "
                               + (str(ckpt_path) if ckpt_path else "none was written yet "
                                  "(set checkpoint_every)") + f"; {run_path} records the failure.")

    if state["step"] == 0 and cfg.eval_at_start:
        log({**base_line(), "train": None,
             "eval": evaluate(eval_model, eval_data, **ev_kw)})
    bar = tqdm(total=total_steps, initial=state["step"], desc="train", unit="step",
               disable=not (cfg.progress and d.main))
    rank_note = f", rank {d.rank} of {d.world_size}" if d.active else ""
    micro_n = d.world_size * cfg.grad_accum  # micro-batches per optimizer step
    stopped = False
    term = _TermFlag(one_process=not d.active)  # SIGTERM: checkpoint this step, then stop
    prof = StepProfiler(cfg.profile_steps, out, device_type="cuda" if cuda else "cpu",
                        enabled=d.main)
    keys = count_keys(cfg.ttt_steps)
    workers = 0 if cfg.online else (cfg.data_workers if cfg.data_workers >= 0
                                    else (2 if cuda else 0))
    try:
        prof.before(state["step"] + 1, state["tokens"])  # then after each step: its batch in
        while state["step"] < total_steps and not stopped:
            steps = train_data.steps(cfg.seed, state["epoch"], rank=d.rank,
                                     world_size=d.world_size, grad_accum=cfg.grad_accum)
            collated = _Ahead(labelled(train_data.loader(steps[state["batch"]:], dtype,
                                                         workers=workers, pin=cuda),
                                       REGIONS[0]))
            for bi, micro in zip(range(state["batch"], len(steps)), collated):
                where["step"] = state["step"] + 1
                distributed.fault_point(d, state["step"] + 1)
                opt.zero_grad(set_to_none=True)
                # the step's numbers stay on the device until one read after the all-reduce
                sums = torch.zeros(3 + len(keys), dtype=torch.float64, device=dev)
                seen = []  # (loss, metrics, sample ids) of each micro-batch, for a NaN report
                for k, (ids, cpu_batch) in enumerate(zip(steps[bi], micro)):
                    batch = {key: v.to(dev, non_blocking=True) for key, v in cpu_batch.items()}
                    with distributed.grad_sync(model, sync=k == len(steps[bi]) - 1), \
                            record_function(REGIONS[1]):
                        with autocast():
                            _, loss, m = model(**batch, **fwd_kw)
                        (loss / cfg.grad_accum if cfg.grad_accum > 1 else loss).backward()
                        loss = loss.detach()
                        seen.append((loss, m, ids))
                        sums += torch.cat([(~torch.isfinite(loss)).to(torch.float64).reshape(1),
                                           loss.to(torch.float64).reshape(1),
                                           batch["loss_mask"].sum().to(torch.float64).reshape(1),
                                           step_count_tensor(m, batch["loss_mask"],
                                                             cfg.ttt_steps,
                                                             cfg.ttt_step_loss_decay)])
                if cfg.prefetch and bi + 1 < len(steps):
                    collated.prefetch()  # queued behind this step's work on the device
                tokens = sum(train_data.batch_tokens(ids) for ids in steps[bi])
                with record_function(REGIONS[2]):
                    gn = distributed.clip_grad_norm(params, cfg.grad_clip)
                    # one all-reduce and one read: NaN flag, objective, tokens, every raw
                    # count, and the gradient norm (the same on every rank; averaged, so a
                    # NaN anywhere shows)
                    flag, loss_sum, loss_tokens, *summed, tokens, gn = d.sum(
                        torch.cat([sums, torch.tensor([tokens], dtype=torch.float64).to(dev),
                                   gn.detach().to(torch.float64).reshape(1) / d.world_size]))
                if flag:
                    fail(next(p for p in d.gather(_loss_problem(
                        seen, state, opt, cfg, train_data, shards, rank_note)) if p))
                counts = dict(zip(keys, summed))
                if not math.isfinite(gn):
                    fail(f"Training stopped at step {state['step'] + 1}: the gradient norm is "
                         f"{gn} at lr {opt.param_groups[0]['lr']:.3g}; lower lr or set "
                         f"grad_clip.")
                lr = opt.param_groups[0]["lr"]
                with record_function(REGIONS[3]):
                    opt.step()
                    sched.step()
                state["step"] += 1
                state["tokens"] += int(tokens)
                state["loss_tokens"] += int(loss_tokens)
                state["epoch_f"] = state["epoch"] + (bi + 1) / len(steps)
                state["epoch"], state["batch"] = ((state["epoch"] + 1, 0) if bi + 1 == len(steps)
                                                  else (state["epoch"], bi + 1))
                last = state["step"] >= total_steps
                do_eval = last or (cfg.eval_every and state["step"] % cfg.eval_every == 0)
                while pending and state["tokens"] >= pending[0]:
                    pending.pop(0)
                    do_eval = True
                if do_eval or state["step"] % max(cfg.log_every, 1) == 0:
                    train_m = summarize_counts(counts, cfg.ttt_steps, cfg.ttt_step_loss_decay)
                    train_m.update(objective=loss_sum / micro_n, grad_norm=float(gn))
                    line = {**base_line(), "lr": lr, "train": train_m}
                    if do_eval:
                        line["eval"] = evaluate(eval_model, eval_data, **ev_kw)
                    log(line)
                    bar.set_postfix(loss=f"{train_m['objective']:.3f}",
                                    acc0=f"{train_m['full_acc'][0]:.2f}")
                bar.update(1)
                if prof.after(state["step"], state["tokens"]) is not None:
                    bar.write(f"train: profiled steps {cfg.profile_steps[0]}-"
                              f"{cfg.profile_steps[1]}: {out / PROFILE_DIR}")
                state["wall_s"] = time.time() - t0
                periodic = cfg.checkpoint_every and state["step"] % cfg.checkpoint_every == 0
                if (periodic or term.set) and not last:  # SIGTERM: this step's, then stop
                    where["checkpoint"] = save_checkpoint(out, drafter, opt, sched, state,
                                                          cfg.keep_checkpoints, dist=d)
                    info["progress"] = dict(state)
                    write_run()
                if cfg.stop_after_steps and state["step"] >= cfg.stop_after_steps and not last:
                    stopped = True
                if term.set and not last:
                    print(f"train: SIGTERM: stopped at step {state['step']}, checkpoint "
                          f"{where['checkpoint']}; resume=True continues from it.", flush=True)
                    stopped = True
                if last or stopped:
                    break
                prof.before(state["step"] + 1, state["tokens"])
    finally:
        term.restore()
        prof.close()
    bar.close()
    state["wall_s"] = time.time() - t0
    info["progress"] = dict(state)
    if stopped:
        info["status"] = "stopped"
        write_run()
        return {"run_dir": str(out), "status": "stopped", "step": state["step"],
                **({"signal": "SIGTERM"} if term.set else {})}
    weights = distributed.gathered_state_dict(drafter, d)
    if d.main:
        save_final(out, drafter, info, weights)
    summary = {"run_dir": str(out), "status": "done", "final": str(out / FINAL),
               "steps": state["step"], "tokens": state["tokens"],
               "wall_s": round(state["wall_s"], 2),
               "tokens_per_s": state["tokens"] / state["wall_s"] if state["wall_s"] else None}
    info.update(status="done", summary=summary)
    write_run()
    return summary
