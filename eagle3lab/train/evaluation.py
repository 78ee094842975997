"""Eval metrics of a drafter on fixed batches: the code behind every run's eval lines.

Prevents comparing eval numbers measured on different batches or with different metric
code: every run, every reload of a checkpoint and every saved drafter evaluated later
(`scaling.evaluate_drafter`) goes through `evaluate`, on its data's batches for seed 0,
epoch 0, keeping the raw counts the ratios come from. Under torchrun (`dist`) each rank
evaluates every world_size-th batch and the raw counts are summed over ranks, so an eval
line means the same at any world size (a sharded drafter runs the same number of forwards
on every rank: its forward is a collective).
"""

from __future__ import annotations

from eagle3lab.distributed import Ranks
from eagle3lab.train import distributed
from eagle3lab.train.counts import step_counts, summarize_counts
from eagle3lab.train.data import PackedData


def evaluate(model, data: PackedData, *, ttt_steps: int, decay: float = 1.0,
             loss_fn: str = "kl_div", device: str = "cpu",
             dist: Ranks | None = None) -> dict:
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
    d = dist or Ranks()
    batches = data.batches(0, 0)
    mine = list(range(d.rank, len(batches), d.world_size))
    if d.active and distributed.is_sharded(model):  # pad: same forwards on every rank
        mine += [-1] * (-(-len(batches) // d.world_size) - len(mine))
    total: dict[str, float] = {}
    with torch.no_grad():
        for i in mine:
            batch = {k: v.to(device) for k, v in data.collate(batches[i], dtype).items()}
            with ctx():
                _, _, m = model(**batch, **kwargs)
            if i < 0:
                continue
            for k, v in step_counts(m, batch["loss_mask"], ttt_steps, decay).items():
                total[k] = total.get(k, 0.0) + v
    model.train(was_training)
    if d.active:  # keys in step_counts' order, from a rank that evaluated a batch
        keys = next(k for k in d.gather(list(total)) if k)
        total = dict(zip(keys, d.sum([total.get(k, 0.0) for k in keys])))
    return summarize_counts(total, ttt_steps, decay)
