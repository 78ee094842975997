"""eagle3lab.study.importers: the logs speculators and SpecForge write (TensorBoard event
files, MLflow dirs, JSONL exports) as eagle3lab's metrics DataFrame.

The event files are written by real writers: speculators' own TensorBoard log handler
(fed the dicts its trainer logs), and torch's SummaryWriter called as SpecForge's
TensorboardTracker calls it, with the tag names of SpecForge's training code."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from eagle3lab.errors import UserError
from eagle3lab.study.importers import combine, detect_trainer, load_metrics, read_tfevents


def _tear(path: Path) -> None:
    """A run killed mid-write: half a record header at the end of its newest event file."""
    f = sorted(path.rglob("events.out.tfevents.*"))[-1]
    f.write_bytes(f.read_bytes() + b"\x40\x00\x00\x00\x00")


# --- speculators ---------------------------------------------------------------------------
def _speculators_counts(step: int, i: int, decay: float) -> dict[str, float]:
    """One TTT position's counts as speculators' eagle3 metrics.py returns them: the loss
    already multiplied by decay**i, accuracies as (correct, total) pairs."""
    return {f"loss_{i}_sum": (2.0 - 0.1 * step) * decay ** i, f"loss_{i}_total": 1.0,
            f"full_acc_{i}_sum": 5.0, f"full_acc_{i}_total": 10.0,
            f"cond_acc_{i}_sum": 6.0, f"cond_acc_{i}_total": 10.0}


def write_speculators_log(log_dir: Path, *, steps: int = 4, decay: float = 0.8) -> None:
    """`speculators train --logger tensorboard`: the metric dicts its Trainer logs (train
    step: train/profile/epoch/lr/global_step; validation: val/*_epoch + epoch), through
    speculators' TensorBoardHandler (dicts flattened with '/', torch SummaryWriter)."""
    from speculators.train.logger import TensorBoardHandler
    from speculators.train.utils import normalize_counted_metrics

    handler = TensorBoardHandler(run_name="run1", log_dir=log_dir)
    log = logging.Logger("speculators.metrics.test")  # not registered: no global state
    log.addHandler(handler)
    for step in range(steps):
        counts = {"loss_sum": 3.0, "loss_total": 1.0}
        for i in range(3):
            counts.update(_speculators_counts(step, i, decay))
        log.info({"train": normalize_counted_metrics(counts),
                  "profile": {"step_ms": 500.0, "tokens_per_s": 4000.0, "fetch_frac": 0.1},
                  "epoch": 0, "lr": 1e-4, "global_step": step}, extra={"step": step})
    log.info({"val": {"loss_0_epoch": 1.5, "full_acc_0_epoch": 0.7, "loss_epoch": 4.0},
              "epoch": 0}, extra={"step": steps - 1})
    handler.close()


def test_speculators_tensorboard_log(tmp_path):
    """speculators' loss_i is multiplied by decay**i (undone with decay=), val metrics carry
    the _epoch suffix, tokens come from the profile (tokens_per_s x step_ms)."""
    write_speculators_log(tmp_path / "logs")
    _tear(tmp_path / "logs")
    tags = {t for _, t, _ in read_tfevents(tmp_path / "logs")}
    assert {"train/loss_2", "train/full_acc_0", "train/cond_acc_1", "train/loss", "lr",
            "epoch", "global_step", "profile/tokens_per_s", "val/loss_0_epoch"} <= tags
    df = load_metrics(tmp_path / "logs", decay=0.8)
    assert df.attrs == {"source": "speculators", "loss_kind": "kl", "run": "logs"}
    assert list(df["step"]) == [0, 1, 2, 3]
    assert df["train_loss_2"].tolist() == pytest.approx([2.0, 1.9, 1.8, 1.7])
    assert df["train_objective"].tolist() == pytest.approx([3.0] * 4)
    assert df["tokens"].tolist() == pytest.approx([2000, 4000, 6000, 8000])
    assert df.loc[3, "eval_loss_0"] == pytest.approx(1.5)
    assert df.loc[3, "eval_objective"] == pytest.approx(4.0)
    assert df["lr"].iloc[0] == pytest.approx(1e-4)
    assert df["train_sim_accept_len"].iloc[0] == pytest.approx(1 + 3 * 0.5)


# --- SpecForge -----------------------------------------------------------------------------
def write_specforge_log(output_dir: Path, logs: list[tuple[int, dict]], *,
                        new_style: bool = False) -> None:
    """SpecForge's TensorboardTracker: SummaryWriter(OUTPUT/runs), add_scalar per int/float
    value of each logged dict (new_style: the scalars plugin's tensor encoding, as TF2's
    tf.summary.scalar writes; same values)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(output_dir / "runs"))
    for step, log_dict in logs:
        for key, value in log_dict.items():
            if isinstance(value, (int, float)):
                writer.add_scalar(key, value, global_step=step, new_style=new_style)
    writer.close()


def _specforge_script_logs(eval_prefix: str) -> list[tuple[int, dict]]:
    """scripts/train_eagle3*.py: per step {train/lr, train/acc_i, train/ploss_i}; per eval
    {eval/<prefix>acc_i, eval/<prefix>ploss_i} (prefix "" in the 2026 script, "epoch_" in
    the 2025 offline/online scripts)."""
    logs = [(s, {"train/lr": 5e-5, **{f"train/acc_{i}": 0.1 * s for i in range(7)},
                 **{f"train/ploss_{i}": 5.0 - s + i for i in range(7)}}) for s in (1, 2, 3)]
    logs.append((3, {**{f"eval/{eval_prefix}acc_{i}": 0.25 for i in range(7)},
                     **{f"eval/{eval_prefix}ploss_{i}": 4.0 for i in range(7)}}))
    return logs


@pytest.mark.parametrize("eval_prefix,new_style", [("", False), ("epoch_", True)])
def test_specforge_tensorboard_log(tmp_path, eval_prefix, new_style):
    """ploss_i is a soft cross-entropy (not KL), acc_i is per position (not cumulative),
    and there are no token counts (tokens_per_step= gives them)."""
    write_specforge_log(tmp_path / "out", _specforge_script_logs(eval_prefix),
                        new_style=new_style)
    df = load_metrics(tmp_path / "out", tokens_per_step=8 * 2048, name="specforge-8gpu")
    assert df.attrs == {"source": "specforge", "loss_kind": "soft_ce", "run": "specforge-8gpu"}
    assert df["train_loss_6"].tolist() == pytest.approx([10.0, 9.0, 8.0])
    assert df["train_full_acc_0"].tolist() == pytest.approx([0.1, 0.2, 0.3])
    assert df["lr"].tolist() == pytest.approx([5e-5] * 3)
    assert df.loc[df["step"] == 3, "eval_loss_4"].item() == pytest.approx(4.0)
    assert df.loc[df["step"] == 3, "eval_full_acc_6"].item() == pytest.approx(0.25)
    assert df["tokens"].tolist() == [2 * 16384, 3 * 16384, 4 * 16384]
    assert "train_sim_accept_len" not in df.columns  # SpecForge acc_i is not cumulative


def test_specforge_unified_trainer_log(tmp_path):
    """SpecForge's unified trainer (specforge/training/): strategy metrics acc_i, ploss_i,
    acc, loss (+ lr, perf/*) get the train/ prefix; the evaluator's per-position accuracy
    list is expanded to eval/per_position_acc/i. The last record is torn."""
    train = [(s, {"train/acc_0": 0.5, "train/acc_1": 0.4, "train/ploss_0": 3.0 - s,
                  "train/ploss_1": 4.0 - s, "train/acc": 0.45, "train/loss": 6.2 - s,
                  "train/lr": 1e-4, "train/perf/optimizer_step_time_s": 0.5})
             for s in (10, 20)]
    ev = (20, {"eval/avg_loss": 2.5, "eval/avg_acc": 0.6, "eval/per_position_acc/0": 0.6,
               "eval/per_position_acc/1": 0.5, "eval/simulated_acc_len": 0.9,
               "eval/ploss_0": 2.0, "eval/ploss_1": 3.0})
    write_specforge_log(tmp_path / "out", train + [ev])
    _tear(tmp_path / "out")
    df = load_metrics(tmp_path / "out" / "runs")
    assert df.attrs["source"] == "specforge" and df.attrs["run"] == "runs"
    assert list(df["step"]) == [10, 20]
    assert df["train_objective"].tolist() == pytest.approx([-3.8, -13.8])
    assert df.loc[1, "eval_full_acc_1"] == pytest.approx(0.5)
    assert df.loc[1, "eval_loss_1"] == pytest.approx(3.0)
    assert df["tokens"].isna().all()  # no tokens_per_step given: unknown, not invented


def test_event_files_of_resumed_runs_are_read_in_order(tmp_path):
    """A run resumed into the same dir writes a second event file; a directory is searched
    recursively and its files are read in name (= start) order, so the later file wins."""
    import time

    write_specforge_log(tmp_path / "out", [(1, {"train/ploss_0": 9.0}), (2, {"train/ploss_0": 8.0})])
    time.sleep(1.1)  # event file names carry the start time in seconds
    write_specforge_log(tmp_path / "out", [(2, {"train/ploss_0": 7.0}), (3, {"train/ploss_0": 6.0})])
    assert len(list((tmp_path / "out").rglob("events.out.tfevents.*"))) == 2
    df = load_metrics(tmp_path / "out")
    assert df["train_loss_0"].tolist() == [9.0, 7.0, 6.0]


def test_summary_writer_works_without_torchvision():
    """torch's SummaryWriter (tensorboard) must not pull torchvision, which is never installed
    (the builds pip finds break `import transformers`)."""
    import importlib.util
    import sys

    import torch.utils.tensorboard  # noqa: F401

    assert importlib.util.find_spec("torchvision") is None
    assert not any(m.split(".")[0] == "torchvision" for m in sys.modules)


# --- MLflow, JSONL, eagle3lab, errors --------------------------------------------------------
def test_mlflow_and_jsonl_exports(tmp_path):
    run = tmp_path / "mlruns" / "0" / "abc"
    (run / "metrics" / "train").mkdir(parents=True)
    (run / "metrics" / "train" / "ploss_0").write_text("1700 3.5 1\n1701 3.0 2\n")
    (run / "metrics" / "train" / "acc_0").write_text("1700 0.2 1\n1701 0.3 2\n")
    df = load_metrics(run)
    assert df.attrs["source"] == "specforge" and df["train_loss_0"].tolist() == [3.5, 3.0]
    j = tmp_path / "history.jsonl"
    j.write_text("\n".join(json.dumps({"_step": s, "train/loss_0": 1.0 / s, "lr": 1e-3})
                           for s in (1, 2)) + "\n")
    df2 = load_metrics(j)
    assert df2.attrs["source"] == "speculators" and df2["train_loss_0"].tolist() == [1.0, 0.5]
    long = combine([df, df2])
    assert set(long["run"]) == {"abc", "history"} and set(long["loss_kind"]) == {"soft_ce",
                                                                                 "kl"}


def test_eagle3lab_runs_are_read_by_the_same_entry_point(trained_run):
    df = load_metrics(trained_run, name="mine")
    assert df.attrs == {"source": "eagle3lab", "loss_kind": "kl", "run": "mine"}
    assert "eval_sim_accept_len" in df.columns
    assert load_metrics(trained_run / "metrics.jsonl").attrs["run"] == trained_run.name


def test_unknown_logs_are_refused(tmp_path):
    with pytest.raises(UserError, match="Cannot tell which trainer"):
        detect_trainer(["loss", "accuracy"])
    (tmp_path / "x").mkdir()
    with pytest.raises(UserError, match="holds no metrics"):
        load_metrics(tmp_path / "x")
    with pytest.raises(UserError, match="does not exist"):
        load_metrics(tmp_path / "nope")
    junk = tmp_path / "junk" / "events.out.tfevents.1.host"
    junk.parent.mkdir()
    junk.write_bytes(b"not an event file at all")
    with pytest.raises(UserError, match="No scalars in the TensorBoard event files"):
        load_metrics(junk.parent)
