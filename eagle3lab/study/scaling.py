"""The large-data arm of the grokking-vs-data study: a drafter trained elsewhere on far more
data, next to the study's arms.

Prevents comparing numbers measured on different held-out sets: a drafter trained on a GPU
(by default the shipped one) is evaluated on the study's OWN held-out batches with the same
metric code and TTT depth as every run (`train.evaluate`), instead of being read off its own
curve, which was measured on another eval split. It is not an equal-compute arm, and the
verdict sentence says so.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Callable

from eagle3lab.data.foreign import open_shards
from eagle3lab.errors import UserError
from eagle3lab.formats.reader import Checkpoint
from eagle3lab.specdec.load import FIT_CODES, fit_errors
from eagle3lab.targets.adapter import resolve_device
from eagle3lab.train import (PackedData, TrainConfig, check_drafter_against_shards, evaluate,
                             load_drafter, match_final_state, split_samples)
from eagle3lab.train.counts import frame_from_lines, read_metrics
from eagle3lab.workdir import default_drafter

LARGE_KIND = "large data (not equal compute)"
CPU_KIND = "study arm (equal compute)"


def study_eval_split(study_dir: str | os.PathLike) -> dict[str, Any]:
    """What every run of the study evaluates on, and how: the held-out shards (or the
    samples held out of the train shards), the batch size that packs them, and the TTT
    depth, loss and decay of the metrics."""
    cfg = json.loads((Path(study_dir) / "study.json").read_text())["config"]
    t = {**TrainConfig.defaults(), **cfg["train"]}
    if cfg.get("eval_data"):
        data, indices = cfg["eval_data"], None
    else:  # plan_study uses data_seed 0 for every run when it holds out part of the data
        data = cfg["data"]
        indices = split_samples(len(open_shards(data)), eval_fraction=t["eval_fraction"],
                                data_fraction=1.0, data_seed=0)[1].tolist()
    return {"data": data, "indices": indices, "max_tokens_per_batch": t["max_tokens_per_batch"],
            "ttt_steps": t["ttt_steps"], "decay": t["ttt_step_loss_decay"],
            "loss_fn": t["loss_fn"], "train_data": cfg["data"]}


def drafter_misfit(drafter: str | os.PathLike, *, data: str | os.PathLike) -> list[str]:
    """The checkpoint doctor's fit errors for `drafter` against the target the shards in
    `data` were extracted from ([] = it fits and can be evaluated on them), e.g. the
    shipped drafter against the demo's tiny random target: hidden size 576 vs 64."""
    target = open_shards(data).manifest["target"]["path"]
    return [f"[{f.code}] {f.message}"
            for f in fit_errors(drafter, target=target, codes=FIT_CODES + ("aux-layers",))[1]]


def evaluate_drafter(drafter: str | os.PathLike, *, eval_data: str | os.PathLike,
                     indices: list[int] | None = None, ttt_steps: int = 3,
                     max_tokens_per_batch: int = 2048, decay: float = 1.0,
                     loss_fn: str = "kl_div", device: str = "auto") -> dict[str, Any]:
    """Teacher-forced eval metrics of a SAVED drafter on shards (all samples, or `indices`),
    computed by `train.evaluate`, the code behind every run's eval lines (same batches,
    counts and ratios); returns that line's `eval` dict.

    Targets come from the shards' `verifier_last_hidden_states` through the drafter's own
    verifier norm and head, restricted by its own t2d, so a drafter whose vocab map differs
    from the shards' (e.g. trained on other data) is evaluated correctly. `ttt_steps` need
    not be the depth it was trained with: pass the study's so the columns line up."""
    path = Path(drafter)
    if not (path / "config.json").is_file():
        raise UserError(f"{path} is not a saved drafter (no config.json).")
    shards = open_shards(eval_data)
    target = shards.manifest["target"]
    record = path / "eagle3lab.json"
    made_for = (json.loads(record.read_text()).get("data", {}).get("train", {})
                .get("target", {}).get("config_sha256") if record.is_file() else None)
    if made_for and made_for != target["config_sha256"]:
        raise UserError(f"The drafter in {path} was trained for another target (config sha256 "
                        f"{made_for[:12]}...) than the shards in {shards.path} "
                        f"({target['config_sha256'][:12]}...).")
    # Hidden size, target vocab and aux layers must match. Its d2t is deliberately NOT
    # passed (the check then skips the vocab-map comparison): that check protects training
    # a drafter further on the shards' map; evaluation uses the drafter's own map.
    check_drafter_against_shards(json.loads((path / "config.json").read_text()), shards,
                                 None, f"the drafter in {path}")
    dev = resolve_device(device)
    # the shards' target, wherever it is now (config.json may name another machine's path)
    model = load_drafter(path, target=target["path"]).to(dev)
    match_final_state(model, shards)
    data = PackedData(shards, range(len(shards)) if indices is None else indices,
                      max_tokens_per_batch)
    return evaluate(model, data, ttt_steps=ttt_steps, decay=decay, loss_fn=loss_fn, device=dev)


