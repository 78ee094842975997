"""`eagle3lab report`: parameters files checked before anything runs, the failure path (a
notebook that raises skips only its dependents and the index says where and why), the
whole plan end to end on a tiny target, and stage reuse on a second run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------
# record_summary: the contract between a notebook's last cell and the index
# ---------------------------------------------------------------------------------------
def test_summary_bundle_round_trips_and_cleans_values():
    import numpy as np

    from eagle3lab.report.summary import MIME, read_summary, summary_bundle

    bundle = summary_bundle("05_acceptance", dict(
        tau=np.float64(2.25), acc=[0.5, np.float32(0.25)], speedup=float("nan"),
        arm="healthy", ok=True))
    assert bundle[MIME]["numbers"] == {"tau": 2.25, "acc": [0.5, 0.25], "speedup": None,
                                       "arm": "healthy", "ok": True}
    assert "tau" in bundle["text/plain"] and "<table" in bundle["text/html"]
    nb = {"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "display_data", "data": json.loads(json.dumps(bundle)),
         "metadata": {}}]}]}
    assert read_summary(nb)["tau"] == 2.25
    assert read_summary({"cells": []}) is None
    with pytest.raises(TypeError, match="object"):
        summary_bundle("x", {"bad": object()})


# ---------------------------------------------------------------------------------------
# Parameters files
# ---------------------------------------------------------------------------------------
def _declared():
    from eagle3lab.report.execute import declared_parameters
    from eagle3lab.report.plan import PLAN

    return declared_parameters(PLAN, REPO / "notebooks")


def _parse(raw):
    from eagle3lab.report.params import parse_params
    from eagle3lab.report.plan import PLAN

    return parse_params(raw, PLAN, _declared())


@pytest.mark.parametrize("name", ["cpu-demo.yaml", "gpu.yaml"])
def test_shipped_params_files_match_the_notebooks(name):
    rp = _parse(str(REPO / "params" / name))
    assert rp.pipeline.target == "smollm2-135m-instruct"


@pytest.mark.parametrize("raw, expected", [
    ({"05_acceptence": {}}, "unknown section '05_acceptence'"),
    ({"01_extract": {"sample_cnt": 3}}, "01_extract.sample_cnt: not a parameter of "
     "01_extract.ipynb"),
    ({"01_extract": {"out_dir": "/x"}}, "01_extract.out_dir: set by the report"),
    ({"01_extract": {"sample_count": "8"}}, "01_extract.sample_count: '8' (str) but "
     "01_extract declares sample_count: int"),
    ({"common": {"no_such_param": 1}}, "common.no_such_param: no notebook declares"),
    ({"common": {"target": "x"}}, "common.target: the report sets target"),
    ({"pipeline": {"train_promts": 3}}, "unknown field(s) train_promts"),
    ({"pipeline": {"train": {"lr_schedle": "cosine"}}}, "unknown field(s) lr_schedle"),
    ({"pipeline": {"train": {"out": "/x"}}}, "pipeline.train: out are set by the pipeline"),
    ({"pipeline": {"train_prompts": 0}}, "pipeline: field 'train_prompts' has value 0 (int); "
     "expected a value greater than or equal to 1"),
    ({"pipeline": {"train": {"lr": "fast"}}}, "pipeline.train: field 'lr' has value 'fast' "
     "(str); expected a valid number"),
    ({"pipeline": {"train": {"data_fraction": 1.5}}}, "pipeline.train: field 'data_fraction' "
     "has value 1.5 (float); expected a value less than or equal to 1"),
    ({"pipeline": ["work_dir"]}, "pipeline: expected a mapping of fields, found list"),
    ({"report": {"timeout": 5}}, "report: unknown field(s) timeout (known fields: "
     "description, timeout_s"),
    ({"report": {"timeout_s": True}}, "report: field 'timeout_s' has value True (bool)"),
    # notebook parameters against the types their parameters cells declare
    ({"02_training_curves": {"plateau_threshold": True}}, "02_training_curves."
     "plateau_threshold: True (bool) but 02_training_curves declares plateau_threshold: float"),
    ({"05_acceptance": {"compare_failures": 1}}, "05_acceptance.compare_failures: 1 (int) but "
     "05_acceptance declares compare_failures: bool"),
    ({"05_acceptance": {"chain_lengths": "1,3"}}, "05_acceptance.chain_lengths: '1,3' (str) "
     "but 05_acceptance declares chain_lengths: list"),
    ({"common": {"max_new_tokens": 64.0}}, "common.max_new_tokens: 64.0 (float) but"),
])
def test_params_errors_name_the_section_and_key(raw, expected):
    from eagle3lab.errors import UserError

    with pytest.raises(UserError) as e:
        _parse(raw)
    assert expected in str(e.value)


def test_params_of_the_declared_types_pass():
    """As in a config: an int is a float, a list is a list; the file's sections come back."""
    rp = _parse({"report": {"timeout_s": 60, "description": "d"},
                 "pipeline": {"train_prompts": 4, "train": {"lr": 1e-3, "max_steps": 2}},
                 "02_training_curves": {"plateau_threshold": 1, "names": ["a"]},
                 "05_acceptance": {"compare_failures": False, "chain_lengths": [1, 3]}})
    assert rp.timeout_s == 60.0 and rp.description == "d"
    assert rp.pipeline.train_prompts == 4 and rp.pipeline.train == {"lr": 1e-3, "max_steps": 2}
    assert rp.sections["02_training_curves"] == {"plateau_threshold": 1, "names": ["a"]}
    assert list(rp.pipeline.model_dump())[:3] == ["work_dir", "target", "device"]


