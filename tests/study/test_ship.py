"""eagle3lab.study.ship on the committed study and the real shipped drafter: a packed winner
replaces the shipped drafter only with its own run's curve, fresh checksums and this
checkout's target path, and only when its run beats the drafter it replaces. The winner
here is the shipped drafter's own weights, packed as a poll packs them (the device's
target path, winner.json naming a run): the 128M run's weights never came back
(docs/study.md, session 24), so its record names that run over other weights."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from checksums import assert_checksums

from eagle3lab.errors import UserError
from eagle3lab.fsutil import sha256_file
from eagle3lab.study.atscale import WINNER_FORMAT, WINNER_RECORD
from eagle3lab.study.atscale_read import load_results, shipped_run
from eagle3lab.study.ship import SUMMED, ship_winner

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "data" / "studies" / "h200-grok"
SHIPPED = REPO / "data" / "drafters" / "smollm2-135m-instruct"
RUN = "long-speculators-all-128M-wd0.01-s0"


def _pack(dst: Path, run: str) -> Path:
    """A winner as `collect --winner` leaves it on the device: weights, config.json and
    eagle3lab.json recording the device's target path, and the record naming `run`."""
    dst.mkdir()
    shutil.copyfile(SHIPPED / "model.safetensors", dst / "model.safetensors")
    cfg = json.loads((SHIPPED / "config.json").read_text())
    cfg["speculators_config"]["verifier"]["name_or_path"] = "/root/e3l/target"
    (dst / "config.json").write_text(json.dumps(cfg))
    meta = json.loads((SHIPPED / "eagle3lab.json").read_text())
    for split in ("train", "eval"):
        meta["data"][split]["target"]["path"] = "/root/e3l/target"
    (dst / "eagle3lab.json").write_text(json.dumps(meta))
    (dst / WINNER_RECORD).write_text(json.dumps({
        "format": WINNER_FORMAT, "version": 1, "run": run, "picked": "auto",
        "setting": "5,1,6", "tau": None,
        "model_sha256": sha256_file(dst / "model.safetensors"), "params": 0}))
    return dst


@pytest.fixture
def dest(tmp_path):
    d = tmp_path / "smollm2-135m-instruct"
    shutil.copytree(SHIPPED, d)
    return d


def test_a_better_run_ships_with_its_curve_checksums_and_this_checkouts_paths(tmp_path, dest):
    winner = _pack(tmp_path / "winner", RUN)
    card = (dest / "README.md").read_bytes()
    r = ship_winner(winner=winner, study=STUDY, dest=dest)
    assert (r["run"], r["setting"], r["replaced_run"]) == \
        (RUN, "5,1,6", "long-speculators-all-64M-wd0.01-s0")
    assert r["tau"] == pytest.approx(2.8397, abs=1e-4)
    assert r["replaced_tau"] == pytest.approx(2.7507, abs=1e-4)
    assert assert_checksums(dest) == set(SUMMED)
    assert (dest / "metrics.jsonl").read_bytes() == (STUDY / "runs" / RUN /
                                                     "metrics.jsonl").read_bytes()
    assert (dest / "model.safetensors").read_bytes() == (winner / "model.safetensors").read_bytes()
    assert (dest / "README.md").read_bytes() == card  # the card is rewritten by hand
    cfg, was = (json.loads((d / "config.json").read_text()) for d in (dest, SHIPPED))
    assert cfg == was  # the device's target path replaced by this checkout's, all else kept
    meta, was = (json.loads((d / "eagle3lab.json").read_text()) for d in (dest, SHIPPED))
    assert meta == was
    assert shipped_run(load_results(STUDY), dest) == RUN
    assert not list(dest.parent.glob(".smollm2-135m-instruct*"))  # nothing half-written
    # the same winner again: it is already the shipped one
    with pytest.raises(UserError, match=f"is already {RUN}'s drafter"):
        ship_winner(winner=winner, study=STUDY, dest=dest)


def test_a_run_that_does_not_beat_the_shipped_drafter_is_refused(tmp_path, dest):
    worse = "data-all-wd0.01-s0"
    winner = _pack(tmp_path / "winner", worse)
    before = {p.name: p.read_bytes() for p in dest.iterdir()}
    with pytest.raises(UserError, match=rf"{worse} \(tau 1\.9\d\d at 5,1,6\) does not beat the "
                       r"drafter it would replace, long-speculators-all-64M-wd0\.01-s0 "
                       r"\(2\.751\); --force ships it anyway\."):
        ship_winner(winner=winner, study=STUDY, dest=dest)
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before
    assert ship_winner(winner=winner, study=STUDY, dest=dest, force=True)["run"] == worse
    assert assert_checksums(dest) == set(SUMMED)


def test_bad_winners_are_refused_in_one_line(tmp_path, dest):
    from safetensors import safe_open
    from safetensors.numpy import save_file

    w = _pack(tmp_path / "no-record", RUN)
    (w / WINNER_RECORD).unlink()
    with pytest.raises(UserError, match="has no winner.json: only a drafter"):
        ship_winner(winner=w, study=STUDY, dest=dest)
    w = _pack(tmp_path / "unknown", "long-nothing-s0")
    with pytest.raises(UserError, match="long-nothing-s0 .* is not a finished run"):
        ship_winner(winner=w, study=STUDY, dest=dest)
    w = _pack(tmp_path / "other-weights", RUN)
    rec = json.loads((w / WINNER_RECORD).read_text())
    (w / WINNER_RECORD).write_text(json.dumps({**rec, "model_sha256": "0" * 64}))
    with pytest.raises(UserError, match="is not the weights .* records"):
        ship_winner(winner=w, study=STUDY, dest=dest)
    # another architecture: one tensor fewer (d2t, the one numpy reads)
    w = _pack(tmp_path / "other-arch", RUN)
    with safe_open(str(w / "model.safetensors"), framework="np") as f:
        d2t = f.get_tensor("d2t")
    save_file({"d2t": d2t}, str(w / "model.safetensors"))
    (w / WINNER_RECORD).write_text(json.dumps(
        {**rec, "model_sha256": sha256_file(w / "model.safetensors")}))
    with pytest.raises(UserError, match="is not the architecture of .*: tensors differ"):
        ship_winner(winner=w, study=STUDY, dest=dest)
    (w / WINNER_RECORD).write_text("{not json")
    with pytest.raises(UserError, match="winner record"):
        ship_winner(winner=w, study=STUDY, dest=dest)
    # a drafter whose curve is no run's of this study: nothing says the run beats it
    other = tmp_path / "elsewhere"
    shutil.copytree(SHIPPED, other)
    curve = (other / "metrics.jsonl").read_text().splitlines(keepends=True)
    (other / "metrics.jsonl").write_text("".join(curve[:-1]))
    with pytest.raises(UserError, match="is no finished, decoded run of this study"):
        ship_winner(winner=_pack(tmp_path / "over-other", RUN), study=STUDY, dest=other)
    assert assert_checksums(dest) == set(SUMMED)  # untouched throughout
    # the command: one line, exit 1
    r = subprocess.run([sys.executable, str(REPO / "bench" / "ship_drafter.py"), "--winner",
                        str(tmp_path / "no-record"), "--dest", str(dest), "--study",
                        str(STUDY)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("bench/ship_drafter.py: error: ") and \
        r.stderr.count("\n") == 1, r.stderr
