"""notebooks/05_acceptance.ipynb's template-drift arm under papermill at tiny size: the
healthy drafter measured once per rendering in `render_presets` (`accept --render-as`), the
drop against the first one measured; a drafter that records no rendering skips `trained`
with the reason instead of failing the notebook. Sharp tiny target, the trained tiny run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

NB = Path(__file__).resolve().parents[2] / "notebooks" / "05_acceptance.ipynb"


def _run(out: Path, target: Path, draft: Path) -> str:
    from eagle3lab.report.kernel import execute_notebook

    # The widget cell's execute_reply once sat unnoticed in the client's socket (a lost
    # wake-up: the kernel idle, the cell done) until the cell timeout's last poll: 20 min
    # without a timeout, 600 s with one. eagle3lab.report.kernel's client polls in slices,
    # which bounds that to a slice; every cell here takes seconds, so 120 s stays as a net.
    execute_notebook(str(NB), str(out), kernel_name="python3", progress_bar=False,
                     cwd=str(out.parent), execution_timeout=120, parameters={
                         "target": str(target), "drafts": [str(draft)], "limit": 2,
                         "max_new_tokens": 6, "steps": 2, "engine": "eager",
                         "chain_lengths": [], "compare_failures": False,
                         "speed_dtype": "none", "weak_worst": 2,
                         "render_presets": ["trained", "empty-system"]})
    texts = []
    for c in json.loads(out.read_text())["cells"]:
        for o in c.get("outputs", []):
            t = o.get("text") or o.get("data", {}).get("text/plain", "")
            texts.append(t if isinstance(t, str) else "".join(t))
    return "\n".join(texts)


def _rows(text: str, names: list[str]) -> dict[str, list[str]]:
    """The drift table's rows (text/plain of the DataFrame indexed by 'render as'):
    tau, drop, drop %, acc@1, verify steps, same as plain."""
    rows = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 7 and parts[0] in names:
            rows[parts[0]] = parts[1:]
    return rows


@pytest.mark.slow
def test_notebook_05_measures_the_drop_per_rendering(tmp_path, sharp_target_dir, trained_run):
    from eagle3lab.data.rendering import Renderer, describe
    from eagle3lab.targets.adapter import load_target

    # the trained run's drafter, recorded as trained on the tokenizer's template with no
    # system message (what regenerate records for that rendering)
    draft = tmp_path / "drafter"
    shutil.copytree(trained_run / "final", draft)
    tok = load_target(str(sharp_target_dir), device="cpu").tokenizer
    record = Renderer(tok).record()
    side = draft / "eagle3lab.json"
    run = json.loads(side.read_text()) if side.exists() else {}
    side.write_text(json.dumps({**run, "rendering": record}))

    text = _run(tmp_path / "05.ipynb", sharp_target_dir, draft)
    # `trained` renders as the main measurement did: that measurement, not decoded again
    assert f"trained: {describe(record)} (the measurement above)" in text
    empty = describe(Renderer(tok, system_prompt='').record())
    assert f"empty-system: {empty}\n" in text + "\n"
    assert "drop = tau(trained) - tau" in text
    rows = _rows(text, ["trained", "empty-system"])
    tau = {k: float(rows[k][0]) for k in ("trained", "empty-system")}
    assert float(rows["trained"][1]) == 0.0
    drop = tau["trained"] - tau["empty-system"]
    assert float(rows["empty-system"][1]) == pytest.approx(drop, abs=2e-3)
    # exact in fp32 at temperature 0: every speculative answer is the plain one
    assert rows["trained"][-1] == rows["empty-system"][-1] == "2/2"
    # `trained` renders as the main measurement (the tokenizer's template, no system
    # message): the same prompts give the same tau as the summary table above
    summary = next(line.split() for line in text.splitlines()
                   if line.split()[1:3] == ["healthy", "fused"])
    assert float(summary[4]) == pytest.approx(tau["trained"], abs=1e-3)


@pytest.mark.slow
@pytest.mark.full  # a second run of the same notebook for another arm: in make test-all
def test_notebook_05_skips_trained_without_a_record(tmp_path, sharp_target_dir, trained_run):
    text = _run(tmp_path / "05.ipynb", sharp_target_dir, trained_run / "final")
    assert "trained: not measured: --render-as trained:" in text
    assert "records no rendering" in text
    assert "drop = tau(empty-system) - tau" in text
    rows = _rows(text, ["empty-system"])
    assert float(rows["empty-system"][1]) == 0.0