def test_params_file_errors_name_the_file(tmp_path):
    from eagle3lab.errors import UserError

    path = tmp_path / "my.yaml"
    path.write_text("pipeline:\n  train:\n    lr: -1\n  batch_size: '16'\n")
    with pytest.raises(UserError) as e:
        _parse(str(path))
    msg = str(e.value)
    assert msg.startswith(f"{path}: pipeline: field 'batch_size' has value '16' (str); "
                          "expected a valid integer"), msg


def test_all_problems_are_reported_together():
    from eagle3lab.errors import UserError

    with pytest.raises(UserError) as e:
        _parse({"nope": {}, "01_extract": {"sample_cnt": 3}})
    assert "'nope'" in str(e.value) and "sample_cnt" in str(e.value)


NOTEBOOK_PATHS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOK_PATHS, ids=lambda p: p.name)
def test_papermill_help_notebook_lists_every_parameter(path, monkeypatch):
    """The command line itself (not only inspect_notebook): each parameter of the parameters
    cell is printed with its type, its default and its help text. The first notebook through
    `python -m papermill` in a new process, the others through the same click command
    in this one (a process each would cost ~7 s of imports)."""
    import ast
    import subprocess
    import sys

    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    names = [n.target.id for n in ast.parse(cell.source).body]
    if path == NOTEBOOK_PATHS[0]:
        res = subprocess.run([sys.executable, "-m", "papermill", "--help-notebook", str(path)],
                             capture_output=True, text=True, timeout=120)
        rc, text = res.returncode, res.stdout + res.stderr
    else:
        from click.testing import CliRunner
        from papermill.cli import papermill

        monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # the command sets it
        res = CliRunner().invoke(papermill, ["--help-notebook", str(path)])
        rc, text = res.exit_code, res.output
    assert rc == 0 and "Parameters inferred" in text, text
    for name in names:
        m = re.search(rf"^  {name}: (\w+) \(default (.*?)\)\s+(\S.*)$", text, re.M)
        assert m, f"{path.name}: --help-notebook does not list {name} with type/default/help"
        assert m.group(1) != "None" and m.group(3).strip()


