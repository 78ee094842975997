"""The one work-directory layout (eagle3lab.workdir.WorkDir) is the layout the real stages
write, and `default_drafter` is the one lookup of the drafter used when none is given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3lab.errors import UserError
from eagle3lab.workdir import (WorkDir, default_drafter, drafter_or_default, drafters_dir)

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "data" / "drafters" / "smollm2-135m-instruct"


def test_layout_paths(tmp_path):
    wd = WorkDir(str(tmp_path))  # a str is taken as a path
    assert wd.root == tmp_path
    assert wd.responses_train == tmp_path / "responses" / "train.jsonl"
    assert wd.responses("self") == tmp_path / "responses" / "self.jsonl"
    assert wd.shards_eval == tmp_path / "shards" / "eval"
    assert wd.vocab_map == tmp_path / "shards" / "train" / "vocab_map.safetensors"
    assert wd.final == wd.train_run / "final" == tmp_path / "train" / "final"
    assert wd.final_of("lmhead") == tmp_path / "lmhead" / "final"
    assert wd.packed("lmhead") == tmp_path / "drafter-lmhead"
    assert wd.accept_record() == tmp_path / "accept-train.json"
    assert wd.sglang_copy == tmp_path / "converted" / "sglang"
    assert wd.stage_record("data") == tmp_path / "stages" / "data.json"
    assert wd.study("s") == tmp_path / "studies" / "s"
    d = wd.as_dict()
    assert d["root"] == tmp_path and all(getattr(wd, k) == v for k, v in d.items())
    with pytest.raises(AttributeError):
        wd.root = tmp_path / "other"  # frozen: one value per work dir
    assert WorkDir(tmp_path) == wd and len({WorkDir(tmp_path), wd}) == 1


def test_default_work_dir_follows_the_data_root(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3LAB_DATA", str(tmp_path))
    assert WorkDir.default().root == tmp_path.resolve() / "runs" / "default"


def test_it_is_the_layout_the_data_and_training_stages_write(sharp_data, trained_run):
    """demo_data (regenerate-style conversations -> extract -> vocab) and train write where
    WorkDir says; nothing here re-spells a path."""
    from eagle3lab.data.prompts import read_conversations
    from eagle3lab.data.shards import read_manifest

    wd = WorkDir(Path(sharp_data["train"]).parents[1])
    assert Path(sharp_data["train"]) == wd.shards_train
    assert Path(sharp_data["eval"]) == wd.shards_eval
    assert len(read_conversations(wd.responses_train)) == 48
    assert read_manifest(wd.shards_train)["vocab_map"]["file"] == wd.vocab_map.name
    assert wd.vocab_map.is_file()
    run = WorkDir(trained_run.parent)
    summary = json.loads((trained_run / "run.json").read_text())
    assert summary["status"] == "done"
    assert (run.final_of(trained_run.name) / "config.json").is_file()


def test_default_drafter_is_the_shipped_one_for_the_preset():
    assert drafters_dir() / "smollm2-135m-instruct" == SHIPPED
    assert default_drafter() == default_drafter("smollm2-135m-instruct") == str(SHIPPED)
    assert drafter_or_default(None, "smollm2-135m-instruct") == str(SHIPPED)
    assert drafter_or_default("/my/draft", "smollm2-135m-instruct") == "/my/draft"
    # SGLang gets the SGLang-servable one: the default drafter is normed
    sglang = str(SHIPPED.with_name("smollm2-135m-instruct-sglang"))
    assert default_drafter(engine="sglang") == sglang
    assert drafter_or_default(None, "smollm2-135m-instruct", engine="sglang") == sglang
    assert drafter_or_default(None, "smollm2-135m-instruct", engine="vllm") == str(SHIPPED)


def _fake_final(wd: WorkDir) -> None:
    wd.final.mkdir(parents=True)
    (wd.final / "config.json").write_text("{}")


def test_default_drafter_falls_back_to_a_trained_one(tmp_path, monkeypatch):
    other = WorkDir(tmp_path / "w")
    assert default_drafter("/some/target/dir") is None  # no preset, no work dir given
    assert default_drafter("/some/target/dir", work=other) is None  # nothing trained yet
    _fake_final(other)
    assert default_drafter("/some/target/dir", work=other) == str(other.final)
    # a preset without a shipped drafter: the demo's work dir, when it trained one
    monkeypatch.setattr("eagle3lab.workdir.drafters_dir", lambda: tmp_path / "none")
    monkeypatch.setenv("EAGLE3LAB_DATA", str(tmp_path / "data"))
    assert default_drafter() is None
    _fake_final(WorkDir.default())
    assert default_drafter() == str(WorkDir.default().final)
    assert default_drafter("/some/target/dir") is None  # not made for another target


def test_no_drafter_at_all_is_a_clear_error():
    with pytest.raises(UserError, match=r"No drafter given \(--draft\).*'/some/target'.*"
                                        r"Pass --draft CHECKPOINT"):
        drafter_or_default(None, "/some/target")
    # the message lists both shipped drafters and which engines serve each
    with pytest.raises(UserError, match=r"smollm2-135m-instruct: vLLM and the reference engine; "
                                        r"SGLang refuses it \(norm_before_fc.*"
                                        r"smollm2-135m-instruct-sglang: SGLang"):
        drafter_or_default(None, "/some/target", engine="sglang")