def eval_columns(ev: dict[str, Any]) -> dict[str, Any]:
    """An `eval` dict as the columns `metrics.read_metrics` gives an eval line (eval_loss_i,
    eval_full_acc_i, eval_cond_acc_i, eval_objective, eval_loss_mean, eval_sim_accept_len)."""
    row = frame_from_lines([{"step": 0, "eval": ev}]).iloc[0].to_dict()
    return {k: v for k, v in row.items() if k.startswith("eval_")}


def vocab_coverage(t2d, *, data: str | os.PathLike, indices: list[int] | None = None) -> float:
    """Share of the loss-masked tokens of these shards (or samples) inside a draft vocab.
    Teacher-forced accuracy compares with the target's best token WITHIN the drafter's own
    draft vocab, so it cannot see tokens outside it; for greedy responses this is how often
    the target's choice can be drafted at all."""
    s = open_shards(data)
    inside = total = 0
    for i in range(len(s)) if indices is None else indices:
        x = s[int(i)]
        ids = x["input_ids"][x["loss_mask"]]
        inside += int(t2d.bool()[ids].sum())
        total += int(ids.numel())
    return inside / total if total else float("nan")


def metrics_file(path: str | os.PathLike) -> Path | None:
    """The training curve (metrics.jsonl) of a run dir, of a drafter dir that ships its own
    (data/drafters/NAME), or of a run's final/ drafter (the run dir above it); None if none."""
    path = Path(path)
    for m in (path / "metrics.jsonl", path.parent / "metrics.jsonl"):
        if m.is_file() and (m.parent == path or (m.parent / "run.json").is_file()):
            return m
    return None


def drafter_record(drafter: str | os.PathLike) -> dict[str, Any]:
    """What a saved drafter was trained on and how long, from its eagle3lab.json and the
    metrics.jsonl beside it (or in the run directory above a run's final/): samples, tokens
    per pass (the positions a run trains on; `data_tokens`: raw tokens), tokens processed,
    steps, epochs, TTT depth."""
    path = Path(drafter)
    info = json.loads((path / "eagle3lab.json").read_text()) \
        if (path / "eagle3lab.json").is_file() else {}
    data = info.get("data", {})
    spec = json.loads((path / "config.json").read_text()).get("speculators_config") or {}
    methods = spec.get("proposal_methods") or [{}]
    out = {"path": str(path), "train_samples": data.get("train_samples"),
           "train_tokens": data.get("tokens_per_epoch"),
           "data_tokens": data.get("train", {}).get("tokens"),
           "eval_note": data.get("eval_note"), "tokens_processed": None, "steps": None,
           "ttt_steps_trained": methods[0].get("speculative_tokens"),
           "draft_vocab_size": info.get("drafter", {}).get("draft_vocab_size"),
           "metrics": None}
    if (m := metrics_file(path)) is not None:
        last = None
        for line in m.read_text().splitlines():
            try:
                last = json.loads(line)
            except json.JSONDecodeError:
                continue
        if last:
            out.update(metrics=str(m), tokens_processed=last.get("tokens"),
                       steps=last.get("step"))
    if out["tokens_processed"] and out["train_tokens"]:
        out["epochs"] = out["tokens_processed"] / out["train_tokens"]
    return out


