"""notebooks/02_training_curves.ipynb and 06_grokking_vs_data.ipynb run standalone under
papermill at tiny size (demo data through the tiny sharp target, no network)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def _run(name: str, out: Path, params: dict) -> tuple[str, int]:
    from eagle3lab.report.kernel import execute_notebook

    execute_notebook(str(NOTEBOOKS / name), str(out), kernel_name="python3",
                     progress_bar=False, parameters=params, cwd=str(out.parent))
    nb = json.loads(out.read_text())
    texts = []
    for c in nb["cells"]:
        for o in c.get("outputs", []):
            t = o.get("text") or o.get("data", {}).get("text/plain", "")
            texts.append(t if isinstance(t, str) else "".join(t))
    images = sum("image/png" in o.get("data", {}) for c in nb["cells"]
                 for o in c.get("outputs", []))
    return "\n".join(texts), images


#: Optimizer steps of notebook 02's demo run: evaluated after each, so that the plateau rule
#: (window 2) has windows to judge; training and evaluating is most of the notebook's time.
DEMO_STEPS = 6


@pytest.mark.full
@pytest.mark.slow
def test_notebook_02_standalone_demo(tmp_path, sharp_target_dir):
    text, images = _run("02_training_curves.ipynb", tmp_path / "02.ipynb",
                        {"demo_target": str(sharp_target_dir), "demo_steps": DEMO_STEPS,
                         "plateau_window": 2, "reference_level": 1.5})
    assert f"demo-run: {DEMO_STEPS + 1} logged steps, source eagle3lab, loss = kl" in text
    assert "eval_loss_0" in text and ("plateaued" in text or "not plateaued" in text)
    assert images >= 5  # plateau-and-gap, loss, full acc, cond acc, lr
    # by default the shipped drafter's H200 curve is drawn beside the demo run: its plateau
    # and gap are in the key figure's table and in the key numbers
    from eagle3lab.report.figures import key_figure
    from eagle3lab.report.summary import read_summary

    # the default drafter (the study's winner, 64M tokens): 2,009 lines in its
    # metrics.jsonl; with window 2 its summed eval loss is flat from 60,279,621 tokens on
    # (the linear rate's last stretch: 0.69% better two evaluations later); eval 1.90 vs
    # train ~1.18
    assert "reference shipped default drafter, own eval split: 2009 logged steps" in text
    assert "eval_loss_sum plateaued at tokens=6.02796e+07" in text
    kf = key_figure(tmp_path / "02.ipynb")
    assert kf.tagged and kf.size()[0] > 1000  # the two-panel plateau-and-gap figure
    numbers = read_summary(tmp_path / "02.ipynb")
    assert numbers["reference_plateau_at"] == 60_279_621
    assert 0.6 < numbers["reference_train_eval_gap"] < 0.9


@pytest.mark.full
@pytest.mark.slow
def test_notebook_06_standalone_demo(tmp_path, sharp_target_dir):
    text, images = _run("06_grokking_vs_data.ipynb", tmp_path / "06.ipynb",
                        {"demo": True, "demo_target": str(sharp_target_dir),
                         "data_fractions": [1.0, 0.5], "seeds": [0, 1],
                         "budget_epochs": 1.0, "max_tokens_per_batch": 512,
                         "study_dir": str(tmp_path / "study"),
                         "acceptance_prompts": 1, "acceptance_tokens": 8})
    assert "4 runs in" in text
    assert "At equal compute" in text and "seed-to-seed spread" in text
    assert "On measured accept length: " in text  # eagle3lab.specdec.accept on each final drafter
    # The shipped drafter (hidden 576) does not fit the tiny demo target: skipped, saying why.
    assert "Large-data arm skipped" in text and "[hidden-size]" in text
    assert images >= 3
    assert len(list((tmp_path / "study" / "runs").iterdir())) == 4


@pytest.mark.slow
@pytest.mark.full
def test_notebook_02_overlays_a_specforge_run(tmp_path, trained_run):
    """source="specforge": a SpecForge output dir (event files with its tags, step
    checkpoints) overlaid with an eagle3lab run: one checkpoint table, one plateau table."""
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "study"))
    from test_runs import make_specforge_run

    sf = make_specforge_run(tmp_path / "sf-out")
    text, images = _run("02_training_curves.ipynb", tmp_path / "02.ipynb",
                        {"run_dirs": [str(trained_run), str(sf / "runs")],
                         "names": ["ours", "specforge"], "source": "specforge",
                         "reference_runs": [], "x": "step", "plateau_window": 2})
    assert "ours: " in text and "source eagle3lab" in text
    assert "specforge: 10 logged steps, source specforge, loss = soft_ce" in text
    assert "checkpoints in 2 run(s)" in text and "specforge export" in text
    assert "run1-step40" in text  # the checkpoint at the plateau of eval_sim_accept_len
    assert images >= 5


@pytest.mark.slow
@pytest.mark.full
def test_notebook_02_overlays_a_speculators_run(tmp_path, trained_run):
    """source="speculators": its tensorboard log dir and its --save-path epochs (written by
    speculators' own checkpointer) overlaid with an eagle3lab run."""
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "study"))
    sys.path.insert(0, str(Path(__file__).parents[1] / "formats"))
    from test_foreign_checkpoints import save_speculators_epochs
    from test_importers import write_speculators_log

    from eagle3lab.formats.demo import make_speculators_draft, make_tiny_target

    target = make_tiny_target(tmp_path / "target")
    spec = make_speculators_draft(tmp_path / "draft", target=target)
    write_speculators_log(tmp_path / "logs", steps=4)
    save = save_speculators_epochs(spec, tmp_path / "save", epochs=2, best=0,
                                   steps_per_epoch=2)
    text, images = _run("02_training_curves.ipynb", tmp_path / "02.ipynb",
                        {"run_dirs": [str(trained_run), str(tmp_path / "logs")],
                         "names": ["ours", "speculators"], "source": "speculators",
                         "checkpoint_dirs": ["", str(save)], "reference_runs": [],
                         "x": "step", "plateau_window": 2})
    assert "ours: " in text and "source eagle3lab" in text
    assert "speculators: 4 logged steps, source speculators" in text
    assert "checkpoints in 2 run(s)" in text
    assert images >= 3