def test_the_demo_hands_notebook_02_the_shipped_drafters_curve(tmp_path):
    """params/cpu-demo.yaml (the default target): notebook 02 gets the shipped drafter as
    its reference run, whose H200 curve reference_frames then reads."""
    from eagle3lab.report.params import notebook_parameters
    from eagle3lab.report.plan import PLAN
    from eagle3lab.report.plan import wiring_context
    from eagle3lab.study.gap import reference_frames
    from eagle3lab.workdir import WorkDir

    rp = _parse(str(REPO / "params" / "cpu-demo.yaml"))
    step = next(s for s in PLAN if s.name == "02_training_curves")
    work = tmp_path / "work"
    ctx = wiring_context(work=WorkDir(work), target=rp.pipeline.target, device="cpu",
                         out=tmp_path / "out", scratch=tmp_path / "scratch")
    params, notes = notebook_parameters(step, rp, _declared()[step.name], ctx)
    assert notes == [] and params["run_dirs"] == [str(WorkDir(work).train_run)]
    assert params["reference_runs"] == [str(REPO / "data" / "drafters" / "smollm2-135m-instruct")]
    frames, notes = reference_frames(params["reference_runs"], names=params["reference_names"],
                                     exclude=params["run_dirs"])
    # the default drafter's curve: the study's winner, 64M tokens (8,031 steps) on the H200
    assert notes == [] and frames[0]["tokens"].max() == 64_004_055


def test_only_accepts_unique_prefixes_and_adds_needed_stages():
    from eagle3lab.errors import UserError
    from eagle3lab.report.plan import PLAN, selected_steps

    assert selected_steps(PLAN, ["03"]) == {"03_inspect_checkpoint", "convert", "train",
                                            "data", "target"}
    with pytest.raises(UserError, match="matches 6 steps"):
        selected_steps(PLAN, ["0"])