def drafter_curve(drafter: str | os.PathLike, *, label: str = "large-data"):
    """The drafter's own training curve (read_metrics frame, labelled as measured on ITS
    eval split), or None when it has no metrics.jsonl."""
    rec = drafter_record(drafter)
    if not rec["metrics"]:
        return None
    df = read_metrics(rec["metrics"])
    df.attrs["run"] = f"{label}, its own eval split"
    return df


def large_data_row(drafter: str | os.PathLike, study_dir: str | os.PathLike, *,
                   label: str = "large-data", device: str = "auto",
                   acceptance: Callable[..., float] | None = None) -> dict[str, Any]:
    """One row for the data-scaling table: `drafter` evaluated on the study's held-out
    batches at the study's TTT depth (eval_* columns as in `compare_at_equal_compute`),
    with its training data and compute from `drafter_record`, the share of eval tokens its
    draft vocab covers, and `accept_len` from `acceptance` (e.g. `offline_acceptance`)."""
    split = study_eval_split(study_dir)
    ev = evaluate_drafter(drafter, eval_data=split["data"], indices=split["indices"],
                          ttt_steps=split["ttt_steps"],
                          max_tokens_per_batch=split["max_tokens_per_batch"],
                          decay=split["decay"], loss_fn=split["loss_fn"], device=device)
    rec = drafter_record(drafter)
    ck = Checkpoint(drafter)
    t2d = ck.tensor("t2d") if "t2d" in ck.tensors else None
    ck.close()
    row = {"run": label, "kind": LARGE_KIND, "data_fraction": None, "weight_decay": None,
           "seed": None, "train_samples": rec["train_samples"],
           "train_tokens": rec["train_tokens"],
           "data_tokens": rec["data_tokens"], "tokens_processed": rec["tokens_processed"],
           "steps": rec["steps"], "epochs": rec.get("epochs"),
           "ttt_steps_trained": rec["ttt_steps_trained"], "eval_ttt_steps": split["ttt_steps"],
           **eval_columns(ev), "eval_counts": ev["counts"],
           "draft_vocab_coverage": None if t2d is None else
           vocab_coverage(t2d, data=split["data"], indices=split["indices"])}
    if acceptance is not None:
        row["accept_len"] = acceptance(Path(drafter),
                                       target=open_shards(split["data"]).manifest["target"]["path"])
    return row


def data_scaling_table(study_dir: str | os.PathLike, table, large: dict[str, Any] | None = None):
    """The study runs at their largest compute level next to the large-data row: training
    data (samples, tokens per pass), tokens processed, epochs, and the eval metrics on the
    same held-out batches. `draft_vocab_coverage`: share of eval tokens each draft vocab
    holds (the study runs share the train shards' map)."""
    import pandas as pd

    final = table[table["multiplier"] == table["multiplier"].max()] if len(table) else table
    rows = final.assign(kind=CPU_KIND, tokens_processed=final["tokens"],
                        epochs=final["epochs_over_subset"]) if len(final) else final
    if len(rows):
        split = study_eval_split(study_dir)
        t2d = open_shards(split["train_data"]).vocab_map()[1]
        rows = rows.assign(ttt_steps_trained=split["ttt_steps"],
                           draft_vocab_coverage=vocab_coverage(
                               t2d, data=split["data"], indices=split["indices"]))
    out = pd.concat([rows, pd.DataFrame([large])], ignore_index=True) if large else rows
    acc = sorted((c for c in out.columns if c.startswith("eval_full_acc_")),
                 key=lambda c: int(c.rsplit("_", 1)[1]))
    cols = ["run", "kind", "data_fraction", "weight_decay", "seed", "train_samples",
            "train_tokens", "tokens_processed", "epochs", "ttt_steps_trained",
            "eval_loss_mean", *acc,
            "eval_sim_accept_len", "accept_len", "draft_vocab_coverage"]
    return out[[c for c in cols if c in out.columns]].reset_index(drop=True)


