"""The grokking-vs-more-data study: at EQUAL compute, does training much longer on a
fraction of the data beat training on all of it?

Prevents the usual confound of such comparisons: arms that processed different numbers
of tokens. Every run processes exactly the same token budget (`budget_epochs` passes over
the FULL training set, optionally times each of `epoch_multipliers`): a run on fraction f
makes budget/f passes over its subset. Each run evaluates on the same held-out batches at
every budget level, and the verdict compares arms at one level against the seed-to-seed
spread (at least two seeds), so a difference inside the noise is called a tie.

Layout: STUDY_DIR/study.json (config + plan), STUDY_DIR/runs/frac{f}-wd{wd}-seed{s}/
(ordinary training runs; finished ones are skipped, interrupted ones resumed).
`demo_data` makes tiny synthetic shards so the notebooks run standalone.

The large-data arm (a drafter trained on far more data, evaluated on the study's own
held-out batches) lives in eagle3lab.study.scaling.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar

from pydantic import Field

from eagle3lab.config import DEFAULT_TARGET, StrictConfig
from eagle3lab.data.extract import extract
from eagle3lab.data.foreign import open_shards
from eagle3lab.data.prompts import Prompt, chat_prompt_ids, conversation_record
from eagle3lab.data.vocab import build_shard_vocab
from eagle3lab.errors import UserError
from eagle3lab.fsutil import atomic_write_json
from eagle3lab.specdec.accept import measure_acceptance
from eagle3lab.train import TrainConfig, is_finished, read_run, split_samples, train
from eagle3lab.train.config import check_train_overrides
from eagle3lab.train.counts import read_metrics
from eagle3lab.workdir import WorkDir


#: TrainConfig fields each run of the study gets from the study itself.
_SET_BY_STUDY = {"data", "eval_data", "out", "data_fraction", "weight_decay", "seed", "epochs",
                 "max_tokens", "max_steps", "eval_at_tokens", "resume"}


class StudyConfig(StrictConfig):
    WHERE: ClassVar[str] = "study config"

    data: str = Field(description="train shards (with a vocab map)")
    out: str = Field(description="study directory")
    eval_data: str | None = Field(None, description="held-out shards (recommended: the "
                                  "held-out prompts)")
    data_fractions: list[Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=lambda: [1.0, 0.25], min_length=1,
        description="one arm per fraction of the train set, each in (0, 1]")
    weight_decays: list[float] = Field(default_factory=lambda: [0.01],
                                       description="one arm per weight decay")
    seeds: list[int] = Field(default_factory=lambda: [0, 1], min_length=1,
                             description="runs per arm (at least two to measure the spread)")
    budget_epochs: float = Field(2.0, gt=0, description="compute budget: passes over the FULL "
                                 "train set per run")
    epoch_multipliers: list[Annotated[float, Field(gt=0)]] = Field(
        default_factory=lambda: [0.5, 1.0], min_length=1,
        description="compute levels compared, as multiples of budget_epochs")
    train: dict = Field(default_factory=dict, description="TrainConfig overrides, all runs")

    def check(self, where: str) -> None:
        check_train_overrides(self.train, where, reserved=_SET_BY_STUDY,
                              set_by="the study itself")


def full_epoch_tokens(data: str, max_tokens_per_batch: int = 2048,
                      eval_fraction: float | None = None) -> int:
    """Tokens one pass over the full training set processes (what the budget counts)."""
    s = open_shards(data)
    idx, _ = split_samples(len(s), eval_fraction=eval_fraction, data_fraction=1.0, data_seed=0)
    lengths = s.lengths()
    return sum(max(min(lengths[i], max_tokens_per_batch) - 1, 0) for i in idx)


def plan_study(cfg: StudyConfig) -> list[dict[str, Any]]:
    """One entry per run: name, run dir, arm and the train() keyword arguments."""
    base = {**TrainConfig.defaults(), **cfg.train}
    ev_frac = None if cfg.eval_data else base["eval_fraction"]
    budget = cfg.budget_epochs * full_epoch_tokens(cfg.data, base["max_tokens_per_batch"],
                                                  ev_frac)
    levels = sorted({int(round(budget * m)) for m in cfg.epoch_multipliers})
    runs = []
    for f, wd, seed in itertools.product(cfg.data_fractions, cfg.weight_decays, cfg.seeds):
        name = f"frac{f:g}-wd{wd:g}-seed{seed}"
        kwargs = {**cfg.train, "data": cfg.data, "eval_data": cfg.eval_data,
                  "out": str(Path(cfg.out) / "runs" / name), "data_fraction": f,
                  "weight_decay": wd, "seed": seed, "data_seed": seed if cfg.eval_data else 0,
                  "epochs": math.ceil(1.25 * levels[-1] / (budget / cfg.budget_epochs) / f) + 1,
                  "max_tokens": levels[-1], "eval_at_tokens": levels}
        runs.append({"name": name, "run_dir": kwargs["out"], "data_fraction": f,
                     "weight_decay": wd, "seed": seed, "kwargs": kwargs})
    return runs


def run_study(cfg: StudyConfig | None = None, *, progress: bool = True,
              **kwargs) -> dict[str, Any]:
    """Run every planned run that is not finished (resuming interrupted ones) through the
    library's `train`. Returns {name: status}. Keyword form: run_study(data=..., out=...)."""
    cfg = cfg or StudyConfig.from_dict(kwargs)
    plan = plan_study(cfg)
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(cfg.out) / "study.json", {
        "format": "eagle3lab-study", "version": 1, "config": cfg.model_dump(),
        "runs": [{k: v for k, v in r.items() if k != "kwargs"} for r in plan],
        "budget_tokens_levels": plan[0]["kwargs"]["eval_at_tokens"]})
    status = {}
    for i, r in enumerate(plan, 1):
        d = Path(r["run_dir"])
        if is_finished(d):
            status[r["name"]] = "done (skipped: already finished)"
            continue
        prev = read_run(d)["status"] if (d / "run.json").exists() else None
        if prev == "failed":
            status[r["name"]] = f"failed earlier: {read_run(d).get('error', '')[:200]}"
            continue
        print(f"study: run {i}/{len(plan)} {r['name']}"
              + (" (resuming)" if prev else ""))
        try:
            train(**{**r["kwargs"], "resume": prev is not None, "progress": progress})
            status[r["name"]] = "done"
        except UserError as e:
            status[r["name"]] = f"failed: {e}"
    return status


