"""eagle3lab.study.runs: SpecForge, speculators and eagle3lab runs (curves + checkpoints) in
one schema, with a plateau judged on each; SpecForge's eval/simulated_acc_len; speculators'
trackio logs.

Event files come from real writers (torch's SummaryWriter as SpecForge's tracker calls it,
speculators' own TensorBoardHandler); speculators' checkpoints from its own
SingleGPUCheckpointer; SpecForge's step checkpoints and trackio's database as those tools
write them (the files cited in specforge_writers.py and in read_trackio's docstring)."""

from __future__ import annotations

import json
import logging
import sqlite3
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

from eagle3lab.errors import UserError
from eagle3lab.study.importers import load_metrics, read_tfevents
from eagle3lab.study.runs import (checkpoint_source, combine_checkpoints, list_checkpoints,
                                  load_run, plateau_table)

sys.path.insert(0, str(Path(__file__).parents[1] / "formats"))
from specforge_writers import step_checkpoint  # noqa: E402
from test_foreign_checkpoints import save_speculators_epochs  # noqa: E402
from test_importers import write_specforge_log, write_speculators_log  # noqa: E402


def _specforge_eval(step: int, acc: list[float]) -> tuple[int, dict]:
    """SpecForge's Evaluator.evaluate with per-position counts, through the tracker logger
    (scalar_metrics expands the list to eval/per_position_acc/i)."""
    sim, cum = 0.0, 1.0
    for a in acc:  # Evaluator._simulated_acc_len
        cum *= a
        sim += cum
    return step, {"eval/avg_loss": 2.0, "eval/avg_acc": acc[0],
                  **{f"eval/per_position_acc/{i}": a for i, a in enumerate(acc)},
                  "eval/simulated_acc_len": sim,
                  **{f"eval/ploss_{i}": 3.0 - 0.01 * step for i in range(len(acc))}}


def make_specforge_run(out: Path) -> Path:
    """A SpecForge output dir: OUT/runs event files and OUT/{run_id}-step{N}/ checkpoints
    (the last one latest, step 40 the best), as `specforge train` leaves it."""
    logs = [(s, {"train/ploss_0": 4.0 - s / 20, "train/acc_0": 0.1 + s / 200,
                 "train/lr": 1e-4}) for s in range(10, 101, 10)]
    logs += [_specforge_eval(s, [0.5, 0.4, 0.3] if s < 40 else [0.6, 0.5, 0.4])
             for s in (20, 40, 60, 80, 100)]
    write_specforge_log(out, logs)
    for s in (40, 80, 100):
        step_checkpoint(out, "run1", s, {}, latest=s == 100,
                        best_score=1.0 if s == 40 else None)
    return out


@pytest.fixture(scope="module")
def specforge_run(tmp_path_factory):
    return make_specforge_run(tmp_path_factory.mktemp("sf") / "out")


def test_specforge_simulated_acc_len_gains_the_bonus_token(specforge_run):
    """SpecForge's simulated_acc_len counts accepted draft tokens (a0 + a0*a1 + ...); ours
    counts the bonus token too: imported as 1 + value, at the evaluations that log it."""
    df = load_metrics(specforge_run / "runs")
    ev = df[df["eval_full_acc_0"].notna()]
    assert ev["eval_sim_accept_len"].tolist() == pytest.approx(
        [1 + 0.5 + 0.2 + 0.06] + [1 + 0.6 + 0.3 + 0.12] * 4)
    assert df.loc[df["eval_full_acc_0"].isna(), "eval_sim_accept_len"].isna().all()
    # without per-position counts the evaluator logs its average accuracy under that tag:
    # not a length, left out
    write_specforge_log(specforge_run.parent / "flat", [(5, {"train/ploss_0": 1.0}),
                        (5, {"eval/avg_acc": 0.4, "eval/simulated_acc_len": 0.4})])
    flat = load_metrics(specforge_run.parent / "flat")
    assert flat["eval_sim_accept_len"].isna().all()


def test_specforge_run_in_one_schema(specforge_run):
    run = load_run(specforge_run / "runs", name="sf")  # checkpoints found beside runs/
    ck = run.checkpoints
    assert run.source == "specforge" and checkpoint_source(specforge_run) == "specforge"
    assert ck["step"].tolist() == [40, 80, 100]
    assert ck["best"].tolist() == [True, False, False]
    assert ck["latest"].tolist() == [False, False, True]
    assert not ck["servable"].any() and ck["note"].str.contains("specforge export").all()
    assert set(ck["run"]) == {"sf"}
    p = run.plateau("eval_sim_accept_len", window=2)
    assert p.plateaued and p.start == 40 and p.level == pytest.approx(2.02)
    row = plateau_table([run], window=2).set_index("metric").loc["eval_sim_accept_len"]
    assert row["checkpoint_at_plateau"].endswith("run1-step40")


@pytest.fixture(scope="module")
def speculators_run(tmp_path_factory):
    """`speculators train --logger tensorboard`: logs in LOG_DIR, epochs in SAVE_PATH."""
    from eagle3lab.formats.demo import make_speculators_draft, make_tiny_target

    root = tmp_path_factory.mktemp("spec-run")
    target = make_tiny_target(root / "target")
    spec = make_speculators_draft(root / "draft", target=target)
    write_speculators_log(root / "logs", steps=4)
    save = save_speculators_epochs(spec, root / "save", epochs=2, best=0, steps_per_epoch=2)
    return {"logs": root / "logs", "save": save}


