"""The data stages' typed configs and their one skeleton: unknown or mistyped settings are
one line naming them (before any model is loaded), a config and keyword arguments run the
same stage, and `Stage.run` calls the hooks in its order, closing even when a unit fails."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest

from testutil import write_conversations
from eagle3lab.data.extract import ExtractConfig, extract
from eagle3lab.data.regenerate import RegenerateConfig, regenerate
from eagle3lab.data.selfprompt import SelfPromptConfig, synthesize_prompts
from eagle3lab.data.stage import Stage, StageConfig, build_config
from eagle3lab.errors import UserError

#: each stage: its config, its function, the fields it needs
STAGES = [
    (ExtractConfig, extract, {"conversations": "c.jsonl", "out": "s"}),
    (RegenerateConfig, regenerate, {"out": "r.jsonl"}),
    (SelfPromptConfig, synthesize_prompts, {"out": "p.jsonl"}),
]


@pytest.mark.parametrize("cls, fn, required", STAGES, ids=lambda x: getattr(x, "WHERE", ""))
def test_unknown_or_mistyped_settings_are_one_line(cls, fn, required, tmp_path):
    required = {k: str(tmp_path / v) for k, v in required.items()}
    for bad, names in (({"limt": 3}, ["unknown field(s) limt", "check the spelling"]),
                       ({"dist_timeout": "soon"}, ["field 'dist_timeout'", "'soon'"])):
        with pytest.raises(UserError) as e:
            cls.from_dict({**required, **bad})
        msg = str(e.value)
        assert msg.startswith(f"{cls.WHERE}: ") and "\n" not in msg
        assert all(n in msg for n in names), msg
        # the function refuses it the same way, before loading the (missing) target
        with pytest.raises(UserError) as e2:
            fn(target=str(tmp_path / "no-target"), **required, **bad)
        assert str(e2.value) == msg
    with pytest.raises(UserError, match=f"{cls.WHERE}: expected a {cls.__name__}"):
        fn(["not", "a", "config"])


def test_a_config_a_mapping_and_keywords_run_the_same_stage(tiny_target, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n"
                               for i, t in enumerate(["Say hi.", "Name a colour.", "Why?"])))
    fields = {"prompts": str(prompts), "max_new_tokens": 4, "batch_size": 2}
    cfg = RegenerateConfig(out=str(tmp_path / "a.jsonl"), **fields)
    regenerate(cfg, target=tiny_target, progress=False)
    regenerate(cfg.model_dump(), target=tiny_target, progress=False,
               out=tmp_path / "b.jsonl")  # a keyword overrides the config's field
    regenerate(target=tiny_target, progress=False, out=tmp_path / "c.jsonl", **fields)
    a, b, c = ((tmp_path / f"{x}.jsonl").read_bytes() for x in "abc")
    assert a == b == c and a.count(b"\n") == 3


def test_a_loaded_target_stays_beside_the_config(tiny_target, tmp_path):
    cfg, loaded = build_config(ExtractConfig, None, tiny_target,
                               {"conversations": tmp_path / "c.jsonl", "out": tmp_path})
    assert loaded is tiny_target and cfg.target == tiny_target.path
    assert cfg.conversations == str(tmp_path / "c.jsonl")  # a Path is held as its str
    cfg, loaded = build_config(ExtractConfig, cfg, "other-target", {})
    assert loaded is None and cfg.target == "other-target"


def test_extract_from_a_config_equals_keywords(tiny_target, tmp_path):
    convs = write_conversations(tmp_path / "convs.jsonl", tiny_target.tokenizer, n=3)
    cfg = ExtractConfig(conversations=str(convs), out=str(tmp_path / "a"), aux_ids="1,2,3",
                        samples_per_shard=2, dtype="float32")
    extract(cfg, target=tiny_target, progress=False)
    extract(conversations=convs, out=tmp_path / "b", aux_ids=[1, 2, 3], samples_per_shard=2,
            dtype="float32", target=tiny_target, progress=False)
    files = [sorted(p.name for p in (tmp_path / d).iterdir()) for d in "ab"]
    assert files[0] == files[1] and "shard-00001.safetensors" in files[0]
    for name in files[0]:
        if name.endswith(".safetensors"):
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["aux_layers"]["requested_ids"] == [1, 2, 3]


class _ToyConfig(StageConfig):
    WHERE: ClassVar[str] = "toy"
    units: int = 3
    fail_at: int | None = None


class _ToyStage(Stage[_ToyConfig]):
    """Records the hooks it is called through."""

    CONFIG = _ToyConfig

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls: list[Any] = []

    def plan(self):
        self.calls.append("plan")

    def resume(self):
        self.calls.append("resume")
        return {"from": "rank 0"}

    def start(self, state):
        self.calls.append(("start", state["from"]))
        self.make_bar(total=self.config.units, desc="toy", unit="unit")

    def units(self):
        for u in range(self.config.units):
            self.calls.append(("unit", u))
            yield u

    def compute(self, u):
        if u == self.config.fail_at:
            raise RuntimeError(f"unit {u} failed")
        return u * 10

    def write(self, u, result):
        self.calls.append(("write", u, result))
        self.bar.update(1)

    def close(self):
        self.calls.append("close")

    def merge(self):
        self.calls.append("merge")
        return {"calls": len(self.calls)}


def test_the_skeleton_runs_the_hooks_in_order(tmp_path):
    stage = _ToyStage(_ToyConfig(device="cpu"), progress=False)
    assert stage.run() == {"calls": 11}
    assert stage.calls == ["plan", "resume", ("start", "rank 0"),
                           ("unit", 0), ("write", 0, 0), ("unit", 1), ("write", 1, 10),
                           ("unit", 2), ("write", 2, 20), "close", "merge"]
    assert stage.ranks.world_size == 1 and stage.bar.disable


def test_a_failing_unit_still_closes_and_merges_nothing():
    stage = _ToyStage(_ToyConfig(device="cpu", fail_at=1), progress=False)
    with pytest.raises(RuntimeError, match="unit 1 failed"):
        stage.run()
    assert stage.calls[-3:] == [("write", 0, 0), ("unit", 1), "close"]
    assert "merge" not in stage.calls