def compare_at_equal_compute(study_dir: str | os.PathLike, *,
                             acceptance: Callable[[Path], float] | None = None):
    """One row per (run, compute level): the run's eval metrics at the first evaluation
    that reached the level's token count. acceptance(final_dir) -> accept length adds a
    measured `accept_len` column (e.g. the offline acceptance module, once it exists)."""
    import pandas as pd

    study = json.loads((Path(study_dir) / "study.json").read_text())
    levels = study["budget_tokens_levels"]
    cfg = study["config"]
    rows = []
    for r in study["runs"]:
        d = Path(r["run_dir"])
        if not (d / "metrics.jsonl").exists():
            continue
        info = read_run(d)
        df = read_metrics(d)
        ev = df[df["eval_loss_0"].notna()] if "eval_loss_0" in df else df.iloc[0:0]
        subset_tokens = info["data"]["tokens_per_epoch"]
        for m, level in zip(sorted(set(cfg["epoch_multipliers"])), levels):
            hit = ev[ev["tokens"] >= level]
            if hit.empty:
                continue
            row = hit.iloc[0]
            out = {"run": r["name"], "data_fraction": r["data_fraction"],
                   "weight_decay": r["weight_decay"], "seed": r["seed"],
                   "multiplier": m, "budget_tokens": level, "tokens": int(row["tokens"]),
                   "steps": int(row["step"]), "train_samples": info["data"]["train_samples"],
                   "train_tokens": subset_tokens,
                   "epochs_over_subset": row["tokens"] / subset_tokens,
                   "status": info["status"]}
            out.update({c: row[c] for c in ev.columns if c.startswith("eval_")})
            if acceptance is not None and info["status"] == "done" and m == max(
                    cfg["epoch_multipliers"]):
                out["accept_len"] = acceptance(d / "final")
            rows.append(out)
    return pd.DataFrame(rows)


