"""An unfinished run's newest checkpoint, carried from one bare device machine to the next.

Prevents a run longer than one session from never finishing: the study's runs resume
exactly from a step checkpoint (eagle3lab.train.checkpoints: weights, optimizer, scheduler,
data position, RNG; the deadline's SIGTERM writes one of the step reached), but every H200
session starts on a bare machine with 1,800 s of device time, and speculators' recipe at
128M tokens needs ~1,350 s of training alone (docs/study.md, session 10: stopped at 39.7M
tokens, its work lost).

`out` packs each unfinished run's newest complete checkpoint, its run.json, its
metrics.jsonl and its live.json (the points decoded while it trained) into
resume-RUN.tar.gz, cut into parts of at most --part-mib (the device returns files of at
most 16 MiB, 64 MiB a call), kept in WORK/run-carry/. The frozen tensors the checkpoint
names (the target's embedding, a frozen head) stay behind, their sha256 in the carried
checkpoint's left-out.json: the next machine builds them again from the target and the
trainer checks them (`load_checkpoint`). The study's 128M run so carries 54.5 MiB in one
call instead of 138.5 MiB in three (docs/study.md, sessions 18 and 23). Each call copies
the parts not yet returned to --dest, at most --max-mib of them, and says how many are
left. `in`, on the next machine after `plan`, joins
the parts and puts the checkpoint into the run's folder, so `train` resumes the run where
it stopped. A manifest records the run, its step and tokens and the sha256 of its train
settings; `in` refuses a checkpoint whose settings differ from this plan's, and keeps a
checkpoint as new or newer already there. (The trainer checks again:
`check_resume_settings`, the data's identity.)

    python3 -P bench/run_carry.py out --work W --dest $OUT [--runs NAME,...] [--max-mib 60]
    python3 -P bench/run_carry.py in --work W PART [PART ...]

On the device: bench/study_chain.sh runs `in` on /root/e3l/data/resume-*.tar.gz* (carried
with `bench/vllm_carry.py pack ... --data`) after `plan`; `train ... --finish-margin-s -1`
starts a run the deadline will stop (docs/study.md, "Carrying a run to the next session").
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout (-P)

FORMAT = "eagle3lab-run-carry"
MANIFEST = "eagle3lab-run-carry.json"
STAGE = "run-carry"  # WORK/run-carry: the packed parts and what was returned of them


def archive_name(run: str) -> str:
    return f"resume-{run}.tar.gz"


def settings_sha256(train: dict) -> str:
    """The sha256 of a run's train settings as study.json plans them (canonical JSON)."""
    from eagle3lab.fsutil import sha256_bytes

    return sha256_bytes(json.dumps(train, sort_keys=True).encode())


def _arms(work: Path) -> dict[str, dict]:
    from eagle3lab.study.atscale import read_study

    return {a["name"]: a for a in read_study(work / "study")["arms"]}


def _step(ckpt: Path) -> int:
    return int(ckpt.name.split("-")[1])


