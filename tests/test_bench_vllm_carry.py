"""The vLLM carry recipe without a device: bench/vllm_carry.py cuts the files into chunks no
larger than the budget, with a manifest; bench/vllm_device.py stashes each chunk as the
device calls do, then joins and verifies them back to the same bytes, and names a missing
or corrupt chunk instead of installing. (The payloads are random bytes under wheel and GGUF
names: splitting and verifying do not read them; pip and the real wheels run on the
device, docs/vllm.md.)"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def packed(tmp_path):
    carry = _module("vllm_carry")
    work = tmp_path / "work"
    (work / "wheels").mkdir(parents=True)
    payload = {"wheels/a-1.0-py3-none-any.whl": os.urandom(1_300_000),
               "wheels/b-2.0-py3-none-any.whl": os.urandom(700_000),
               "model.Q4_1.gguf": os.urandom(1_100_000)}
    for name, data in payload.items():
        (work / name).write_bytes(data)
    manifest = carry.pack(budget_mib=1.0, work=work, log=lambda *_: None)
    return carry, work, manifest, payload


def test_chunks_fit_the_budget_and_join_back_to_the_same_bytes(packed, tmp_path, monkeypatch):
    carry, work, manifest, payload = packed
    parts = manifest["parts"]
    assert len(parts) == 3 and all(p["bytes"] <= 2 ** 20 for p in parts)
    assert set(manifest["members"]) == set(payload)
    calls = carry.plan(work=work, check_command="echo ok")
    assert [c["carry"] for c in calls] == [[p["dir"]] for p in parts]
    assert "vllm_device.py install" in calls[-1]["command"] and "echo ok" in calls[-1]["command"]
    assert all("vllm_device.py install" not in c["command"] for c in calls[:-1])

    e3l = tmp_path / "e3l"
    for p in parts:  # one device call each: the chunk is copied out of the checkout
        r = subprocess.run([sys.executable, "-P", str(BENCH / "vllm_device.py"), "stash",
                            p["dir"]], cwd=BENCH.parent, env={**os.environ, "E3L": str(e3l)},
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    assert "chunks here: 01, 02, 03" in r.stdout
    monkeypatch.setenv("E3L", str(e3l))
    dev = _module("vllm_device")
    dev._unpack(dev._manifest(), tmp_path / "files")
    for name, data in payload.items():
        assert (tmp_path / "files" / name).read_bytes() == data


def test_a_missing_or_corrupt_chunk_is_named_before_anything_installs(packed, tmp_path,
                                                                      monkeypatch, capsys):
    carry, work, manifest, payload = packed
    e3l = tmp_path / "e3l"
    monkeypatch.setenv("E3L", str(e3l))
    dev = _module("vllm_device")
    for p in manifest["parts"]:
        dev.stash(str(BENCH.parent / p["dir"]))
    (e3l / "chunks" / "03").unlink()
    with open(e3l / "chunks" / "02", "r+b") as f:  # flip a byte: a fixed one may be there
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))
    with pytest.raises(SystemExit):
        dev.install()
    err = capsys.readouterr().err
    assert "chunks missing: ['03']; corrupt: ['02'] (of 3)" in err
    assert not (e3l / "site").exists() and not (e3l / "installed.json").exists()
    assert json.loads((e3l / "chunks" / "manifest.json").read_text()) == manifest


def _stash_all(dev, manifest):
    for p in manifest["parts"]:
        dev.stash(str(BENCH.parent / p["dir"]))


def test_a_carry_without_vllm_places_its_data_and_skips_what_is_installed(tmp_path,
                                                                          monkeypatch,
                                                                          capsys):
    """The study's carry (make study-carry): other wheels, a GGUF from elsewhere and data
    files; on the device the data lands in E3L/data, and wheels and target already
    installed from the same files are not installed again; a data-only carry just places
    its files."""
    carry = _module("vllm_carry")
    wheels, elsewhere = tmp_path / "device-wheels", tmp_path / "elsewhere"
    wheels.mkdir()
    elsewhere.mkdir()
    (wheels / "pydantic-2.0-py3-none-any.whl").write_bytes(os.urandom(300_000))
    gguf = elsewhere / "target.Q4_1.gguf"
    gguf.write_bytes(os.urandom(900_000))
    data = {"greedy.part01.npz": os.urandom(800_000), "prompts.part01.npz": b"p" * 1000}
    for name, payload in data.items():
        (elsewhere / name).write_bytes(payload)
    work = tmp_path / "study"
    manifest = carry.pack(budget_mib=1.0, work=work, wheels=wheels, gguf=gguf,
                          data=[elsewhere / n for n in data], log=lambda *_: None)
    assert set(manifest["members"]) == {"wheels/pydantic-2.0-py3-none-any.whl",
                                        "target.Q4_1.gguf", "data/greedy.part01.npz",
                                        "data/prompts.part01.npz"}
    calls = carry.plan(work=work)
    assert calls[-1]["command"].endswith("python3 -m eagle3lab --version")
    assert len(calls) == len(manifest["parts"]) == 2

    e3l = tmp_path / "e3l"
    monkeypatch.setenv("E3L", str(e3l))
    dev = _module("vllm_device")
    _stash_all(dev, manifest)
    software = {k: v for k, v in manifest["members"].items() if not k.startswith("data/")}
    (e3l / "installed.json").write_text(json.dumps({"tar_sha256": "an earlier carry",
                                                    "software": software}))
    dev.install()  # no pip here: the same wheels and GGUF are installed already
    assert "wheels and target: already installed" in capsys.readouterr().out
    for name, payload in data.items():
        assert (e3l / "data" / name).read_bytes() == payload
    stamp = json.loads((e3l / "installed.json").read_text())
    assert stamp["tar_sha256"] == manifest["tar_sha256"] and stamp["software"] == software
    assert not (e3l / "files").exists()

    (elsewhere / "greedy.part02.npz").write_bytes(b"more")
    only = carry.pack(budget_mib=1.0, work=work, data=[elsewhere / "greedy.part02.npz"],
                      log=lambda *_: None)
    assert set(only["members"]) == {"data/greedy.part02.npz"}
    _stash_all(dev, only)
    dev.install()
    assert "wheels and target: none carried" in capsys.readouterr().out
    assert (e3l / "data" / "greedy.part02.npz").read_bytes() == b"more"
    assert json.loads((e3l / "installed.json").read_text())["software"] == software


def test_data_files_are_checked_before_packing(tmp_path):
    from eagle3lab.errors import UserError

    carry = _module("vllm_carry")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for d in ("a", "b"):
        (tmp_path / d / "x.npz").write_bytes(b"x")
    with pytest.raises(UserError, match="two files are named x.npz"):
        carry.pack(budget_mib=1.0, work=tmp_path / "w", data=[tmp_path / "a" / "x.npz",
                                                             tmp_path / "b" / "x.npz"])
    with pytest.raises(UserError, match="no such file"):
        carry.pack(budget_mib=1.0, work=tmp_path / "w", data=[tmp_path / "nope.npz"])
    with pytest.raises(UserError, match="nothing to pack"):
        carry.pack(budget_mib=1.0, work=tmp_path / "w")
