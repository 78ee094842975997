"""End to end on the at-scale tools' hidden-state sets: the same conversations' states
written as SpecForge and as speculators write them -> `eagle3lab vocab` -> `train` ->
`inspect` -> `accept`: each drafter equals the one trained on our own extraction (same
states, same seed), and so does its accept length."""

from __future__ import annotations

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).parents[1] / "data"))
from foreign_writers import to_specforge, to_speculators  # noqa: E402

KW = dict(epochs=1, max_tokens_per_batch=512, lr=1e-3, eval_every=0, progress=False)


def test_foreign_sets_train_the_same_drafter(tmp_path, sharp_data, sharp_target_dir, capsys):
    import torch
    from safetensors.torch import load_file

    from eagle3lab.cli import main
    from eagle3lab.formats.doctor import inspect_checkpoint
    from eagle3lab.specdec.accept import Arm, measure_acceptance
    from eagle3lab.train import train

    sets = {"eagle3lab": sharp_data["train"]}
    for name, write in (("specforge", to_specforge), ("speculators", to_speculators)):
        tr = write(sharp_data["train"], tmp_path / name, sharp_target_dir)
        # the CLI, as a user would: the target is recorded once; the map is counted
        assert main(["vocab", "--data", str(tr), "--target", str(sharp_target_dir),
                     "--draft-vocab-size", "64"]) == 0
        assert "64 draft tokens" in capsys.readouterr().out
        sets[name] = str(tr)
    finals = {}
    for name, tr in sets.items():
        out = tmp_path / "runs" / name
        summary = train(data=tr, out=str(out), eval_at_start=False, **KW)
        finals[name] = out / "final"
        assert summary["steps"] > 0
        assert inspect_checkpoint(finals[name], target=str(sharp_target_dir)).ok
    weights = {n: load_file(str(p / "model.safetensors")) for n, p in finals.items()}
    for name in ("specforge", "speculators"):
        assert weights[name].keys() == weights["eagle3lab"].keys()
        # the same states (SpecForge's final state normed by the target's own norm, its
        # targets lm_head(state)) give the same drafter, bit for bit
        for k, v in weights["eagle3lab"].items():
            assert torch.equal(weights[name][k], v), (name, k)
    r = measure_acceptance(target=str(sharp_target_dir),
                           arms=[Arm(n, str(p)) for n, p in finals.items()], limit=2,
                           max_new_tokens=12, steps=3, progress=False)
    taus = {a["name"]: a["stats"]["tau"] for a in r["arms"]}
    assert taus["specforge"] == taus["eagle3lab"] == taus["speculators"], taus
    assert taus["eagle3lab"] > 1.0  # the drafter learned something: tau is informative
