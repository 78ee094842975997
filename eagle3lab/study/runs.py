"""A training run of any of the three trainers as one value: its curves (the metrics frame
of `load_metrics`), its checkpoints (one table whatever the layout) and the plateau of
each curve, so notebook 02 and the study overlay eagle3lab, SpecForge and speculators runs
in one schema.

Prevents reading another trainer's run by hand and getting it subtly wrong: a speculators
checkpoint's epoch number read as a step (its training_state.json gives the global step),
a SpecForge step checkpoint taken for a servable drafter (it is a pickled training state:
`servable` is False and the note says to export it), and a plateau judged on a curve the
run does not log (each run's plateau is judged on its own logged points, on the step axis
that every trainer logs; `tokens` only where the log has token counts).

Checkpoint layouts: eagle3lab RUN/checkpoints/step-N/ (+ checkpoint.json) and RUN/final/
(train/checkpoints.py); speculators SAVE/<epoch>/ and SpecForge OUT/{run_id}-step{N}/
(formats/locate.py, which cites the tools' sources).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from eagle3lab.formats.locate import FoundCheckpoint, specforge_steps, speculators_epochs
from eagle3lab.study.importers import load_metrics
from eagle3lab.study.plateau import Plateau, detect_plateau
from eagle3lab.workdir import LEFT_OUT

CHECKPOINT_COLUMNS = ["run", "source", "step", "epoch", "tokens", "complete", "servable",
                      "best", "latest", "path", "note"]
#: Metrics judged by `plateau_table` when present (eval first: the decision curves).
PLATEAU_METRICS = ("eval_loss_0", "eval_loss_mean", "eval_full_acc_0", "eval_sim_accept_len",
                   "train_loss_0")


def _eagle3lab_checkpoints(run_dir: Path) -> list[FoundCheckpoint]:
    found = []
    for d in (run_dir / "checkpoints").glob("step-*"):
        rec = {}
        try:
            rec = json.loads((d / "checkpoint.json").read_text())
        except (OSError, ValueError):
            pass
        slim = (d / LEFT_OUT).is_file()  # carried without the target's embedding, a head
        found.append(FoundCheckpoint(
            path=d, step=rec.get("step", int(d.name.split("-")[1])), epoch=rec.get("epoch"),
            complete=(d / "trainer_state.pt").is_file(),
            servable=(d / "config.json").is_file() and not slim,
            best=False, latest=False, record={"tokens": rec.get("tokens")},
            note=f"carried without its frozen tensors ({LEFT_OUT}): it resumes; decode a "
                 "later checkpoint" if slim else ""))
    found.sort(key=lambda c: c.step)
    if found:
        found[-1] = dataclasses.replace(found[-1], latest=True)
    final = run_dir / "final"
    if (final / "config.json").is_file():
        info = {}
        try:
            info = json.loads((final / "eagle3lab.json").read_text())
        except (OSError, ValueError):
            pass
        found.append(FoundCheckpoint(path=final, step=info.get("step"), epoch=None,
                                     complete=True, servable=True, best=False, latest=False,
                                     note="final drafter"))
    return found


def checkpoint_source(path: str | os.PathLike) -> str | None:
    """'eagle3lab', 'speculators' or 'specforge' from a directory's checkpoint layout."""
    p = Path(path)
    if (p / "checkpoints").is_dir() or (p / "run.json").is_file():
        return "eagle3lab"
    if specforge_steps(p):
        return "specforge"
    if speculators_epochs(p):
        return "speculators"
    return None


def list_checkpoints(path: str | os.PathLike, *, source: str | None = None,
                     run: str | None = None):
    """The checkpoints of a run directory (eagle3lab run dir, speculators save_path,
    SpecForge output dir) as a DataFrame with CHECKPOINT_COLUMNS, oldest first; empty when
    the directory holds none. `source`: the layout (default: detected)."""
    import pandas as pd

    p = Path(path)
    source = source or checkpoint_source(p)
    lister = {"eagle3lab": _eagle3lab_checkpoints, "speculators": speculators_epochs,
              "specforge": specforge_steps}.get(source or "")
    rows = [{"run": run or p.name, "source": source, "step": c.step, "epoch": c.epoch,
             "tokens": c.record.get("tokens"), "complete": c.complete,
             "servable": c.servable, "best": c.best, "latest": c.latest, "path": str(c.path),
             "note": c.note} for c in (lister(p) if lister else [])]
    return pd.DataFrame(rows, columns=CHECKPOINT_COLUMNS)


@dataclasses.dataclass
class Run:
    """One run: `metrics` (load_metrics' frame), `checkpoints` (list_checkpoints' table)."""
    name: str
    source: str
    metrics: Any
    checkpoints: Any

    def plateau(self, metric: str, *, x: str = "step", window: int = 3,
                threshold: float = 0.01) -> Plateau | None:
        """The plateau of `metric` (None: this run does not log it)."""
        df = self.metrics
        if metric not in df.columns or not df[metric].notna().any():
            return None
        if x not in df.columns or not df[x].notna().any():
            x = "step"
        return detect_plateau(df, metric, x=x, window=window, threshold=threshold)


def load_run(logs: str | os.PathLike, *, checkpoints: str | os.PathLike | None = None,
             name: str | None = None, trainer: str | None = None, decay: float = 1.0,
             tokens_per_step: float | None = None, run: str | None = None) -> Run:
    """A run from its logs (anything `load_metrics` reads) and its checkpoint directory
    (default: the logs' directory or its parent, where one holds checkpoints: an
    eagle3lab run dir holds both, SpecForge writes its event files to OUT/runs beside its
    step checkpoints; speculators writes them to --log-dir and --save-path)."""
    df = load_metrics(logs, name=name, trainer=trainer, decay=decay,
                      tokens_per_step=tokens_per_step, run=run)
    if checkpoints is None:  # the logs' directory, else its parent (SpecForge: OUT/runs)
        here = Path(logs) if Path(logs).is_dir() else Path(logs).parent
        checkpoints = next((d for d in (here, here.parent) if checkpoint_source(d)), here)
    ck = list_checkpoints(checkpoints, run=df.attrs["run"])
    return Run(name=df.attrs["run"], source=df.attrs["source"], metrics=df, checkpoints=ck)


def plateau_table(runs: list[Run], *, metrics=PLATEAU_METRICS, x: str = "step",
                  window: int = 3, threshold: float = 0.01):
    """One row per (run, metric) the run logs: plateaued or not, where, at what level, and
    the checkpoint nearest after the plateau start (the one to keep)."""
    import pandas as pd

    rows = []
    for r in runs:
        for m in metrics:
            p = r.plateau(m, x=x, window=window, threshold=threshold)
            if p is None:
                continue
            keep = None
            if p.plateaued and len(r.checkpoints) and p.x == "step":
                after = r.checkpoints[r.checkpoints["step"].notna()
                                      & (r.checkpoints["step"] >= p.start)]
                keep = after.iloc[0]["path"] if len(after) else None
            rows.append({"run": r.name, "source": r.source, "metric": m, "x": p.x,
                         "plateaued": p.plateaued, "start": p.start, "level": p.level,
                         "last_improvement": p.last_improvement,
                         "checkpoint_at_plateau": keep})
    return pd.DataFrame(rows)


def combine_checkpoints(runs: list[Run]):
    """All runs' checkpoint tables as one."""
    import pandas as pd

    parts = [r.checkpoints for r in runs if len(r.checkpoints)]
    return (pd.concat(parts, ignore_index=True) if parts
            else pd.DataFrame(columns=CHECKPOINT_COLUMNS))