def pack(*, work: Path, runs: list[str] | None = None, part_bytes: int = 15 * 2**20,
         log=print) -> list[dict]:
    """Pack each chosen run's newest checkpoint into WORK/run-carry/ (once per checkpoint:
    a pack of the same step is kept). `runs`: names (default every unfinished run with a
    checkpoint). [{"run", "step", "tokens", "parts": [paths], "bytes"}]."""
    from eagle3lab.errors import UserError
    from eagle3lab.fsutil import write_parts
    # the run's records travel with its checkpoint: those `collect` commits (live.json: the
    # points decoded while it trained, whose checkpoints stay behind)
    from eagle3lab.study.atscale import RUN_FILES
    from eagle3lab.train.checkpoints import is_finished, list_checkpoints, versions

    arms = _arms(work)
    if runs:
        unknown = [r for r in runs if r not in arms]
        if unknown:
            raise UserError(f"--runs: no run named {', '.join(unknown)} in "
                            f"{work / 'study' / 'study.json'}.")
    names = runs or [n for n, a in arms.items() if not is_finished(a["train"]["out"])
                     and list_checkpoints(Path(a["train"]["out"]))]
    stage = work / STAGE
    packed = []
    for name in names:
        out = Path(arms[name]["train"]["out"])
        ckpts = list_checkpoints(out) if out.is_dir() else []
        skip = "finished" if is_finished(out) else None if ckpts else "no checkpoint"
        if skip:
            log(f"{name}: {skip}: nothing to carry")
            continue
        newest = ckpts[-1]
        info = json.loads((newest / "checkpoint.json").read_text())
        record = stage / f"{name}.json"
        rec = json.loads(record.read_text()) if record.is_file() else None
        if rec is not None and rec["manifest"]["step"] == info["step"]:
            log(f"{name}: step {info['step']} already packed ({len(rec['parts'])} parts)")
        else:
            manifest = {"format": FORMAT, "version": 1, "run": name, "step": info["step"],
                        "tokens": info["tokens"], "checkpoint": newest.name,
                        "settings_sha256": settings_sha256(arms[name]["train"]),
                        "made_by": versions()}
            with tempfile.TemporaryDirectory(prefix="run-carry.") as tmp:
                whole = Path(tmp) / archive_name(name)
                ckpt, manifest["left_out"] = _without_frozen(newest, info.get("frozen"),
                                                             Path(tmp) / "ckpt")
                (Path(tmp) / MANIFEST).write_text(json.dumps(manifest, indent=1))
                with tarfile.open(whole, "w:gz", compresslevel=6) as tar:
                    tar.add(Path(tmp) / MANIFEST, arcname=MANIFEST)
                    for f in RUN_FILES:
                        if (out / f).is_file():
                            tar.add(out / f, arcname=f)
                    tar.add(ckpt, arcname=f"checkpoints/{newest.name}")
                size = whole.stat().st_size
                parts = write_parts(stage, archive_name(name), whole.read_bytes(),
                                    part_bytes=part_bytes)
            rec = {"manifest": manifest, "parts": [p.name for p in parts], "bytes": size,
                   "returned": []}
            record.write_text(json.dumps(rec, indent=1))
            log(f"{name}: {newest.name} ({info['tokens']:,} tokens), {size / 2**20:.1f} MiB "
                f"in {len(parts)} part(s)" + (f"; left out (frozen, built again there): "
                                             f"{', '.join(manifest['left_out'])}"
                                             if manifest["left_out"] else ""))
        packed.append({"run": name, "step": info["step"], "tokens": info["tokens"],
                       "parts": rec["parts"], "bytes": rec["bytes"]})
    return packed


def _without_frozen(ckpt: Path, frozen: list[str] | None,
                    tmp: Path) -> tuple[Path, list[str]]:
    """The checkpoint to carry: without the frozen tensors its checkpoint.json names
    (`frozen`, as pack read it: the target's embedding, a frozen head: 132 of the 128M
    run's 194 MB), which the next machine builds again from the target, their sha256 in
    CKPT/left-out.json for the trainer to check (eagle3lab.train.checkpoints
    .load_checkpoint). A checkpoint without that list (made before it was recorded) or with
    sharded weights goes whole; one carried already (no new checkpoint since) goes as it
    came, its left-out.json kept."""
    from safetensors.torch import load_file, save_file

    from eagle3lab.formats.reader import parse_safetensors_header
    from eagle3lab.fsutil import atomic_write_json
    from eagle3lab.train.checkpoints import LEFT_OUT, LEFT_OUT_FORMAT, tensor_sha256

    files = sorted(ckpt.glob("*.safetensors"))
    if not frozen or (ckpt / "sharded").exists() or [f.name for f in files] != [
            "model.safetensors"]:
        return ckpt, []
    weights = load_file(str(files[0]))
    if not set(frozen) & set(weights):  # carried here without them: the record goes along
        return ckpt, sorted(json.loads((ckpt / LEFT_OUT).read_text())["sha256"]
                            if (ckpt / LEFT_OUT).is_file() else [])
    _, meta = parse_safetensors_header(files[0])
    left = {k: tensor_sha256(weights.pop(k)) for k in frozen if k in weights}
    shutil.copytree(ckpt, tmp, ignore=shutil.ignore_patterns("model.safetensors"))
    save_file(weights, str(tmp / "model.safetensors"), metadata=meta)
    atomic_write_json(tmp / LEFT_OUT, {"format": LEFT_OUT_FORMAT, "version": 1,
                                       "sha256": left})
    return tmp, sorted(left)


def give(*, work: Path, dest: Path, max_bytes: int = 60 * 2**20, log=print) -> dict:
    """Copy the packed parts not yet returned to `dest`, at most `max_bytes` in all (whole
    parts, in order). {"copied": [names], "left": [names]}."""
    stage = work / STAGE
    dest.mkdir(parents=True, exist_ok=True)
    copied, left, used = [], [], 0
    for record in sorted(stage.glob("*.json")) if stage.is_dir() else []:
        rec = json.loads(record.read_text())
        for part in rec["parts"]:
            if part in rec["returned"]:
                continue
            size = (stage / part).stat().st_size
            if used + size > max_bytes:
                left.append(part)
                continue
            shutil.copyfile(stage / part, dest / part)
            rec["returned"].append(part)
            copied.append(part)
            used += size
        record.write_text(json.dumps(rec, indent=1))
    log(f"{len(copied)} part(s) to {dest} ({used / 2**20:.1f} MiB)"
        + (f"; {len(left)} left for the next call: {', '.join(left)}" if left
           else "; every part returned"))
    return {"copied": copied, "left": left}


