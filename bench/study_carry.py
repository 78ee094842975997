"""Get this checkout ready for each kind of device call in a study session, and check that
it will travel, before the call spends device time.

Prevents two failures that cost machines: a call refused because the working tree that
travels (tracked and untracked-not-ignored files, plus the carried folder) is over the
device tool's 64 MiB, and a launch from a checkout without the packs, which stops the
chain at once (session 14). The session's three states, in order (docs/study.md, "How a
session runs"):

    python3 bench/study_carry.py stash    # before the stash calls: every tracked file
                                          # under data/ out; each chunk folder checked
    python3 bench/study_carry.py launch   # before the launch call: data/ back, less what
                                          # the device never reads; packs checked
                                          # (results come back without the finished
                                          # runs' metrics.jsonl: add only new runs)
    python3 bench/study_carry.py back     # afterwards: the whole checkout again
    python3 bench/study_carry.py budget   # MiB a chunk may take beside the stash calls'
                                          # tree, changing nothing (`make study-carry`
                                          # cuts the chunks to it, data/ in or out)

Each prints what would travel and exits 1 with one line when it would not. Standard
library and bench/vllm_carry.py's reading of what travels (`travelling`, `tree_bytes`,
the call limit);
git does the file work (`git ls-files`, `git checkout -- data`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # vllm_carry, and the checkout's eagle3lab (-P)
from vllm_carry import (CALL_LIMIT_MIB, MARGIN_MIB, travelling,  # noqa: E402  (standard library)
                        tree_bytes)

MIB = 1 << 20
STUDY = "data/studies/h200-grok"
PACKS = f"{STUDY}/packs"
CHUNKS = ".vllm/study/carry"
#: What the launch leaves out: earlier sessions' partial results and the default drafter
#: (the chain never reads them; its ranker and reference are the -sglang one, whose
#: weights the weak stage hashes, so that one stays), and each finished run's
#: metrics.jsonl (below).
LAUNCH_OUT = (f"{STUDY}/session-", "data/drafters/smollm2-135m-instruct/")
RUNS = f"{STUDY}/runs/"


class CarryError(Exception):
    """One line for the user."""


def _git(root: Path, *args: str) -> bytes:
    proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True)
    if proc.returncode:
        raise CarryError(f"git {' '.join(args)}: {proc.stderr.decode().strip()}")
    return proc.stdout


def _paths(root: Path, *args: str) -> list[str]:
    """The paths a `git ... -z` command lists."""
    return [p.decode() for p in _git(root, *args).split(b"\0") if p]


def _files(root: Path, *args: str) -> list[str]:
    return _paths(root, "ls-files", "-z", *args)


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _largest(files: dict[str, int], n: int = 3) -> str:
    tops: dict[str, int] = {}
    for rel, size in files.items():
        top = "/".join(rel.split("/")[:3]) if rel.startswith("data/") else rel.split("/")[0]
        tops[top] = tops.get(top, 0) + size
    big = sorted(tops.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k} {v / MIB:.1f} MiB" for k, v in big)


def _no_edits(root: Path) -> None:
    """Refuse before any file work when a tracked file under data/ has changes not
    committed: `git checkout -- data` (and the stash's removal) would lose them. Deleted
    files are the states' own doing and are fine."""
    edited = _paths(root, "diff", "--name-only", "-z", "--diff-filter=ACMRTUXB", "HEAD",
                    "--", "data")
    if edited:
        raise CarryError(f"{len(edited)} tracked file(s) under data/ changed since the last "
                         f"commit (e.g. {edited[0]}): commit them first, or this would "
                         "lose them")


def _remove(root: Path, rels: list[str]) -> int:
    for rel in rels:
        (root / rel).unlink(missing_ok=True)
    return len(rels)


def stash(root: Path, *, limit_mib: float) -> list[str]:
    """Every tracked file under data/ out of the checkout; then each chunk folder under
    .vllm/study/carry must fit beside what is left."""
    _no_edits(root)
    chunks = sorted(p for p in (root / CHUNKS).glob("*") if p.is_dir())
    if not chunks:
        raise CarryError(f"no chunk folders under {CHUNKS}: make them first "
                         "(make study-carry)")
    removed = _remove(root, _files(root, "--cached", "--", "data"))
    tree = tree_bytes(root)
    lines = [f"stash: {removed} tracked file(s) under data/ taken out; the tree left is "
             f"{tree / MIB:.1f} MiB"]
    for chunk in chunks:
        total = tree + _folder_bytes(chunk)
        rel = chunk.relative_to(root).as_posix()
        if total > limit_mib * MIB:
            raise CarryError(f"{rel} with the tree is {total / MIB:.1f} MiB, over the "
                             f"{limit_mib:g} MiB a call carries: cut smaller chunks")
        lines.append(f"  call: python3 -P bench/vllm_device.py stash {rel}   carry "
                     f"[\"{rel}\"]  ({total / MIB:.1f} MiB)")
    return lines


def budget(root: Path, *, limit_mib: float) -> list[str]:
    """The MiB a chunk may take beside the tree the stash calls send (the checkout less
    every tracked file under data/), less vllm_carry's margin; nothing changes. Cutting the
    chunks to this, not to the whole checkout (124 MiB with data/), lets `make
    study-carry` run in a fresh checkout (session 19: it refused, its budget negative)."""
    data = set(_files(root, "--cached", "--", "data"))
    tree = {rel: size for rel, size in travelling(root).items() if rel not in data}
    tree_mib = sum(tree.values()) / MIB
    mib = limit_mib - tree_mib - MARGIN_MIB
    if mib < 1:
        raise CarryError(f"the stash calls' tree is {tree_mib:.1f} MiB: "
                         f"{mib:.1f} MiB left for a chunk of the {limit_mib:g} a call "
                         f"carries; largest: {_largest(tree)}")
    return [f"{mib:.2f}"]


def _finished_metrics(root: Path, tracked: list[str]) -> list[str]:
    """metrics.jsonl of every committed run whose run.json says done: the device restores a
    finished run from its run.json and live.json and never reads its curve (only running
    runs' metrics feed `finish_estimate`), and these are most of the study's bytes."""
    out = []
    for rel in tracked:
        if not (rel.startswith(RUNS) and rel.endswith("/metrics.jsonl")):
            continue
        info = root / rel[: -len("metrics.jsonl")] / "run.json"
        try:
            done = json.loads(info.read_text()).get("status") == "done"
        except (OSError, ValueError):
            done = False
        if done:
            out.append(rel)
    return out


def launch(root: Path, *, limit_mib: float) -> list[str]:
    """data/ back as committed, less the partial sessions, the default drafter and the
    finished runs' curves; the packs must be there and the whole must fit."""
    _no_edits(root)
    _git(root, "checkout", "--", "data")
    tracked = _files(root, "--cached", "--", "data")
    packs = [rel for rel in tracked if rel.startswith(PACKS + "/")]
    if not packs:
        raise CarryError(f"no packs tracked under {PACKS}: the chain would stop at once")
    missing = [rel for rel in packs if not (root / rel).is_file()]
    if missing:
        raise CarryError(f"{len(missing)} pack file(s) missing after git checkout, e.g. "
                         f"{missing[0]}: the chain would stop at once")
    out = [rel for rel in tracked if rel.startswith(LAUNCH_OUT)]
    curves = _finished_metrics(root, tracked)
    out += curves
    _remove(root, out)
    files = travelling(root)
    total = sum(files.values())
    if total > limit_mib * MIB:
        raise CarryError(f"the launch's tree is {total / MIB:.1f} MiB, over the {limit_mib:g}"
                         f" MiB a call carries; largest: {_largest(files)}")
    return [f"launch: {len(packs)} pack file(s) in, {len(out)} file(s) left out ("
            f"{len(curves)} finished runs' metrics.jsonl among them); {total / MIB:.1f} MiB "
            "travels"]


def back(root: Path) -> list[str]:
    _no_edits(root)
    _git(root, "checkout", "--", "data")
    return [f"back: data/ as committed ({tree_bytes(root) / MIB:.1f} MiB "
            "would travel now)"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Get the checkout ready for a study session's device calls (stash, "
                    "launch, back) and check that each will travel: under the device "
                    "tool's working-tree limit, with the packs in for the launch; or print "
                    "the size to cut the stash chunks to (budget).")
    ap.add_argument("state", choices=("stash", "launch", "back", "budget"),
                    help="stash: tracked data/ out, chunks checked; launch: data/ back "
                         "less what the device never reads, packs checked; back: data/ "
                         "as committed; budget: print the MiB a chunk may take beside the "
                         "stash calls' tree (changes nothing)")
    ap.add_argument("--root", type=Path, default=HERE.parent,
                    help="the checkout (default: this script's)")
    ap.add_argument("--limit-mib", type=float, default=float(CALL_LIMIT_MIB),
                    help="what one call may carry, in MiB (the device tool's limit)")
    args = ap.parse_args(argv)
    try:
        if args.state == "stash":
            lines = stash(args.root, limit_mib=args.limit_mib)
        elif args.state == "launch":
            lines = launch(args.root, limit_mib=args.limit_mib)
        elif args.state == "budget":
            lines = budget(args.root, limit_mib=args.limit_mib)
        else:
            lines = back(args.root)
    except CarryError as e:
        print(f"study_carry: error: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
