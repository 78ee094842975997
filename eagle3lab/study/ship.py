"""A study run's packed drafter shipped as a default drafter (issue 28, part 4).

Prevents a shipped drafter whose parts come from different places: weights of one run and
the curve (`metrics.jsonl`) of another, checksums that no longer match, a config that
points at the GPU machine's paths, or a drafter that replaced a better one. The winner a
poll packed (`atscale.collect`: model.safetensors, config.json, eagle3lab.json and
WINNER_RECORD naming its run) replaces the shipped drafter directory only when:
- its record names a finished run of the study whose final live tau (the study's main
  shape, as `against_reference` reads it) beats the run the shipped drafter came from
  (`shipped_run`; a drafter of no run is not replaced), unless forced;
- its weights are that record's (sha256) and have the shipped drafter's tensor names and
  shapes (the same architecture: the engines load it the same way).
The directory is rebuilt in a temporary sibling and swapped in whole: the winner's weights,
its config.json and eagle3lab.json with the fields in SHIPPED_FIELDS taken from the drafter
it replaces (the target's path as this checkout names it, not the device's), the run's
metrics.jsonl, the card (README.md) kept to be rewritten by hand, and SHA256SUMS afresh.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from eagle3lab.errors import UserError
from eagle3lab.formats.detect import get_path
from eagle3lab.formats.reader import parse_safetensors_header
from eagle3lab.fsutil import atomic_dir, read_json_object, sha256_file
from eagle3lab.study.atscale import WINNER_FORMAT, WINNER_RECORD
from eagle3lab.study.atscale_read import against_reference, load_results

#: (file, JSON path) of the fields a shipped drafter keeps from the one it replaces: where
#: the target lives here (a packed winner records the device's /root/e3l/target).
SHIPPED_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("config.json", ("speculators_config", "verifier", "name_or_path")),
    ("eagle3lab.json", ("data", "train", "target", "path")),
    ("eagle3lab.json", ("data", "eval", "target", "path")),
)
#: The files SHA256SUMS lists, in its order.
SUMMED = ("model.safetensors", "config.json", "eagle3lab.json", "metrics.jsonl")


def _architecture(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """{name: (shape, dtype)} from a safetensors header (no tensor read); a file that is no
    safetensors (truncated, another format) in one line."""
    try:
        infos, _ = parse_safetensors_header(path)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not readable as safetensors ({e}).") from None
    return {n: (i.shape, i.dtype) for n, i in infos.items()}


def ship_winner(*, winner: str | os.PathLike, study: str | os.PathLike,
                dest: str | os.PathLike, force: bool = False) -> dict[str, Any]:
    """Replace `dest` (a shipped drafter directory) with the packed `winner` of `study`'s
    run its WINNER_RECORD names (module docstring: what is checked, what is written).
    Returns {"run", "tau", "setting", "replaced_run", "replaced_tau", "dest", "sums"}."""
    winner, dest = Path(winner), Path(dest)
    rec_path = winner / WINNER_RECORD
    for d, what in ((winner, "--winner"), (dest, "the shipped drafter")):
        if not d.is_dir():
            raise UserError(f"{d} ({what}) is not a directory.")
    if not rec_path.is_file():
        raise UserError(f"{winner} has no {WINNER_RECORD}: only a drafter `bench/study_gpu.py "
                        f"collect --winner` packed says which run it is. Collect it again.")
    rec = read_json_object(rec_path, what="winner record",
                           fix="Collect the winner again (bench/study_gpu.py collect).")
    if rec.get("format") != WINNER_FORMAT or not isinstance(rec.get("run"), str):
        raise UserError(f"{rec_path} is not a winner record (format {rec.get('format')!r}, "
                        f"run {rec.get('run')!r}).")
    for name in ("model.safetensors", "config.json", "eagle3lab.json"):
        if not (winner / name).is_file():
            raise UserError(f"{winner} lacks {name}: not a packed drafter.")
    for name in ("model.safetensors", "config.json", "eagle3lab.json", "README.md"):
        if not (dest / name).is_file():
            raise UserError(f"{dest} lacks {name}: not a shipped drafter directory.")
    got = sha256_file(winner / "model.safetensors")
    if got != rec.get("model_sha256"):
        raise UserError(f"{winner / 'model.safetensors'} is not the weights {rec_path} "
                        f"records (sha256 {got[:12]}..., recorded "
                        f"{str(rec.get('model_sha256'))[:12]}...).")
    new, old = (_architecture(d / "model.safetensors") for d in (winner, dest))
    if new != old:
        diff = sorted(set(new) ^ set(old)) or sorted(k for k in new if new[k] != old[k])
        raise UserError(f"{winner} is not the architecture of {dest}: tensors differ "
                        f"({', '.join(diff[:4])}{', ...' if len(diff) > 4 else ''}).")

    res = load_results(study)
    run = rec["run"]
    curve = res.study_dir / "runs" / run / "metrics.jsonl"
    if run not in set(res.done) or not curve.is_file():
        raise UserError(f"{run} (named by {rec_path}) is not a finished run with its curve in "
                        f"{res.study_dir}: copy the collected runs/{run}/ there first.")
    ref = against_reference(res, shipped=dest)
    setting = ref["setting"]
    live = res.live
    fin = live[(live["run"] == run) & live["final"] & (live["setting"] == setting)]
    if not len(fin):
        raise UserError(f"{run}'s final drafter has no live tau at {setting} in "
                        f"{res.study_dir}: it is decoded before it ships.")
    tau = float(fin["tau"].iloc[0])
    if ref["shipped_run"] == run:
        raise UserError(f"{dest} is already {run}'s drafter.")
    if ref["shipped_tau"] is None and not force:
        raise UserError(f"The drafter in {dest} is no finished, decoded run of this study, so "
                        f"nothing here says {run} (tau {tau:.3f} at {setting}) beats it; "
                        f"--force ships it anyway.")
    if ref["shipped_tau"] is not None and tau <= ref["shipped_tau"] and not force:
        raise UserError(f"{run} (tau {tau:.3f} at {setting}) does not beat the drafter it would "
                        f"replace, {ref['shipped_run']} ({ref['shipped_tau']:.3f}); "
                        f"--force ships it anyway.")

    texts = {name: tuple(read_json_object(d / name, what=f"drafter {name}")
                         for d in (winner, dest))
             for name in ("config.json", "eagle3lab.json")}
    for name, path in SHIPPED_FIELDS:
        mine, theirs = texts[name]
        value, parent = get_path(theirs, path), get_path(mine, path[:-1])
        if value is None:
            continue
        if not isinstance(parent, dict) or path[-1] not in parent:
            raise UserError(f"{winner / name} has no {'.'.join(path)}, which {dest / name} "
                            f"has: not a drafter of the same kind.")
        parent[path[-1]] = value
    with atomic_dir(dest) as tmp:
        shutil.copyfile(winner / "model.safetensors", tmp / "model.safetensors")
        for name, (mine, _) in texts.items():
            (tmp / name).write_text(json.dumps(mine, indent=2) + "\n")
        shutil.copyfile(curve, tmp / "metrics.jsonl")
        shutil.copyfile(dest / "README.md", tmp / "README.md")
        sums = {n: sha256_file(tmp / n) for n in SUMMED}
        (tmp / "SHA256SUMS").write_text("".join(f"{d}  {n}\n" for n, d in sums.items()))
    return {"run": run, "tau": tau, "setting": setting, "replaced_run": ref["shipped_run"],
            "replaced_tau": ref["shipped_tau"], "dest": str(dest), "sums": sums}
