"""notebooks/03_inspect_checkpoint.ipynb runs under papermill standalone (demo pair, no
network) and shows the findings, the tables, the plots and the diff."""

import json
from pathlib import Path

import pytest

NB = Path(__file__).resolve().parents[2] / "notebooks" / "03_inspect_checkpoint.ipynb"


def _text(nb) -> str:
    out = []
    for c in nb["cells"]:
        for o in c.get("outputs", []):
            t = o.get("text", "")
            out.append(t if isinstance(t, str) else "".join(t))
            data = o.get("data", {}).get("text/plain", "")
            out.append(data if isinstance(data, str) else "".join(data))
    return "\n".join(out)


@pytest.mark.slow
def test_notebook_03_runs_on_the_demo_pair(tmp_path):
    from eagle3lab.report.kernel import execute_notebook

    out = tmp_path / "03.ipynb"
    execute_notebook(str(NB), str(out), kernel_name="python3", progress_bar=False,
                     cwd=str(tmp_path))
    nb = json.loads(out.read_text())
    text = _text(nb)
    assert "OK: 0 error(s)" in text  # the good checkpoint
    for code in ("nonfinite", "vocab-map", "aux-layers"):  # the faulty copy, diffed
        assert code in text
    assert "draft tokens cover" in text
    images = [o for c in nb["cells"] for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) == 3, "norms, vocabulary coverage and the diff are plotted"