def _groups(parts: list[Path]) -> dict[str, list[Path]]:
    from eagle3lab.errors import UserError

    groups: dict[str, list[Path]] = {}
    for p in map(Path, parts):
        m = re.fullmatch(r"resume-(.+)\.tar\.gz(\.part\d+)?", p.name)
        if not m:
            raise UserError(f"{p}: not a part `run_carry.py out` wrote "
                            "(resume-RUN.tar.gz or resume-RUN.tar.gz.partNN).")
        groups.setdefault(m[1], []).append(p)
    return groups


def unpack(*, work: Path, parts: list[Path], log=print) -> list[dict]:
    """Join each run's parts and put its checkpoint and its records (atscale.RUN_FILES)
    into the run's folder of this plan (WORK/study/study.json). [{"run", "step",
    "unpacked": bool, "why"}]; a refusal (another plan's settings, a run not planned) is
    one line each."""
    from eagle3lab.errors import UserError
    from eagle3lab.fsutil import atomic_dir, atomic_path, tar_of_parts
    from eagle3lab.study.atscale import RUN_FILES
    from eagle3lab.train.checkpoints import is_finished, list_checkpoints

    arms = _arms(work)
    results = []
    for name, group in sorted(_groups(parts).items()):
        with tempfile.TemporaryDirectory(prefix="run-carry.") as tmp:
            x = Path(tmp) / "x"
            with tar_of_parts(group, name=archive_name(name),
                              what=f"run {name}'s carry") as (tar, group):
                tar.extractall(x, filter="data")
            if not (x / MANIFEST).is_file():
                raise UserError(f"{group[0]}: no {MANIFEST} inside: not a run that "
                                "bench/run_carry.py out packed.")
            man = json.loads((x / MANIFEST).read_text())
            res = {"run": name, "step": man["step"], "unpacked": False, "why": None}
            results.append(res)
            arm = arms.get(name)
            out = Path(arm["train"]["out"]) if arm else None
            have = list_checkpoints(out) if out is not None and out.is_dir() else []
            if arm is None:
                res["why"] = f"not a run of {work / 'study' / 'study.json'}"
            elif man["settings_sha256"] != settings_sha256(arm["train"]):
                res["why"] = ("its train settings differ from this plan's (another config); "
                              "it would not resume")
            elif is_finished(out):
                res["why"] = "already finished here"
            elif have and _step(have[-1]) >= man["step"]:
                res["why"] = f"{have[-1].name} is here already (as new or newer)"
            if res["why"]:
                log(f"{name}: step {man['step']} not unpacked: {res['why']}")
                continue
            for f in RUN_FILES:  # the records the checkpoint belongs to
                if (x / f).is_file():
                    with atomic_path(out / f) as tmp_f:
                        shutil.copyfile(x / f, tmp_f)
            with atomic_dir(out / "checkpoints" / man["checkpoint"]) as staged:
                shutil.copytree(x / "checkpoints" / man["checkpoint"], staged,
                                dirs_exist_ok=True)
            res["unpacked"] = True
            log(f"{name}: {man['checkpoint']} ({man['tokens']:,} tokens) into {out}; "
                "`train` resumes it there")
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="verb", required=True)
    o = sub.add_parser("out", help="pack unfinished runs' newest checkpoints; copy the parts "
                       "not yet returned to --dest")
    o.add_argument("--work", type=Path, required=True, help="the study's work directory")
    o.add_argument("--dest", type=Path, required=True, help="where the parts go ($OUT)")
    o.add_argument("--runs", default="", help="comma-separated run names (default: every "
                   "unfinished run with a checkpoint)")
    o.add_argument("--part-mib", type=float, default=15.0,
                   help="largest part (the device returns files of at most 16 MiB)")
    o.add_argument("--max-mib", type=float, default=60.0,
                   help="parts copied to --dest in this call, at most (the device returns "
                   "64 MiB a call; the rest waits for the next call)")
    i = sub.add_parser("in", help="put carried checkpoints into this plan's run folders")
    i.add_argument("--work", type=Path, required=True, help="the study's work directory")
    i.add_argument("parts", type=Path, nargs="+",
                   help="resume-RUN.tar.gz or its .partNN pieces, of one run or several")
    args = ap.parse_args(argv)
    if args.verb == "out":
        pack(work=args.work, runs=[r for r in args.runs.split(",") if r] or None,
             part_bytes=int(args.part_mib * 2**20))
        give(work=args.work, dest=args.dest, max_bytes=int(args.max_mib * 2**20))
        return 0
    res = unpack(work=args.work, parts=args.parts)
    return 0 if all(r["unpacked"] for r in res) else 1


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("run_carry.py", main))
