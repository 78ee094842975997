"""`make device-wheels` without a network or a device (bench/device_wheels.py): the pinned
set agrees with pyproject.toml and the vLLM carry's pins, and each kind of drift is named;
the wheels' own requirements are checked for closure; a wheel set with a missing, extra or
altered wheel is refused; the Makefile target and the ignored folder are where the docs say.
(The payloads are small wheels written here: pip and the real wheels run on the device,
docs/device.md.)"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from eagle3lab.errors import UserError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dw():
    spec = importlib.util.spec_from_file_location("_bench_device_wheels",
                                                  REPO / "bench" / "device_wheels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _files(tmp_path: Path, *, pyproject=None, device=None) -> dict:
    """Copies of the three files, edited by the given functions (text -> text)."""
    out = {}
    for key, name, edit in (("pyproject", "pyproject.toml", pyproject),
                            ("requirements", "requirements-device.txt", device),
                            ("vllm", "requirements-vllm-h200.txt", None)):
        text = (REPO / name).read_text()
        (tmp_path / name).write_text(edit(text) if edit else text)
        out[key] = tmp_path / name
    return out


def test_committed_files_are_consistent(dw):
    assert dw.check() == []
    pins = [dw.norm(line.split("==")[0]) for line in
            (REPO / "requirements-device.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    deps = dw.pyproject_dependencies()
    assert {"speculators", "pydantic", "gguf"} <= set(pins)
    assert not set(pins) & set(dw.ON_IMAGE)  # carried or on the image, not both
    assert set(dw.LEFT_OUT) <= set(deps)


def test_check_names_each_drift(dw, tmp_path):
    new_dep = _files(tmp_path, pyproject=lambda t: t.replace(
        '"pillow",\n', '"pillow",\n    "newdep>=1",\n'))
    assert dw.check(**new_dep) == [
        "pyproject.toml: dependency 'newdep>=1' is neither in requirements-device.txt, "
        "ON_IMAGE nor LEFT_OUT (bench/device_wheels.py)"]
    torch_range = _files(tmp_path, pyproject=lambda t: t.replace('"torch>=2.9"',
                                                                 '"torch>=2.12"'))
    assert dw.check(**torch_range) == [
        "pyproject.toml: 'torch>=2.12' excludes the device image's torch 2.11.0"]
    other_pin = _files(tmp_path, device=lambda t: t.replace("pydantic==2.14.4",
                                                            "pydantic==2.14.3"))
    [line] = dw.check(**other_pin)
    assert line.startswith("requirements-device.txt: pydantic==2.14.3 but "
                           "requirements-vllm-h200.txt pins 2.14.4")

    def twice(t):
        return t + next(x for x in t.splitlines() if x.startswith("gguf==")) + "\n"

    assert dw.check(**_files(tmp_path, device=twice)) == [
        "requirements-device.txt: gguf is pinned 2 times"]
    bad = _files(tmp_path, device=lambda t: t.replace("gguf==0.19.0 --hash", "gguf==0.19.0"))
    with pytest.raises(UserError, match=r"requirements-device.txt:\d+: expected 'NAME==VERSION"):
        dw.check(**bad)


def _wheel(d: Path, name: str, version: str, requires: list[str]) -> Path:
    path = d / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", meta)
    return path


def test_closure_and_verify(dw, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    a = _wheel(wheels, "alpha", "1.0", ["beta>=2", "numpy", "gamma; python_version < '3.11'",
                                        "delta; extra == 'dev'"])
    b = _wheel(wheels, "beta", "2.0", ["omega"])
    assert dw.closure_problems([a, b]) == [
        "beta requires omega, which is neither carried nor on the device image"]
    req = tmp_path / "req.txt"

    def pin(*paths):
        req.write_text("".join(f"{dw.wheel_requirements(p)[0]}=={p.name.split('-')[1]} "
                               f"--hash=sha256:{hashlib.sha256(p.read_bytes()).hexdigest()}\n"
                               for p in paths))

    pin(a, b)
    with pytest.raises(UserError, match="beta requires omega"):
        dw.verify(wheels, requirements=req)
    b.unlink()
    b = _wheel(wheels, "beta", "2.0", ["numpy; sys_platform == 'linux'"])
    pin(a, b)
    assert dw.verify(wheels, requirements=req) == [a, b]
    _wheel(wheels, "zeta", "1.0", [])
    with pytest.raises(UserError, match="does not pin: zeta"):
        dw.verify(wheels, requirements=req)
    (wheels / "zeta-1.0-py3-none-any.whl").unlink()
    b.unlink()
    with pytest.raises(UserError, match="missing beta"):
        dw.verify(wheels, requirements=req)
    _wheel(wheels, "beta", "2.0", ["numpy"])  # the same name, other bytes
    with pytest.raises(UserError, match="beta-2.0-py3-none-any.whl differ from the pinned"):
        dw.verify(wheels, requirements=req)


def test_device_command_installs_offline_and_the_folder_is_ignored(dw):
    cmd = dw.install_command()
    assert cmd.startswith("python3 -m pip install -q --no-index --no-deps ")
    assert f"--target {dw.SITE} .device-wheels/*.whl && export PYTHONPATH={dw.SITE}:$PWD " \
        in cmd and cmd.endswith("|| exit 1;")
    r = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q",
                        ".device-wheels/x-1.0-py3-none-any.whl"])
    assert r.returncode == 0  # ignored: the wheels travel only when a call carries them


def test_makefile_target_runs_the_script(dw):
    text = (REPO / "Makefile").read_text()
    assert re.search(r"^\.PHONY:.* device-wheels", text, re.M)
    recipe = re.search(r"^device-wheels:.*\n((?:\t.*\n)+)", text, re.M)
    assert recipe is not None
    steps = [line.split("bench/device_wheels.py")[1].split()[0]
             for line in recipe.group(1).splitlines()]
    assert steps == ["check", "download", "plan"]
    assert "device-wheels" in (REPO / "docs" / "device.md").read_text()
