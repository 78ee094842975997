"""notebooks/01_extract.ipynb runs under papermill on the real default target (tiny size)."""

import json
from pathlib import Path

import pytest

NB = Path(__file__).resolve().parents[2] / "notebooks" / "01_extract.ipynb"


@pytest.mark.real
@pytest.mark.slow
def test_notebook_01_runs_under_papermill(tmp_path, default_target_dir):
    from eagle3lab.report.kernel import execute_notebook

    out = tmp_path / "01.ipynb"
    execute_notebook(str(NB), str(out), kernel_name="python3", progress_bar=False,
                     parameters={"sample_count": 3, "max_new_tokens": 12,
                                 "batch_size": 3, "out_dir": str(tmp_path / "run"),
                                 "prompts": "eval"})
    nb = json.loads(out.read_text())
    text = "\n".join(o.get("text", "") if isinstance(o.get("text"), str) else "".join(
        o.get("text", [])) for c in nb["cells"] for o in c.get("outputs", []))
    assert "aux capture points (inputs of layers) [2, 15, 27]" in text
    images = [o for c in nb["cells"] for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images, "the norm histogram is rendered"
    manifest = json.loads((tmp_path / "run" / "shards" / "eval" / "manifest.json").read_text())
    assert manifest["totals"]["samples"] == 3


#: What each tool's layout looks like on disk, and how notebook 01 describes it.
FOREIGN = {
    "specforge": ("rows_*/data_*.ckpt", "final state normed", '"tool": "SpecForge"'),
    "speculators": ("hidden_states/hs_*.safetensors", "final state pre_norm",
                    '"tool": "speculators"'),
}


@pytest.mark.slow
# the same notebook once per foreign layout: SpecForge's run only in make test-all (its
# reader is tests/data/test_foreign.py's at CPU scale; the notebook path is speculators')
@pytest.mark.parametrize("source", [pytest.param(s, marks=pytest.mark.full)
                                    if s == "specforge" else s for s in sorted(FOREIGN)])
def test_notebook_01_reads_a_foreign_set(tmp_path, tiny_target_dir, source):
    """source="specforge" / "speculators": the shards extracted here (tiny target), written
    in that tool's layout, are read back by its reader for the statistics and the per-layer
    norms."""
    from eagle3lab.report.kernel import execute_notebook

    out = tmp_path / "01.ipynb"
    execute_notebook(str(NB), str(out), kernel_name="python3", progress_bar=False,
                     parameters={"target": str(tiny_target_dir), "sample_count": 2,
                                 "max_new_tokens": 6, "batch_size": 2, "prompts": "eval",
                                 "out_dir": str(tmp_path / "run"), "source": source,
                                 "dtype": "float32"})
    nb = json.loads(out.read_text())
    text = "\n".join(o.get("text", "") if isinstance(o.get("text"), str) else "".join(
        o.get("text", [])) for c in nb["cells"] for o in c.get("outputs", []))
    files, final, tool = FOREIGN[source]
    assert f"{source} set" in text and "2 samples; aux capture points [2, 4, 5]" in text
    assert final in text and tool in text
    assert list((tmp_path / "run" / source).glob(files))
    assert any("image/png" in o.get("data", {}) for c in nb["cells"]
               for o in c.get("outputs", []))