def test_cli_lists_report_and_demo_options(capsys):
    from eagle3lab.cli import main

    with pytest.raises(SystemExit):
        main(["report", "--help"])
    out = capsys.readouterr().out
    for opt in ("--params", "--only", "--out", "--timeout"):
        assert opt in out
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    assert "cpu-demo.yaml" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------
# The failure path: fixture notebooks, one of which raises
# ---------------------------------------------------------------------------------------
def _notebook(path: Path, *cells: str | tuple[str, list[str]]) -> None:
    """A notebook: the parameters cell, then code cells (source, or (source, tags))."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("n: int = 2  # how many", metadata={
        "tags": ["parameters"]})] + [
        nbformat.v4.new_code_cell(c) if isinstance(c, str) else
        nbformat.v4.new_code_cell(c[0], metadata={"tags": c[1]}) for c in cells]
    nbformat.write(nb, str(path))


@pytest.mark.slow
def test_a_failing_notebook_skips_only_its_dependents(tmp_path):
    from eagle3lab.report.run import run_report
    from eagle3lab.report.plan import Step

    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    _notebook(nbs / "a_ok.ipynb", "import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 1])",
              ("plt.bar([0, 1], [0.9, 0.4])", ["key-figure"]),
              "from eagle3lab.report.summary import record_summary\n"
              "record_summary('a_ok', answer=n * 21, per_position=[0.5, 0.25], "
              "precise=0.123456789012)")
    _notebook(nbs / "b_raises.ipynb", "x = n + 1", "raise ValueError(f'planted failure {x}')",
              "print('never reached')")
    _notebook(nbs / "c_needs_b.ipynb", "print('must not run')")
    _notebook(nbs / "d_independent.ipynb", "print('ran', n)")
    plan = [Step("a_ok", "notebook"), Step("b_raises", "notebook", ("a_ok",)),
            Step("c_needs_b", "notebook", ("b_raises",)), Step("d_independent", "notebook"),
            Step("e_not_written_yet", "notebook")]
    out = tmp_path / "report"
    rep = run_report(params={"b_raises": {"n": 3}}, out=out, notebooks_dir=nbs, plan=plan,
                     timeout_s=120, echo=None)
    status = {e["name"]: e["status"] for e in rep["steps"]}
    assert status == {"a_ok": "ok", "b_raises": "failed", "c_needs_b": "skipped",
                      "d_independent": "ok", "e_not_written_yet": "missing"}
    assert not rep["ok"]
    b = next(e for e in rep["steps"] if e["name"] == "b_raises")
    assert b["failed_cell"]["cell_index"] == 2  # parameters cell, x = n + 1, then the raise
    assert b["error"]["ename"] == "ValueError" and "planted failure 4" in b["error"]["evalue"]
    a = next(e for e in rep["steps"] if e["name"] == "a_ok")
    assert a["summary"] == {"answer": 42, "per_position": [0.5, 0.25],
                            "precise": 0.123456789012}
    assert a["key_figure"]["tagged"] and a["key_figure"]["cell_index"] == 2
    index = (out / "index.html").read_text()
    assert "planted failure 4" in index and "Failed in cell index 2 of b_raises.ipynb" in index
    assert 'href="b_raises.ipynb"' in index and "no summary" in index
    assert "needs b_raises (failed)" in index
    assert "does not exist (yet)" in index
    assert "0.5 / 0.25" in index
    # the key figure as an embedded thumbnail linking to the page; numbers rounded for reading
    assert re.search(r'<a href="a_ok.html#key-figure"><img class="thumb" '
                     r'src="data:image/png;base64,', index)
    assert index.count('class="thumb"') == 1 and index.count("no figure") == 2
    assert '<dd title="0.123456789012">0.123</dd>' in index
    assert not any("<script" in p.read_text() for p in out.glob("*.html"))
    for name in ("a_ok", "b_raises", "d_independent"):
        assert (out / f"{name}.ipynb").exists() and (out / f"{name}.html").exists()
    assert not (out / "c_needs_b.ipynb").exists()
    assert "planted failure" in (out / "report.log").read_text()
    saved = json.loads((out / "report.json").read_text())
    assert saved["counts"] == {"ok": 2, "failed": 1, "skipped": 1, "missing": 1}
    assert saved["steps"][0]["summary"]["precise"] == 0.123456789012  # full precision


@pytest.mark.slow
def test_a_cell_past_the_timeout_fails_its_notebook_only(tmp_path):
    from eagle3lab.report.run import run_report
    from eagle3lab.report.plan import Step

    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    sleep_s = 600
    _notebook(nbs / "hangs.ipynb", "import time", f"time.sleep({sleep_s})")
    _notebook(nbs / "after.ipynb", "print('ran')")
    rep = run_report(out=tmp_path / "report", notebooks_dir=nbs, timeout_s=3, echo=None,
                     plan=[Step("hangs", "notebook"), Step("after", "notebook")])
    hangs, after = rep["steps"]
    assert (hangs["status"], after["status"]) == ("failed", "ok")
    assert hangs["error"]["ename"] == "CellTimeoutError"
    assert hangs["failed_cell"]["cell_index"] == 2
    assert hangs["wall_s"] < sleep_s  # the cell was cut at the timeout, not waited out


# ---------------------------------------------------------------------------------------
# The whole plan on a tiny target, and stage reuse
# ---------------------------------------------------------------------------------------
@pytest.mark.real
@pytest.mark.slow
def test_report_end_to_end_on_a_tiny_target(tiny_report):
    from eagle3lab.report.plan import PLAN
    from eagle3lab.report.summary import read_summary

    report, _, out = tiny_report
    status = {e["name"]: e["status"] for e in report["steps"]}
    notebooks = [s.name for s in PLAN if s.kind == "notebook"]
    present = [n for n in notebooks if (REPO / "notebooks" / f"{n}.ipynb").exists()]
    assert all(status[n] == "ok" for n in present), status
    assert all(status[s.name] in ("computed", "reused") for s in PLAN if s.kind == "stage")
    assert report["ok"]
    for n in present:
        html = (out / f"{n}.html").read_text()
        assert "data:image/png;base64," in html, f"{n}: figures are embedded"
        assert "<script" not in html and "cdnjs" not in html, f"{n}: no script"
        nb = json.loads((out / f"{n}.ipynb").read_text())
        assert nb["metadata"]["papermill"]["parameters"], f"{n} got the pipeline's parameters"
    by = {e["name"]: e for e in report["steps"]}
    assert by["01_extract"]["summary"]["samples"] == 2
    assert by["03_inspect_checkpoint"]["summary"]["errors"] == 0  # the converted drafter
    assert by["03_inspect_checkpoint"]["summary"]["tensors_differing_from_second"] == 0
    assert by["04_live_server"]["summary"]["verdicts"]["baseline"] == "ready"
    assert by["03_inspect_checkpoint"]["parameters"]["checkpoint"].endswith("converted/sglang")
    index = (out / "index.html").read_text()
    assert "<link" not in index and "<script" not in index
    # every notebook names its key figure; the index embeds it, linked to the notebook's page
    for n in present:
        assert by[n]["key_figure"]["tagged"], f"{n}: no cell tagged key-figure drew a plot"
        row = re.search(rf'<tr data-step="{n}">(.*?)</tr>', index, re.S).group(1)
        assert f'<a href="{n}.html#key-figure"><img class="thumb" src="data:image/png' in row
    saved = json.loads((out / "report.json").read_text())  # full precision, as recorded
    for e in saved["steps"]:
        if e.get("ipynb"):
            assert e["summary"] == read_summary(out / e["ipynb"])
    # 02: the pipeline's run; the shipped drafter's curve is wired as its reference (for a
    # tiny target that is the pipeline's own drafter, so it is not drawn twice)
    assert by["02_training_curves"]["parameters"]["reference_runs"] == [
        str(Path(report["work_dir"]) / "train" / "final")]
    assert by["02_training_curves"]["summary"]["train_eval_gap"] is not None
    assert all(f'data-step="{n}"' in index for n in notebooks)
    assert "torch" in index and "speculators" in index  # versions
    assert (out / "report.json").exists()
    assert "Ending Cell" in (out / "report.log").read_text()  # papermill's logged output


@pytest.mark.real
@pytest.mark.slow
def test_notebook_05_in_the_report_runs_every_section(tiny_report):
    """Notebook 05 as the report ran it (the tiny report's parameters turn every section
    on): the acceptance, histogram and chain-length plots, both failure arms, the speed
    section."""
    _, _, out = tiny_report
    cells = json.loads((out / "05_acceptance.ipynb").read_text())["cells"]
    images = [o for c in cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 3
    text = json.dumps(cells)
    assert "sglang config + layers.0 keys" in text and "last_layer features" in text
    assert "thread(s)" in text and "outputs identical to plain" in text  # speed section


@pytest.mark.real
@pytest.mark.slow
def test_second_run_reuses_every_stage(tiny_report, tmp_path, monkeypatch):
    """Reuse is counted, not timed: the target runs no forward pass (nothing generated or
    extracted again), training leaves its run as it was, the converter is not called."""
    import eagle3lab.formats.convert as convert
    import eagle3lab.targets.adapter as adapter
    from eagle3lab.data.regenerate import meta_path
    from eagle3lab.report.run import run_report
    from eagle3lab.workdir import WorkDir

    first, params, _ = tiny_report
    work = WorkDir(first["work_dir"])
    run_json = (work.train_run / "run.json").stat().st_mtime_ns
    forwards, load_target = [], adapter.load_target

    def counted(*a, **k):
        tgt = load_target(*a, **k)
        tgt.model.get_input_embeddings().register_forward_pre_hook(
            lambda *_: forwards.append(1))
        return tgt

    monkeypatch.setattr(adapter, "load_target", counted)
    monkeypatch.setattr(convert, "convert_checkpoint",
                        lambda *a, **k: pytest.fail("the unchanged drafter was converted again"))
    rep = run_report(params=params, only=["convert"], out=tmp_path / "again", progress=False,
                     echo=None)
    stages = {e["name"]: e for e in rep["steps"] if e["kind"] == "stage"}
    assert {n: e["status"] for n, e in stages.items()} == {
        "target": "reused", "data": "reused", "train": "reused", "convert": "reused"}
    assert all(e["status"] == "not selected" for e in rep["steps"] if e["kind"] == "notebook")
    for split in ("train", "eval"):
        meta = json.loads(meta_path(work.responses(split)).read_text())
        assert meta["last_run"]["new_records"] == 0  # regenerate did nothing
    assert (work.train_run / "run.json").stat().st_mtime_ns == run_json  # not retrained
    # the record keeps when and how long the stage was computed the first time
    first_data = next(e for e in first["steps"] if e["name"] == "data")["record"]
    assert stages["data"]["record"]["computed_at"] == first_data["computed_at"]
    assert stages["data"]["record"]["numbers"]["regenerate_tokens_per_s"] is not None
    assert forwards == []  # the target decoded and extracted nothing
