"""Per `accept` arm the drafter is located once and each of its weight files' headers read
once (issue 27 §2): the checks, the doctor and the loader share one OpenedDrafter. Counted
by wrapping the locator, the header parser, safetensors' file opener and the doctor."""

from __future__ import annotations

import collections
import json
import os
import shutil
from pathlib import Path

import pytest


class Reads:
    """Calls of the locator (by the path given) and of the per-file readers (by file)."""

    def __init__(self):
        self.located: list[str] = []
        self.headers: collections.Counter = collections.Counter()
        self.handles: collections.Counter = collections.Counter()
        self.doctor = 0

    @staticmethod
    def _in(counter, directory) -> dict[str, int]:
        d = Path(directory).resolve()
        return {Path(p).name: n for p, n in counter.items() if Path(p).resolve().parent == d}

    def headers_in(self, directory) -> dict[str, int]:
        return self._in(self.headers, directory)

    def handles_in(self, directory) -> dict[str, int]:
        return self._in(self.handles, directory)


@pytest.fixture
def reads(monkeypatch) -> Reads:
    import safetensors

    from eagle3lab.formats import doctor, locate, reader

    r = Reads()
    real_locate, real_header = locate.locate_checkpoint, reader.parse_safetensors_header
    real_open, real_doctor = safetensors.safe_open, doctor.inspect_opened

    def counted_locate(path, **kw):
        r.located.append(str(path))
        return real_locate(path, **kw)

    def counted_header(path):
        r.headers[str(path)] += 1
        return real_header(path)

    def counted_open(path, *a, **kw):
        r.handles[str(path)] += 1
        return real_open(path, *a, **kw)

    def counted_doctor(*a, **kw):
        r.doctor += 1
        return real_doctor(*a, **kw)

    monkeypatch.setattr(locate, "locate_checkpoint", counted_locate)
    monkeypatch.setattr(reader, "parse_safetensors_header", counted_header)
    monkeypatch.setattr(safetensors, "safe_open", counted_open)
    monkeypatch.setattr(doctor, "inspect_opened", counted_doctor)
    return r


def _sharded(src: Path, dst: Path) -> Path:
    """`src` (one model.safetensors) split over two files with an index."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True)
    state = load_file(str(src / "model.safetensors"))
    names = sorted(state)
    wm = {}
    for i, keys in enumerate((names[::2], names[1::2]), 1):
        f = f"model-0000{i}-of-00002.safetensors"
        save_file({k: state[k] for k in keys}, str(dst / f), metadata={"format": "pt"})
        wm.update({k: f for k in keys})
    (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    shutil.copy(src / "config.json", dst / "config.json")
    return dst


def test_one_cli_accept_arm_locates_once_and_reads_each_header_once(
        tiny_target_dir, tiny_draft, tmp_path, reads, capsys):
    from eagle3lab.cli import main

    draft = _sharded(Path(tiny_draft), tmp_path / "sharded")
    rc = main(["accept", "--target", str(tiny_target_dir), "--draft", str(draft), "--limit",
               "1", "--max-new-tokens", "4", "--steps", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["arms"][0]["stats"]["verify_ct"] >= 1
    assert out["arms"][0]["draft"] == str(draft)  # the result names the drafter as given
    files = {f.name: 1 for f in draft.glob("*.safetensors")}
    assert len(files) == 2
    assert reads.located == [str(draft)]
    assert reads.headers_in(draft) == files
    # the doctor's NaN scan and the loader read tensors through the same open files
    assert reads.handles_in(draft) == files
    assert reads.doctor == 1


def test_arms_on_one_drafter_share_it_and_a_save_path_is_located_once(
        tiny_target, tiny_draft, tmp_path, reads):
    from eagle3lab.specdec.accept import Arm, measure_acceptance

    save = tmp_path / "save"
    epoch = Path(shutil.copytree(tiny_draft, save / "0"))
    os.symlink("0", save / "checkpoint_best")
    r = measure_acceptance(target=tiny_target, arms=[Arm("a", str(save)),
                                                     Arm("last", str(save), "last_layer")],
                           limit=1, max_new_tokens=4, steps=2, progress=False)
    assert [a["matches_plain"] for a in r["arms"]] == [1, 1]
    assert reads.located == [str(save)]  # once for both arms, resolved to its best epoch
    files = {f.name: 1 for f in epoch.glob("*.safetensors")}
    assert files and reads.headers_in(epoch) == files
    assert reads.handles_in(epoch) == files
    assert reads.doctor == 1  # same target, same engine: one report, kept on the drafter


def test_load_engine_given_a_path_opens_it_once(tiny_target, tiny_draft, reads):
    from eagle3lab.specdec.load import load_engine

    eng = load_engine(target=tiny_target, draft=str(tiny_draft), steps=2)
    assert eng.num_draft_tokens == 2
    assert reads.located == [str(tiny_draft)]
    assert reads.headers_in(tiny_draft) == {f.name: 1 for f in
                                            Path(tiny_draft).glob("*.safetensors")}
