"""The package works when installed, not only from the checkout (issue 27).

Prevents a non-editable install (`pip install .`, then `eagle3lab` run from anywhere) that
lacks a data file the package reads at run time: the capture tables of preflight were left
out of the wheel once, and preflight broke. The slow test builds the wheel from the files a
fresh clone has, checks that every non-Python file under eagle3lab/ is in it, installs it
(no dependencies, no index) into a temporary virtualenv that borrows the project's .venv
for the dependencies only, and runs the installed command from a directory outside the
checkout: preflight on a real launch (which reads the capture tables), inspect on a
checkpoint, logs on a committed vLLM log, accept --help, and report/demo, which need the
repository checkout (notebooks, parameters files, prompts) and say so in one line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOG = REPO / "tests" / "serverlogs" / "fixtures" / "vllm-0.25.1" / "spec-k3.log"


def package_data_files() -> list[str]:
    """Every file under eagle3lab/ that is not Python (nor a byte-code cache), as the
    wheel names it."""
    return sorted(p.relative_to(REPO).as_posix() for p in (REPO / "eagle3lab").rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc")
                  and "__pycache__" not in p.parts)


def _run(cmd: list, *, cwd: Path, env: dict | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _checked(cmd: list, **kw) -> subprocess.CompletedProcess:
    r = _run(cmd, **kw)
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """The wheel built from a clean copy of what a clone holds for it (pyproject.toml,
    README.md, eagle3lab/), installed into a fresh virtualenv whose only other path is the
    project's .venv site-packages (a .pth line: its .pth files, the editable install's
    among them, are not run); the command, its Python and a working directory outside the
    checkout."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "eagle3lab", src / "eagle3lab",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _checked([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
              "--no-index", "-w", root / "dist", src], cwd=root)
    wheel = next((root / "dist").glob("eagle3lab-*.whl"))
    venv = root / "venv"
    _checked([sys.executable, "-m", "venv", "--without-pip", venv], cwd=root)
    py = venv / "bin" / "python"
    purelib = Path(_checked([py, "-c", "import sysconfig; print(sysconfig.get_paths()"
                             "['purelib'])"], cwd=root).stdout.strip())
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (purelib / "_eagle3lab_test_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    _checked([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps",
              "--no-index", wheel], cwd=root)
    work = root / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["HF_HUB_OFFLINE"] = "1"
    return {"wheel": wheel, "venv": venv, "python": py, "cli": venv / "bin" / "eagle3lab",
            "cwd": work, "env": env, "root": root}


def _cli(inst: dict, *args) -> subprocess.CompletedProcess:
    return _run([inst["cli"], *args], cwd=inst["cwd"], env=inst["env"])


@pytest.mark.slow
def test_wheel_holds_every_data_file_and_is_what_runs(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    data = package_data_files()
    assert any(n.startswith("eagle3lab/preflight/capture_tables/") for n in data)
    assert [n for n in data if n not in names] == []  # pyproject.toml's package-data
    assert not installed["cwd"].resolve().is_relative_to(REPO)
    r = _checked([installed["python"], "-c", "import eagle3lab, eagle3lab.preflight.capture "
                  "as c; print(eagle3lab.__file__); print(len(c.table_sizes()))"],
                 cwd=installed["cwd"], env=installed["env"])
    where, tables = r.stdout.split()
    assert Path(where).resolve().is_relative_to(installed["venv"].resolve()), where
    assert int(tables) == len(list((REPO / "eagle3lab" / "preflight" / "capture_tables")
                                   .glob("*.json")))


@pytest.mark.slow
def test_preflight_reads_the_installed_capture_tables(installed, tmp_path):
    from eagle3lab.formats.convert import convert_checkpoint
    from eagle3lab.formats.demo import make_speculators_draft, make_tiny_target

    target = make_tiny_target(tmp_path / "target", weights=False)
    spec = make_speculators_draft(tmp_path / "spec", target=target, aux_ids=[2, 4, 5])
    sglang = convert_checkpoint(spec, tmp_path / "sglang", to="sglang", target=target,
                                engine="sglang-0.5.23").path
    glm = tmp_path / "glm"  # the same target under a class SGLang 0.5.23 cannot capture
    glm.mkdir()
    cfg = json.loads((target / "config.json").read_text())
    (glm / "config.json").write_text(json.dumps({**cfg, "architectures": ["Glm4ForCausalLM"]}))

    def launch(t):
        return ["python", "-m", "sglang.launch_server", "--model-path", t,
                "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", sglang,
                "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", "4"]

    pre = ["preflight", "--no-engine-parser", "--engine-version", "0.5.23"]
    r = _cli(installed, *pre, "--", *launch(target))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK: 0 error(s)" in r.stdout
    r = _cli(installed, *pre, "--json", "--", *launch(glm))
    assert r.returncode == 1, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert "aux-capture" in [f["code"] for f in out["findings"]]
    assert out["capture"]["entry"]["source"] == "sglang/srt/models/glm4.py"  # the table's

    r = _cli(installed, "inspect", spec, "--target", target)
    assert r.returncode == 0, r.stdout + r.stderr
    assert str(spec) in r.stdout


@pytest.mark.slow
def test_logs_and_accept_help_from_the_installed_package(installed):
    r = _cli(installed, "logs", LOG)
    assert r.returncode == 0, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith(f"{LOG}: vllm log, exited (phase shutdown")
    assert "drafter: eagle3 " in r.stdout and "aux layers [2, 15, 27]" in r.stdout
    r = _cli(installed, "accept", "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: eagle3lab accept")


@pytest.mark.slow
@pytest.mark.parametrize("command", ["demo", "report"])
def test_report_and_demo_need_the_checkout(installed, command):
    r = _cli(installed, command)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"eagle3lab {command}: error: eagle3lab {command} needs the "
                               f"repository checkout: {installed['cwd'] / 'notebooks'}")
    assert "run it from the root of an eagle3lab checkout" in lines[0]
    assert not list(installed["cwd"].iterdir())  # nothing written (no reports/ dir)


def test_report_outside_a_checkout_is_one_line(tmp_path, monkeypatch, capsys):
    """The same answer in-process: repo_root() is the working directory when the package
    does not live in a checkout; a named --notebooks directory that does not exist too."""
    import eagle3lab.cli.demo
    import eagle3lab.config
    import eagle3lab.report.plan
    from eagle3lab.cli import main

    for module in (eagle3lab.config, eagle3lab.cli.demo, eagle3lab.report.plan):
        if hasattr(module, "repo_root"):  # each module that bound the name
            monkeypatch.setattr(module, "repo_root", lambda: tmp_path)
    assert main(["report", "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"eagle3lab report: error: eagle3lab report needs the repository checkout: "
                   f"{tmp_path / 'notebooks'} not found (the notebooks, params/*.yaml and "
                   f"data/prompts/ are not part of the installed package); run it from the "
                   f"root of an eagle3lab checkout, or pass --notebooks DIR."]
    (tmp_path / "notebooks").mkdir()  # demo: its default parameters file is missing too
    assert main(["demo"]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'params' / 'cpu-demo.yaml'} not found" in err
    assert "pass --notebooks DIR and --params FILE" in err
    assert main(["report", "--notebooks", str(tmp_path / "nope")]) == 1
    assert "--notebooks " + str(tmp_path / "nope") + ": no such directory" in \
        capsys.readouterr().err
    assert not (tmp_path / "r").exists()
