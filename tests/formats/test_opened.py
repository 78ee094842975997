"""The opened drafter (formats/opened.py): one object that the doctor and the loader take
instead of a path, with the same answers, its report kept, and the path API unchanged."""

from __future__ import annotations

import json

import pytest
import torch

from eagle3lab.errors import UserError
from eagle3lab.formats.doctor import inspect_checkpoint
from eagle3lab.formats.reader import load_draft_config
from eagle3lab.formats.load_as import load_as
from eagle3lab.formats.opened import OpenedDrafter, open_drafter


def _same(a, b) -> bool:
    da, db = json.loads(a.to_json()), json.loads(b.to_json())
    da.pop("seconds"), db.pop("seconds")
    return da == db


def test_open_reads_nothing_until_asked_and_is_idempotent(fx, tmp_path):
    d = open_drafter(fx["spec"])
    assert isinstance(d, OpenedDrafter)
    assert d.path == fx["spec"] and d.given == fx["spec"] and d._checkpoint is None
    assert open_drafter(d) is d
    assert d.format == "speculators" and d.native_engine == "speculators"
    assert d.tensors and str(d.path) == d.__fspath__()
    missing = open_drafter(tmp_path / "nope")  # refused by whoever asks, with its message
    with pytest.raises(UserError, match="does not exist or is not a directory"):
        inspect_checkpoint(missing)


@pytest.mark.parametrize("kind,engine", [("spec", None), ("sglang", "vllm"),
                                         ("sglang", "sglang")])
def test_the_doctor_gives_the_same_report_for_a_path_and_the_opened_drafter(fx, kind, engine):
    by_path = inspect_checkpoint(fx[kind], target=fx["target"], engine=engine)
    d = open_drafter(fx[kind])
    opened = inspect_checkpoint(d, target=fx["target"], engine=engine)
    assert _same(by_path, opened)
    assert inspect_checkpoint(d, target=fx["target"], engine=engine) is opened  # kept
    other = inspect_checkpoint(d, engine=engine)  # other arguments: another report
    assert other is not opened and other.target is None


def test_trained_capture_does_not_leak_into_the_shared_config(fx):
    d = open_drafter(fx["spec"])
    r = inspect_checkpoint(d, target=fx["target"], trained_capture=[2, 3, 5])
    assert r.config["aux"]["training_capture_points"] == [2, 3, 5]
    assert d.parsed_config.trained_override is None
    plain = inspect_checkpoint(d, target=fx["target"])
    assert plain.config["aux"]["training_capture_points"] == [1, 4, 6]


def test_load_as_gives_the_same_state_from_the_opened_drafter(fx):
    d = open_drafter(fx["spec"])
    inspect_checkpoint(d, target=fx["target"])  # the doctor first, as load_engine does
    a = load_as(fx["spec"], "vllm", target=fx["target"])
    b = load_as(d, "vllm", target=fx["target"])
    assert a.sources == b.sources and a.capture_points == b.capture_points
    assert sorted(a.state) == sorted(b.state)
    assert all(torch.equal(a.state[k], b.state[k]) for k in a.state)
    d.close()  # a later use reads again
    assert torch.equal(load_as(d, "vllm", target=fx["target"]).state["fc.weight"],
                       a.state["fc.weight"])


def test_a_bin_drafter_is_read_by_the_doctor_and_the_loader_from_one_open(fx, tmp_path):
    from safetensors.torch import load_file

    src = fx["sglang"]
    d = tmp_path / "bin"
    d.mkdir()
    torch.save(load_file(str(src / "model.safetensors")), d / "pytorch_model.bin")
    (d / "config.json").write_text((src / "config.json").read_text())
    opened = open_drafter(d)
    assert inspect_checkpoint(opened, target=fx["target"]).ok
    es = load_as(opened, "sglang", target=fx["target"])
    assert es.fresh == [] and es.dropped == []


def test_draft_config_refuses_a_malformed_config_as_load_draft_config_does(plant):
    p = plant.copy()
    (p / "config.json").write_text("{not json")
    with pytest.raises(UserError) as want:
        load_draft_config(p)
    d = open_drafter(p)
    assert "unreadable" in {f.code for f in inspect_checkpoint(d).findings}
    with pytest.raises(UserError) as got:
        d.draft_config
    assert str(got.value) == str(want.value)