#: Each tool's layout on disk and the name its manifest records.
FOREIGN = {"specforge": ("rows_*/data_*.ckpt", "SpecForge"),
           "speculators": ("hidden_states/hs_*.safetensors", "speculators")}


@pytest.mark.slow
@pytest.mark.full
@pytest.mark.parametrize("source", sorted(FOREIGN))
def test_notebook_06_on_foreign_sets(tmp_path, sharp_target_dir, source):
    """source="specforge" / "speculators": the demo shards written as that tool writes them
    (SpecForge's rows_*/data_*.ckpt + vocab mapping; speculators' prepared dataset,
    token_freq.pt, hs_{i}.safetensors) are the study's arms."""
    import re

    text, images = _run("06_grokking_vs_data.ipynb", tmp_path / "06.ipynb",
                        {"source": source, "demo_target": str(sharp_target_dir),
                         "data_fractions": [1.0, 0.5], "seeds": [0],
                         "epoch_multipliers": [1.0], "budget_epochs": 1.0,
                         "max_tokens_per_batch": 512, "study_dir": str(tmp_path / "study"),
                         "large_data_drafter": "none"})
    files, tool = FOREIGN[source]
    assert f"data: {source} sets" in text and f"/{source}/train" in text
    assert "2 runs in" in text and "At equal compute" in text
    assert images >= 2
    train = Path(re.search(rf"train (\S+/{source}/train)", text).group(1))
    assert list(train.glob(files))
    man = json.loads((train / "eagle3lab.manifest.json").read_text())
    assert man["tool"] == tool and man["vocab_map"]