def offline_acceptance(*, prompts: str = "eval", limit: int = 8, max_new_tokens: int = 64,
                       steps: int = 3, device: str = "auto") -> Callable[[Path], float]:
    """For `compare_at_equal_compute(acceptance=...)`: the accept length tau (bonus token
    included) of a run's final drafter, measured by eagle3lab.specdec.accept (greedy decoding of
    held-out prompts, plain vs speculative, against the target the shards came from)."""
    def measure(final_dir: Path, target: str | None = None) -> float:
        """target: where the target is now (default: the path the drafter recorded)."""
        info = json.loads((Path(final_dir) / "eagle3lab.json").read_text())
        r = measure_acceptance(target=target or info["data"]["train"]["target"]["path"],
                               draft=str(final_dir), prompts=prompts, limit=limit,
                               max_new_tokens=max_new_tokens, steps=steps, device=device,
                               progress=False)
        return float(r["arms"][0]["stats"]["tau"])

    return measure


def verdict(table, *, metric: str = "eval_loss_mean", level: float | None = None) -> dict:
    """Which arm won at one compute level (default: the largest), by how much, and
    whether the gap exceeds the seed-to-seed spread. Returns numbers and `text`."""
    if table is None or len(table) == 0:
        return {"text": "No finished evaluations to compare yet."}
    lower_better = not ("acc" in metric or "accept" in metric)
    level = level if level is not None else table["multiplier"].max()
    t = table[table["multiplier"] == level]
    arms = t.groupby(["data_fraction", "weight_decay"])[metric].agg(["mean", "min", "max",
                                                                     "count"])
    arms = arms.sort_values("mean", ascending=lower_better)
    if len(arms) < 2:
        return {"text": "Only one arm finished; nothing to compare.", "arms": arms}
    top_frac = t["data_fraction"].max()
    more = arms[arms.index.get_level_values(0) == top_frac].iloc[:1]
    less = arms[arms.index.get_level_values(0) < top_frac].iloc[:1]
    pair = [more, less] if len(less) else [arms.iloc[:1], arms.iloc[1:2]]
    best, other = sorted(pair, key=lambda a: a["mean"].iloc[0] * (1 if lower_better else -1))
    gap = float(abs(best["mean"].iloc[0] - other["mean"].iloc[0]))
    rel = float(gap / max(abs(other["mean"].iloc[0]), 1e-12))
    seeds = int(min(best["count"].iloc[0], other["count"].iloc[0]))
    spread = float(max((best["max"] - best["min"]).iloc[0], (other["max"] - other["min"]).iloc[0]))

    def label(a) -> str:
        f, wd = a.index[0]
        if not len(less):  # one fraction: a weight-decay comparison
            return f"weight decay {wd:g} (data fraction {f:g})"
        kind = "more data" if f == top_frac else "longer training on less data"
        return f"{kind} (data fraction {f:g}, weight decay {wd:g})"

    tokens = int(t["budget_tokens"].iloc[0])
    better = "lower" if lower_better else "higher"
    steps = t.groupby(["data_fraction", "weight_decay"])["steps"].mean() \
        if "steps" in t.columns else None
    text = (f"At equal compute ({tokens:,} tokens per run, {level:g}x the budget), "
            f"{label(best)} won on {metric}: {best['mean'].iloc[0]:.4g} vs "
            f"{other['mean'].iloc[0]:.4g} for {label(other)} ({rel:.1%} {better}). ")
    if steps is not None:
        sb, so = steps[best.index[0]], steps[other.index[0]]
        if abs(sb - so) > 0.1 * max(sb, so):
            text += (f"Note: equal tokens took {sb:.0f} vs {so:.0f} optimizer steps (the "
                     f"last batch of each epoch is partial), which favours the arm with more. ")
    if seeds < 2:
        text += "Only one seed per arm finished, so the seed-to-seed spread is unknown: " \
                "run at least two seeds before trusting this."
        decisive = None
    else:
        decisive = bool(gap > spread)
        text += (f"The gap ({gap:.3g}) is {'larger' if decisive else 'not larger'} than the "
                 f"seed-to-seed spread (largest range over {seeds} seeds: {spread:.3g}), so "
                 + ("the difference is beyond seed noise." if decisive else
                    "this is a tie within seed noise."))
    return {"text": text, "winner": tuple(float(v) for v in best.index[0]), "gap": gap,
            "relative_gap": rel,
            "spread": spread, "seeds": seeds, "decisive": decisive, "arms": arms,
            "metric": metric, "level": level}


