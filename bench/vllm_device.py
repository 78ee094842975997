"""The device side of the vLLM 0.25.1 recipe (bench/vllm_carry.py makes the chunks): stash
each carried chunk outside the checkout, then join, verify, install and prepare the target.

Prevents an install that fails an hour later inside vLLM: every chunk and every member is
checked against the manifest's sha256 before anything is installed, a missing chunk is
named, and the install is idempotent (a second `install` with the same manifest does
nothing), so a chain of calls can be re-run from any point while the machine is warm.
Standard library and eagle3lab.fsutil (itself standard library) only: it runs before
anything is installed.

    python3 -P bench/vllm_device.py stash .vllm/carry/NN   # one call per chunk
    python3 -P bench/vllm_device.py install                # joins, verifies, installs
    . /root/e3l/env.sh                        # PYTHONPATH, VLLM_* , E3L_TARGET, E3L_DATA

`install`: `pip install --no-index --no-deps --no-compile --target /root/e3l/site` of every
wheel, and `eagle3lab prepare-target --gguf ... --dest /root/e3l/target` (the default
target, converted and verified as on any machine), started as soon as its few
requirements are in place so that it overlaps the big install. E3L (default /root/e3l)
moves everything.

The chunks need not hold vLLM (`make study-carry`: eagle3lab's device wheels, the GGUF and
data files; docs/device.md): the data files (`data/NAME` in the manifest) are put in
/root/e3l/data, and wheels and target are installed again only when they differ from
those installed (a data-only carry to an installed machine just places its files).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout (-P)
from eagle3lab.fsutil import sha256_file  # noqa: E402  (standard library only)

E3L = Path(os.environ.get("E3L", "/root/e3l"))
CHUNKS = E3L / "chunks"
#: What `eagle3lab prepare-target` needs beyond the image (it starts before the rest).
BOOT = ("pydantic-", "pydantic_core-", "annotated_types-", "typing_inspection-", "gguf-")
ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0",  # flashinfer is not carried (docs/vllm.md)
       "HF_HUB_OFFLINE": "1",  # no index there: never wait on a hub lookup
       "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def fail(msg: str) -> None:
    print(f"vllm_device: error: {msg}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def stash(folder: str) -> None:
    src = Path(folder)
    if not (src / "part").is_file() or not (src / "manifest.json").is_file():
        fail(f"{folder} has no part/manifest.json: was it named in this call's carry?")
    CHUNKS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "manifest.json", CHUNKS / "manifest.json")
    tmp = CHUNKS / f".{src.name}.tmp"
    shutil.copyfile(src / "part", tmp)
    tmp.rename(CHUNKS / src.name)
    have = sorted(p.name for p in CHUNKS.iterdir() if p.name.isdigit())
    print(f"stashed {src.name} ({(CHUNKS / src.name).stat().st_size / 2**20:.1f} MiB); "
          f"chunks here: {', '.join(have)}", flush=True)


def _manifest() -> dict:
    path = CHUNKS / "manifest.json"
    if not path.is_file():
        fail(f"no chunks stashed in {CHUNKS} (the machine was fresh, or a call's carry was "
             f"missed): run the chain from its first call.")
    return json.loads(path.read_text())


def _unpack(manifest: dict, files: Path) -> None:
    """Verify every chunk, stream their concatenation through tar, verify every member."""
    missing, bad = [], []
    for p in manifest["parts"]:
        f = CHUNKS / Path(p["dir"]).name
        if not f.is_file():
            missing.append(Path(p["dir"]).name)
        elif f.stat().st_size != p["bytes"] or sha256_file(f) != p["sha256"]:
            bad.append(Path(p["dir"]).name)
    if missing or bad:
        fail(f"chunks missing: {missing or 'none'}; corrupt: {bad or 'none'} (of "
             f"{len(manifest['parts'])}). Carry them again (bench/vllm_carry.py plan).")

    class Joined(io.RawIOBase):  # the chunks in order, as one stream for tarfile
        def __init__(self, paths):
            self.paths, self.f = iter(paths), None

        def readable(self):
            return True

        def readinto(self, buf):
            while True:
                if self.f is None:
                    path = next(self.paths, None)
                    if path is None:
                        return 0
                    self.f = open(path, "rb")
                n = self.f.readinto(buf)
                if n:
                    return n
                self.f.close()
                self.f = None

    if files.exists():
        shutil.rmtree(files)
    files.mkdir(parents=True)
    joined = io.BufferedReader(Joined(CHUNKS / Path(p["dir"]).name
                                      for p in manifest["parts"]), 1 << 20)
    with tarfile.open(fileobj=joined, mode="r|") as tar:
        tar.extractall(files, filter="data")
    for name, digest in manifest["members"].items():
        if sha256_file(files / name) != digest:
            fail(f"{name} differs from the manifest after unpacking.")


def place_data(files: Path, names: list[str]) -> Path:
    """Move the carried data files (members data/NAME) to E3L/data/NAME."""
    dest = E3L / "data"
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        os.replace(files / name, dest / Path(name).name)
    return dest


def install() -> None:
    manifest = _manifest()
    stamp = E3L / "installed.json"
    old = json.loads(stamp.read_text()) if stamp.is_file() else {}
    if old.get("tar_sha256") == manifest["tar_sha256"]:
        print(f"already installed ({stamp}); nothing to do", flush=True)
        return
    software = {k: v for k, v in manifest["members"].items() if not k.startswith("data/")}
    data = sorted(k for k in manifest["members"] if k.startswith("data/"))
    t0 = time.perf_counter()
    files, site, boot = E3L / "files", E3L / "site", E3L / "site-boot"
    _unpack(manifest, files)
    t_unpack = time.perf_counter() - t0
    if data:
        print(f"{len(data)} data file(s) in {place_data(files, data)}", flush=True)
    if not software or software == old.get("software"):
        stamp.write_text(json.dumps({**old, "tar_sha256": manifest["tar_sha256"],
                                     "data": data}, indent=1))
        shutil.rmtree(files)
        print("wheels and target: " + ("none carried" if not software else
                                       "already installed") + f"; {stamp} updated", flush=True)
        return
    wheels = sorted((files / "wheels").glob("*.whl"))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", "--no-cache-dir", "--disable-pip-version-check", "--target"]
    for d in (site, boot):
        if d.exists():
            shutil.rmtree(d)
    subprocess.run(pip + [str(boot)] + [str(w) for w in wheels if w.name.startswith(BOOT)],
                   check=True)
    gguf = next(files.glob("*.gguf"), None)  # none carried: no target prepared
    target = E3L / "target"
    repo = Path(__file__).resolve().parent.parent
    prep_cmd = [sys.executable, "-m", "eagle3lab", "prepare-target", "--gguf", str(gguf),
                "--dest", str(target)]
    prep_log = open(E3L / "prepare-target.log", "w")
    prep = gguf and subprocess.Popen(prep_cmd, cwd=repo, stdout=prep_log,
                                     stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONPATH": f"{boot}:{repo}"})
    t1 = time.perf_counter()
    subprocess.run(pip + [str(site)] + [str(w) for w in wheels], check=True)
    t_pip = time.perf_counter() - t1
    if prep and prep.wait() != 0:  # a requirement the boot set lacked: once more with all
        print("prepare-target with the boot set failed; retrying with the full install",
              flush=True)
        prep = subprocess.run(prep_cmd, cwd=repo, stdout=prep_log, stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONPATH": f"{site}:{repo}"})
        if prep.returncode:
            fail(f"prepare-target failed; see {E3L / 'prepare-target.log'}:\n"
                 + (E3L / "prepare-target.log").read_text()[-1500:])
    shutil.rmtree(boot)
    env = "".join(f"export {k}={v}\n" for k, v in ENV.items())
    (E3L / "env.sh").write_text(
        f"export PYTHONPATH={site}:$PWD${{PYTHONPATH:+:$PYTHONPATH}}\n"
        f"export PATH={site}/bin:$PATH\nexport E3L_TARGET={target}\n"
        f"export E3L_DATA={E3L / 'data'}\n{env}")
    stamp.write_text(json.dumps({"tar_sha256": manifest["tar_sha256"], "software": software,
                                 "data": data,
                                 "wheels": len(wheels), "unpack_s": round(t_unpack, 1),
                                 "pip_s": round(t_pip, 1),
                                 "total_s": round(time.perf_counter() - t0, 1)}, indent=1))
    shutil.rmtree(files)
    print(f"installed {len(wheels)} wheels into {site} (unpack {t_unpack:.0f} s, pip "
          f"{t_pip:.0f} s), target at {target}; total {time.perf_counter() - t0:.0f} s. "
          f"Next: . {E3L / 'env.sh'}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    sub.add_parser("stash", help="copy a carried chunk folder to E3L/chunks").add_argument(
        "folder")
    sub.add_parser("install", help="join, verify, install, prepare the target")
    args = ap.parse_args()
    stash(args.folder) if args.what == "stash" else install()


if __name__ == "__main__":
    main()