def large_data_verdict(scaling, *, metric: str = "eval_full_acc_0") -> dict[str, Any]:
    """The large-data row against the best study arm (mean over its seeds): how much more
    data and compute it had, and what that bought on the same held-out batches. Returns
    numbers and `text`."""
    if scaling is None or not len(scaling) or not (scaling["kind"] == LARGE_KIND).any():
        return {"text": "No large-data row to compare."}
    big = scaling[scaling["kind"] == LARGE_KIND].iloc[0].to_dict()
    big = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in big.items()}
    cpu = scaling[scaling["kind"] == CPU_KIND]
    if not len(cpu) or cpu[metric].isna().all():
        return {"text": "No finished study runs to compare the large-data drafter with."}
    arms = cpu.groupby(["data_fraction", "weight_decay"])[metric]
    key = arms.mean().sort_values(ascending="loss" in metric).index[0]
    best = cpu[(cpu["data_fraction"] == key[0]) & (cpu["weight_decay"] == key[1])]

    def mean(col: str) -> float | None:
        v = best[col].dropna() if col in best else []
        return float(v.mean()) if len(v) else None

    n = {"data_ratio": big["train_tokens"] / mean("train_tokens"),
         "compute_ratio": (big["tokens_processed"] / mean("tokens_processed")
                           if big["tokens_processed"] else None),
         "large": float(big[metric]), "arm": mean(metric),
         "large_sim_accept_len": float(big["eval_sim_accept_len"]),
         "arm_sim_accept_len": mean("eval_sim_accept_len"),
         "large_accept_len": big.get("accept_len"), "arm_accept_len": mean("accept_len"),
         "arm_label": f"data fraction {key[0]:g}, weight decay {key[1]:g}",
         "spread": float(arms.agg(lambda v: v.max() - v.min()).max()),
         "seeds": int(arms.count().min())}
    n["gap"] = n["large"] - n["arm"]
    what = "position-0 accuracy" if metric == "eval_full_acc_0" else metric
    ttt = sum(c.startswith("eval_full_acc_") and big[c] is not None for c in big)
    text = (f"With {n['data_ratio']:,.0f}x the training data ({big['train_tokens']:,.0f} vs "
            f"{mean('train_tokens'):,.0f} tokens per pass, "
            f"{math.log10(n['data_ratio']):.1f} orders of magnitude)")
    if n["compute_ratio"]:
        text += (f" and {n['compute_ratio']:,.0f}x the compute ({big['tokens_processed']:,.0f} "
                 f"vs {mean('tokens_processed'):,.0f} tokens processed)")
    text += (f", {big['run']} reaches {what} {n['large']:.3f} on the same held-out shards vs "
             f"{n['arm']:.3f} for the best study arm ({n['arm_label']}, mean of {len(best)} "
             f"run(s)), and a teacher-forced accept length of {n['large_sim_accept_len']:.2f} "
             f"vs {n['arm_sim_accept_len']:.2f} ({ttt} TTT positions). ")
    if n["large_accept_len"] is not None and n["arm_accept_len"] is not None:
        text += (f"Measured accept length (offline greedy decoding): "
                 f"{n['large_accept_len']:.2f} vs {n['arm_accept_len']:.2f}. ")
    if n["seeds"] >= 2:
        text += (f"The gap ({n['gap']:+.3f}) is "
                 + (f"{abs(n['gap']) / n['spread']:.1f}x" if abs(n["gap"]) > n["spread"]
                    else "within") + f" the largest seed-to-seed range of the study arms "
                 f"({n['spread']:.3f}). ")
    recipe = [f"trained with TTT {big['ttt_steps_trained']:.0f}"] \
        if big.get("ttt_steps_trained") else []
    if big.get("draft_vocab_coverage") is not None and mean("draft_vocab_coverage") is not None:
        recipe.append(f"its own draft vocab holds {big['draft_vocab_coverage']:.1%} of these "
                      f"eval tokens vs {mean('draft_vocab_coverage'):.1%} for the study's")
    text += ("This is NOT an equal-compute comparison (the verdict above is): the large-data "
             "drafter also had more compute and its own recipe"
             + (f" ({'; '.join(recipe)})" if recipe else "")
             + ", so it shows what far more data buys, not which arm wins at a fixed budget.")
    return {"text": text, "metric": metric, **n}


