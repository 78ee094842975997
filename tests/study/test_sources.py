"""Which shards the study runs on: given ones, the default pipeline's, or demo shards made
for the run (with a note when they were not asked for); held-out defaults only with the
default train shards."""

import tempfile
from pathlib import Path

import pytest

from eagle3lab.data.shards import ShardSet
from eagle3lab.study.sources import study_data


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # mkdtemp goes here
    (tmp_path / "tmp").mkdir()
    return tmp_path / "runs"


def test_given_shards_and_the_default_study_dir(runs):
    s = study_data(train_data="/d/train", runs=runs)
    assert (s.train, s.eval, s.demo) == ("/d/train", None, False)  # hold out part of train
    assert s.out == str(runs / "default" / "studies" / "grokking-vs-data")
    s = study_data(train_data="/d/train", eval_data="/d/eval", study_dir="/s", runs=runs)
    assert (s.train, s.eval, s.out) == ("/d/train", "/d/eval", "/s")


def test_the_default_pipelines_shards_when_they_exist(runs):
    shards = runs / "default" / "shards"
    (shards / "train").mkdir(parents=True)
    (shards / "train" / "manifest.json").write_text("{}")
    s = study_data(runs=runs)
    assert (s.train, s.eval) == (str(shards / "train"), str(shards / "eval"))
    s = study_data(eval_data="/mine/eval", runs=runs)
    assert (s.train, s.eval) == (str(shards / "train"), "/mine/eval")


def test_demo_shards_when_there_are_none_say_so(runs, sharp_target_dir):
    notes = []
    s = study_data(demo_target=str(sharp_target_dir), runs=runs, log=notes.append)
    assert s.demo and notes == [
        "No default shards yet (run `eagle3lab demo`); using tiny synthetic demo data."]
    root = Path(s.train).parents[2]
    assert root.parent == Path(tempfile.gettempdir()) and root.name.startswith("eagle3lab-06-")
    assert s.out == str(root / "study")
    assert len(ShardSet(s.train)) == 48 and len(ShardSet(s.eval)) == 12
    assert ShardSet(s.train).manifest["target"]["path"] == str(sharp_target_dir)
    notes.clear()
    s = study_data(demo=True, train_data="/ignored", study_dir="/s",
                   demo_target=str(sharp_target_dir), runs=runs, log=notes.append)
    assert s.demo and s.out == "/s" and notes == []  # asked for: no note
