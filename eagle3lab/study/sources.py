"""Which shards the grokking-vs-data study (notebook 06) runs on, and where its runs go:
the shards given, else the default pipeline's, else tiny synthetic demo shards.

Prevents two silent mix-ups: a study that falls back to demo data without saying so (a
note names the reason when demo data was not asked for), and held-out shards from one
source scored against train shards of another (the default held-out shards are used only
when the train shards are the default ones too; given train shards without `eval_data`
hold out part of themselves). Demo shards and their study go to a fresh temporary
directory, never over a real study.

The shards may be another tool's hidden-state sets (`source="specforge"|"speculators"`,
eagle3lab/data/foreign/): opened once with their target (`data_target`, recorded beside
them) so a set from another target or without a vocab map is refused here, before any run
starts; the demo then writes its shards in that tool's layout and trains on those.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Callable

from eagle3lab.config import DEFAULT_TARGET
from eagle3lab.data.foreign import DATA_FORMATS, open_shards
from eagle3lab.data.foreign.write import write_as
from eagle3lab.data.shards import ShardSet
from eagle3lab.data.vocab import build_shard_vocab
from eagle3lab.errors import UserError
from eagle3lab.study.sweep import demo_data
from eagle3lab.targets.adapter import resolve_target_path
from eagle3lab.workdir import WorkDir

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
               runs: str | os.PathLike | None = None, source: str = "eagle3lab",
               data_target: str = "", log: Callable[[str], None] = print) -> StudyData:
    """The notebook's data choice. `demo`, or no `train_data` while the default shards
    (RUNS/default/shards/train) do not exist: demo shards through `demo_target` (default:
    the default target) in a temporary directory, the study beside them unless
    `study_dir` is given. Otherwise `train_data` (default: the default train shards),
    `eval_data` (default: the default held-out shards, only with the default train
    shards) and `study_dir` (default: RUNS/default/studies/grokking-vs-data). `runs`:
    the runs directory (default: eagle3lab.config.runs_dir()). `source`: the tool whose
    layout the shards are in (without `train_data`: the demo shards, written in that
    layout); `data_target`: the target a foreign set was captured from
    (needed the first time; the demo's target for demo data)."""
    foreign_demo = source != "eagle3lab" and not train_data  # the default shards are ours
    chosen = _study_data(train_data=train_data, eval_data=eval_data, study_dir=study_dir,
                         demo=demo or foreign_demo, demo_target=demo_target, work=(
                             WorkDir(Path(runs) / "default") if runs is not None
                             else WorkDir.default()), log=log)
    if source == "eagle3lab":
        return chosen
    return _foreign(chosen, source=source, target=data_target or (
        demo_target if chosen.demo else ""))


def _study_data(*, train_data, eval_data, study_dir, demo, demo_target, work, log):
    if demo or (not train_data and not (work.shards_train / "manifest.json").exists()):
        if not demo:
            log("No default shards yet (run `eagle3lab demo`); using tiny synthetic demo data.")
        tmp = Path(tempfile.mkdtemp(prefix="eagle3lab-06-"))
        d = demo_data(tmp / "data", target=demo_target or None)
        return StudyData(train=d["train"], eval=d["eval"], out=study_dir or str(tmp / "study"),
                         demo=True)
    return StudyData(train=train_data or str(work.shards_train),
                     eval=eval_data or (str(work.shards_eval) if not train_data else None),
                     out=study_dir or str(work.study(STUDY_NAME)), demo=False)


def _foreign(d: StudyData, *, source: str, target: str) -> StudyData:
    """`d` read as `source`'s sets: demo shards written in its layout first (with the demo
    map's size); each set opened once with its target; the train set must carry a vocab
    map (`eagle3lab vocab --data ... --target ...` builds one)."""
    if source not in DATA_FORMATS[1:]:
        raise UserError(f"source must be one of {', '.join(DATA_FORMATS[1:])}, not {source!r}.")
    train, ev = d.train, d.eval
    if d.demo:
        target = resolve_target_path(target or DEFAULT_TARGET)
        size = int(ShardSet(d.train).vocab_map()[0].numel())
        root = Path(d.train).parents[1] / source
        train = str(write_as(source, shards=d.train, out=root / "train", target=target))
        ev = str(write_as(source, shards=d.eval, out=root / "eval", target=target)) \
            if d.eval else None
        build_shard_vocab(data=train, draft_vocab_size=size, data_format=source,
                          target=target)
    for path in (train, ev):
        if path:
            s = open_shards(path, data_format=source, target=target or None)
            if path == train and not s.manifest.get("vocab_map"):
                raise UserError(f"The {source} set {path} has no vocab map yet; build one: "
                                f"`eagle3lab vocab --data {path} --draft-vocab-size N` "
                                f"(or --from-recorded).")
    return StudyData(train=train, eval=ev, out=d.out, demo=d.demo)
