"""Which shards the grokking-vs-data study (notebook 06) runs on, and where its runs go:
the shards given, else the default pipeline's, else tiny synthetic demo shards.

Prevents two silent mix-ups: a study that falls back to demo data without saying so (a
note names the reason when demo data was not asked for), and held-out shards from one
source scored against train shards of another (the default held-out shards are used only
when the train shards are the default ones too; given train shards without `eval_data`
hold out part of themselves). Demo shards and their study go to a fresh temporary
directory, never over a real study.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Callable

#: The study's directory name inside a work dir (eagle3lab.workdir.WorkDir.study).
STUDY_NAME = "grokking-vs-data"


@dataclasses.dataclass(frozen=True)
class StudyData:
    train: str  # train shards (with a vocab map)
    eval: str | None  # held-out shards (None: hold out part of the train shards)
    out: str  # the study directory
    demo: bool  # True: tiny synthetic shards made for this run


def study_data(*, train_data: str = "", eval_data: str = "", study_dir: str = "",
               demo: bool = False, demo_target: str = "",
               runs: str | os.PathLike | None = None,
               log: Callable[[str], None] = print) -> StudyData:
    """The notebook's data choice. `demo`, or no `train_data` while the default shards
    (RUNS/default/shards/train) do not exist: demo shards through `demo_target` (default:
    the default target) in a temporary directory, the study beside them unless
    `study_dir` is given. Otherwise `train_data` (default: the default train shards),
    `eval_data` (default: the default held-out shards, only with the default train
    shards) and `study_dir` (default: RUNS/default/studies/grokking-vs-data). `runs`:
    the runs directory (default: eagle3lab.config.runs_dir())."""
    from eagle3lab.workdir import WorkDir

    work = WorkDir(Path(runs) / "default") if runs is not None else WorkDir.default()
    if demo or (not train_data and not (work.shards_train / "manifest.json").exists()):
        from eagle3lab.study.sweep import demo_data

        if not demo:
            log("No default shards yet (run `eagle3lab demo`); using tiny synthetic demo data.")
        tmp = Path(tempfile.mkdtemp(prefix="eagle3lab-06-"))
        d = demo_data(tmp / "data", target=demo_target or None)
        return StudyData(train=d["train"], eval=d["eval"], out=study_dir or str(tmp / "study"),
                         demo=True)
    return StudyData(train=train_data or str(work.shards_train),
                     eval=eval_data or (str(work.shards_eval) if not train_data else None),
                     out=study_dir or str(work.study(STUDY_NAME)), demo=False)