def verdict_report(table, *, metric: str = "eval_loss_mean") -> str:
    """The study's verdicts as text: on `metric` at the largest compute level, then at each
    smaller one, on position-0 accuracy, and on the measured accept length when the table
    has it."""
    parts = [verdict(table, metric=metric)["text"]]
    levels = sorted(table["multiplier"].unique()) if len(table) else []
    parts += [f"At {m:g}x the budget: " + verdict(table, metric=metric, level=m)["text"]
              for m in levels[:-1]]
    parts.append("On position-0 accuracy: " + verdict(table, metric="eval_full_acc_0")["text"])
    if "accept_len" in table.columns:
        parts.append("On measured accept length: " + verdict(table, metric="accept_len")["text"])
    return "\n\n".join(parts)


def summary_numbers(table, *, metric: str = "eval_loss_mean", tokens_per_run: int,
                    large=None) -> dict[str, Any]:
    """The study notebook's key numbers for the batch report: the verdict on `metric` at
    the largest compute level (text, winning arm, decisive or not, gap, seed spread), the
    runs compared, the tokens each processed, and with `large` (a
    `scaling.LargeDataArm`) the large-data arm's numbers."""
    v = verdict(table, metric=metric)
    w = v.get("winner")
    return {
        "verdict": v["text"],
        "winning_arm": f"data fraction {w[0]:g}, weight decay {w[1]:g}" if w else None,
        "decisive": v.get("decisive"), "metric": metric, "gap": v.get("gap"),
        "seed_spread": v.get("spread"),
        "runs": int(table["run"].nunique()) if len(table) else 0,
        "tokens_per_run": tokens_per_run,
        **(large.summary_numbers() if large is not None else {}),
    }


def demo_data(out: str | os.PathLike, *, target: str | None = None, n_train: int = 48,
              n_eval: int = 12, draft_vocab_size: int = 256, seed: int = 0) -> dict[str, str]:
    """Tiny synthetic train/eval shards (random-word conversations through `target`,
    default: the embedded default target) so notebooks run standalone. Reuses them if
    already made. Returns {"train": dir, "eval": dir}."""
    import random

    # lazy: a test patches eagle3lab.targets.adapter.load_target
    from eagle3lab.targets.adapter import load_target

    wd = WorkDir(Path(out))
    dirs = {"train": wd.shards_train, "eval": wd.shards_eval}
    if all((d / "manifest.json").exists() for d in dirs.values()) and wd.vocab_map.exists():
        return {k: str(v) for k, v in dirs.items()}
    tgt = load_target(target or DEFAULT_TARGET, device="cpu")
    tok = tgt.tokenizer
    words = "the a model token draft layer state speed test data run fast slow good".split()
    for split, n, s in (("train", n_train, seed), ("eval", n_eval, seed + 1000)):
        rng = random.Random(s)
        path = wd.responses(split)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            for i in range(n):
                p = Prompt(f"{split}{i}", " ".join(rng.choice(words)
                                                   for _ in range(rng.randint(3, 12))))
                answer = " ".join(rng.choice(words) for _ in range(rng.randint(5, 40)))
                resp = tok(answer).input_ids + [tok.eos_token_id]
                f.write(json.dumps(conversation_record(
                    p, chat_prompt_ids(tok, p.prompt), resp, answer, "stop", None)) + "\n")
        extract(conversations=path, out=dirs[split], target=tgt, progress=False)
    build_shard_vocab(data=dirs["train"], draft_vocab_size=draft_vocab_size)
    return {k: str(v) for k, v in dirs.items()}