@dataclasses.dataclass
class LargeDataArm:
    """The large-data section of the study: the drafter evaluated, its row and the
    data-scaling table, or why the section was skipped."""

    label: str
    path: str | None = None  # the drafter (None: none was chosen)
    row: dict[str, Any] | None = None  # large_data_row (None: skipped)
    scaling: Any = None  # data_scaling_table (None: skipped)
    skip: str | None = None  # why it was skipped

    def describe(self) -> str:
        """What was evaluated (training data and compute, TTT depths), or why not."""
        if self.skip:
            return f"Large-data arm skipped: {self.skip}"
        r = self.row
        return (f"{self.label}: {self.path}, trained on {r['train_samples']:,} conversations "
                f"({r['train_tokens']:,} tokens per pass) for {r['tokens_processed'] or 0:,} "
                f"tokens with TTT {r['ttt_steps_trained']}; evaluated here at TTT "
                f"{r['eval_ttt_steps']} on the study's held-out batches.")

    def verdict(self) -> dict[str, Any]:
        """`large_data_verdict` of the scaling table, or the reason it was skipped."""
        if self.scaling is None:
            return {"text": f"Skipped: {self.skip}"}
        return large_data_verdict(self.scaling)

    def summary_numbers(self) -> dict[str, Any]:
        """The large-data arm's key numbers for the batch report (None where skipped)."""
        lv, r = self.verdict(), self.row
        return {
            "large_data_drafter": self.path if r else None, "large_data_verdict": lv["text"],
            "large_data_full_acc_0": lv.get("large"), "best_arm_full_acc_0": lv.get("arm"),
            "large_data_sim_accept_len": lv.get("large_sim_accept_len"),
            "best_arm_sim_accept_len": lv.get("arm_sim_accept_len"),
            "large_data_accept_len": lv.get("large_accept_len"),
            "large_data_train_tokens": r["train_tokens"] if r else None,
            "large_data_tokens_processed": r["tokens_processed"] if r else None,
            "large_data_ratio": lv.get("data_ratio"),
            "large_compute_ratio": lv.get("compute_ratio"),
        }


def large_data_arm(large_data_drafter: str = "", *, study_dir: str | os.PathLike, table,
                   data: str | os.PathLike, label: str = "large-data (GPU)",
                   device: str = "auto",
                   acceptance: Callable[..., float] | None = None) -> LargeDataArm:
    """Evaluate `large_data_drafter` ("": the shipped default drafter; "none": skip) next
    to the study's runs (`table` from `compare_at_equal_compute`), unless the checkpoint
    doctor finds it does not fit the target the shards in `data` came from: then the arm
    is skipped and `skip` names the misfit (e.g. demo shards from a tiny test target,
    hidden 64, vs the shipped drafter's 576)."""
    if large_data_drafter == "none":
        return LargeDataArm(label, skip="large_data_drafter is 'none'")
    path = large_data_drafter or default_drafter()
    if path is None:
        return LargeDataArm(label, skip="no shipped drafter was found for the default target")
    if misfit := drafter_misfit(path, data=data):
        return LargeDataArm(label, path, skip=f"{path} does not fit the target these shards "
                            "were extracted from: " + " ".join(misfit))
    row = large_data_row(path, study_dir, label=label, device=device, acceptance=acceptance)
    return LargeDataArm(label, path, row, data_scaling_table(study_dir, table, row))