def test_speculators_run_in_one_schema(speculators_run, trained_run, specforge_run):
    """Epochs become global steps (training_state.json), the best epoch is marked; the three
    trainers' runs combine into one checkpoint table and one plateau table."""
    spec = load_run(speculators_run["logs"], checkpoints=speculators_run["save"], decay=0.8)
    ck = spec.checkpoints
    assert ck[["epoch", "step", "best", "servable"]].values.tolist() == [
        [0, 2, True, True], [1, 4, False, True]]
    ours = load_run(trained_run)
    assert ours.source == "eagle3lab"
    assert ours.checkpoints["note"].tolist()[-1] == "final drafter"
    assert ours.checkpoints["servable"].all()
    sf = load_run(specforge_run / "runs", name="sf")
    table = combine_checkpoints([spec, ours, sf])
    assert set(table["source"]) == {"speculators", "eagle3lab", "specforge"}
    plateaus = plateau_table([spec, ours, sf], window=2)
    assert {"speculators", "eagle3lab", "specforge"} <= set(plateaus["source"])
    assert (plateaus["x"] == "step").all()


class _TrackioStore:
    """trackio's storage of `trackio.init(...).log(d, step)` (trackio/sqlite_storage.py,
    0.36 at 2a02752): TRACKIO_DIR/PROJECT.db, table `metrics`, the dict as JSON with
    non-finite floats spelled out (utils.serialize_values)."""

    def __init__(self, db: Path, name: str):
        self.db, self.name = db, name
        with sqlite3.connect(db) as con:
            con.execute("CREATE TABLE IF NOT EXISTS metrics (id INTEGER PRIMARY KEY "
                        "AUTOINCREMENT, run_id TEXT NOT NULL, timestamp TEXT NOT NULL, "
                        "run_name TEXT NOT NULL, step INTEGER NOT NULL, metrics TEXT NOT NULL)")

    def log(self, metrics: dict, step=None):
        import math

        vals = {k: ("NaN" if math.isnan(v) else "Infinity" if v == math.inf else v)
                if isinstance(v, float) else v for k, v in metrics.items()}
        with sqlite3.connect(self.db) as con:
            con.execute("INSERT INTO metrics (timestamp, run_id, run_name, step, metrics) "
                        "VALUES (?, ?, ?, ?, ?)", ("2026-01-01T00:00:00", self.name,
                                                   self.name, step, json.dumps(vals)))


def test_speculators_trackio_log(tmp_path, monkeypatch):
    """speculators' TrackioHandler (its real code) over trackio's storage: the same dicts
    as its TensorBoard log, read back from the database as the same frame."""
    from speculators.train.logger import TrackioHandler
    from speculators.train.utils import normalize_counted_metrics

    db = tmp_path / "trackio" / "speculators.db"
    db.parent.mkdir()
    fake = types.ModuleType("trackio")
    fake.init = lambda name, **kw: _TrackioStore(db, name)
    monkeypatch.setitem(sys.modules, "trackio", fake)
    write_speculators_log(tmp_path / "tb", steps=4)
    for name in ("run1", "run2"):
        handler = TrackioHandler(run_name=name)
        log = logging.Logger(f"speculators.metrics.trackio.{name}")
        log.addHandler(handler)
        for step in range(4):
            counts = {"loss_sum": 3.0, "loss_total": 1.0}
            for i in range(3):
                counts.update({f"loss_{i}_sum": (2.0 - 0.1 * step) * 0.8 ** i,
                               f"loss_{i}_total": 1.0, f"full_acc_{i}_sum": 5.0,
                               f"full_acc_{i}_total": 10.0, f"cond_acc_{i}_sum": 6.0,
                               f"cond_acc_{i}_total": 10.0})
            log.info({"train": normalize_counted_metrics(counts),
                      "profile": {"step_ms": 500.0, "tokens_per_s": 4000.0},
                      "epoch": 0, "lr": 1e-4, "global_step": step}, extra={"step": step})
        log.info({"val": {"loss_0_epoch": 1.5, "full_acc_0_epoch": 0.7, "loss_epoch": 4.0},
                  "epoch": 0}, extra={"step": 3})
    with pytest.raises(UserError, match="2 trackio runs"):
        load_metrics(db)
    got = load_metrics(db, run="run2", decay=0.8)
    want = load_metrics(tmp_path / "tb", decay=0.8)
    assert got.attrs == {"source": "speculators", "loss_kind": "kl", "run": "run2"}
    cols = sorted(c for c in want.columns if c != "wall_s")
    # the same values (TensorBoard stores float32, trackio's JSON float64)
    pd.testing.assert_frame_equal(got[cols], want[cols], check_dtype=False, rtol=1e-6)
    assert {t for _, t, _ in read_tfevents(tmp_path / "tb")} >= {"train/full_acc_0"}
    with pytest.raises(UserError, match="no trackio run 'run3'"):
        load_metrics(db, run="run3")
    (tmp_path / "junk.db").write_bytes(b"not sqlite" * 20)
    with pytest.raises(UserError, match="not a trackio project database"):
        load_metrics(tmp_path / "junk.db")


def test_empty_and_unknown_checkpoint_dirs(tmp_path):
    assert checkpoint_source(tmp_path) is None
    assert list_checkpoints(tmp_path).empty and list_checkpoints(tmp_path / "nope").empty
