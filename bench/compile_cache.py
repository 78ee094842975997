"""Inductor's compile cache, carried from one bare device machine to the next.

Prevents the ~280 s of each H200 session (of its 1,800) spent compiling the same kernels
again: every session starts on a bare machine, and the study's runs compile flex
attention's forward and backward (ptxas ~100 s a kernel) before their first step, where
a run started on a warm cache logged its first step ~21 s after its start (docs/study.md,
session 5). `out` packs the cache folder (TORCHINDUCTOR_CACHE_DIR; Triton's kernels live
inside it, in triton/) into one tar.gz, cut into parts the device returns; `in` joins the
parts and unpacks them into the next machine's cache folder. A manifest inside the tar
records what made the cache (torch, Triton, CUDA, the GPU). Inductor's keys include
these, so a cache made by other versions is unpacked but misses; `in` says so.

    python3 -P bench/compile_cache.py out --cache DIR --dest $OUT [--part-mib 15] [--max-mib 30]
    python3 -P bench/compile_cache.py in --cache DIR PART [PART ...]

On the device, bench/study_chain.sh runs `in` on /root/e3l/data/inductor-cache.tar.gz*
(carried with `bench/vllm_carry.py pack ... --data`), and bench/study_poll.sh runs `out`
when STUDY_CACHE_OUT=1 (docs/device.md, "Inductor's cache").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout (-P)

NAME = "inductor-cache.tar.gz"
MANIFEST = "eagle3lab-compile-cache.json"
#: what `out` leaves out: inductor's lock files and files still being written
SKIP = re.compile(r"(^|/)locks(/|$)|\.lock$|\.tmp[^/]*$")


def default_cache() -> Path:
    """The folder inductor uses here: TORCHINDUCTOR_CACHE_DIR, else torch's default."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return Path(default_cache_dir())


def environment() -> dict:
    """The versions inductor's cache keys depend on, as far as this machine has them."""
    import torch

    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": None,
           "gpu": None}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def _files(cache: Path) -> list[Path]:
    return sorted(p for p in cache.rglob("*")
                  if p.is_file() and not p.is_symlink()
                  and not SKIP.search(p.relative_to(cache).as_posix()))


def pack(*, cache: Path, dest: Path, part_bytes: int = 15 * 2**20,
         max_bytes: int = 30 * 2**20, log=print) -> dict:
    """Pack `cache` into dest/inductor-cache.tar.gz, or parts .part00, .part01, ... of at
    most `part_bytes` each. Nothing is written when the tar.gz would exceed `max_bytes` (it
    would crowd the results out of the device's 64 MiB return) or the cache is empty.
    {"files", "bytes", "parts": [paths], "skipped": reason or None, "environment"}."""
    from eagle3lab.errors import UserError
    from eagle3lab.fsutil import write_parts

    cache, dest = Path(cache), Path(dest)
    if not cache.is_dir():
        raise UserError(f"--cache {cache}: no such folder (nothing was compiled there, or "
                        "TORCHINDUCTOR_CACHE_DIR points elsewhere).")
    files = _files(cache)
    out = {"files": len(files), "bytes": 0, "parts": [], "skipped": None,
           "environment": environment()}
    if not files:
        out["skipped"] = "the cache is empty"
        log(f"{cache}: empty, nothing packed")
        return out
    manifest = json.dumps({"made_by": out["environment"], "files": len(files),
                           "raw_bytes": sum(p.stat().st_size for p in files)}, indent=1)
    with tempfile.TemporaryDirectory(prefix="compile-cache.") as tmp:
        whole = Path(tmp) / NAME
        (Path(tmp) / MANIFEST).write_text(manifest)
        with tarfile.open(whole, "w:gz", compresslevel=6) as tar:
            tar.add(Path(tmp) / MANIFEST, arcname=MANIFEST)
            for p in files:
                tar.add(p, arcname=p.relative_to(cache).as_posix(), recursive=False)
        out["bytes"] = size = whole.stat().st_size
        if size > max_bytes:
            out["skipped"] = (f"{size / 2**20:.1f} MiB packed, over --max-mib "
                              f"{max_bytes / 2**20:g}")
            log(f"{cache}: {len(files)} files, {out['skipped']}: not packed")
            return out
        out["parts"] = [str(p) for p in write_parts(dest, NAME, whole.read_bytes(),
                                                    part_bytes=part_bytes)]
    log(f"{cache}: {len(files)} files, {size / 2**20:.1f} MiB packed in "
        f"{len(out['parts'])} part(s) in {dest}")
    return out


def unpack(*, parts: list[Path], cache: Path, log=print) -> dict:
    """Join `parts` (one tar.gz, or its .partNN pieces) and unpack them into `cache`.
    {"files", "made_by", "here", "matches": whether torch/Triton/CUDA/GPU are the same}."""
    from eagle3lab.errors import UserError
    from eagle3lab.fsutil import tar_of_parts

    cache = Path(cache)
    with tar_of_parts([Path(p) for p in parts], name=NAME, what="the cache") as (tar, parts):
        cache.mkdir(parents=True, exist_ok=True)
        members = tar.getmembers()
        if MANIFEST not in {m.name for m in members}:
            raise UserError(f"{parts[0]}: no {MANIFEST} inside: not a cache that "
                            "bench/compile_cache.py out packed.")
        made_by = json.loads(tar.extractfile(MANIFEST).read())["made_by"]
        members = [m for m in members if m.name != MANIFEST]
        tar.extractall(cache, members=members, filter="data")
    here = environment()
    keys = ("torch", "cuda", "triton", "gpu")
    matches = all(made_by.get(k) == here.get(k) for k in keys)
    log(f"{len(members)} cached files into {cache}" + (
        "" if matches else "; made by " + ", ".join(
            f"{k} {made_by.get(k)}" for k in keys if made_by.get(k) != here.get(k))
        + " where this machine has " + ", ".join(
            f"{k} {here.get(k)}" for k in keys if made_by.get(k) != here.get(k))
        + ": inductor will compile again"))
    return {"files": len(members), "made_by": made_by, "here": here, "matches": matches}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="verb", required=True)
    o = sub.add_parser("out", help="pack this machine's cache into parts under --dest")
    o.add_argument("--cache", type=Path, default=None,
                   help="the cache folder (default: TORCHINDUCTOR_CACHE_DIR, else torch's)")
    o.add_argument("--dest", type=Path, required=True, help="where the parts go ($OUT)")
    o.add_argument("--part-mib", type=float, default=15.0,
                   help="largest part (the device returns files of at most 16 MiB)")
    o.add_argument("--max-mib", type=float, default=30.0,
                   help="pack nothing if the tar.gz would be larger (the return holds 64 "
                   "MiB in all, results included)")
    i = sub.add_parser("in", help="unpack carried parts into this machine's cache")
    i.add_argument("--cache", type=Path, default=None,
                   help="the cache folder (default: TORCHINDUCTOR_CACHE_DIR, else torch's)")
    i.add_argument("parts", type=Path, nargs="+", help=f"{NAME} or its .partNN pieces")
    args = ap.parse_args(argv)
    cache = args.cache or default_cache()
    if args.verb == "out":
        pack(cache=cache, dest=args.dest, part_bytes=int(args.part_mib * 2**20),
             max_bytes=int(args.max_mib * 2**20))
    else:
        unpack(parts=args.parts, cache=cache)
    return 0


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("compile_cache.py", main))
