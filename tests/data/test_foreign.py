"""The SpecForge and speculators hidden-state readers: the same samples as our own shards,
manifests that say what they assume, refusals (crafted pickle, widths, no target)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from foreign_writers import to_specforge, to_speculators  # noqa: E402

from eagle3lab.data.foreign import detect_data_format, open_shards  # noqa: E402
from eagle3lab.data.shards import ShardSet  # noqa: E402
from eagle3lab.errors import UserError  # noqa: E402


@pytest.fixture(scope="module")
def foreign_sets(tmp_path_factory, sharp_data, sharp_target_dir):
    root = tmp_path_factory.mktemp("foreign")
    return {"specforge": to_specforge(sharp_data["eval"], root / "sf", sharp_target_dir),
            "specforge_gz": to_specforge(sharp_data["eval"], root / "sfgz", sharp_target_dir,
                                         compress=True, group=5),
            "speculators": to_speculators(sharp_data["eval"], root / "spec", sharp_target_dir)}


def test_formats_are_detected(foreign_sets, sharp_data):
    assert detect_data_format(sharp_data["eval"]) == "eagle3lab"
    assert detect_data_format(foreign_sets["specforge"]) == "specforge"
    assert detect_data_format(foreign_sets["specforge_gz"]) == "specforge"
    assert detect_data_format(foreign_sets["speculators"]) == "speculators"


@pytest.mark.parametrize("kind", ["specforge", "specforge_gz", "speculators"])
def test_samples_equal_our_extraction(foreign_sets, sharp_data, sharp_target_dir, kind):
    import torch

    ours = ShardSet(sharp_data["eval"])
    theirs = open_shards(foreign_sets[kind], target=str(sharp_target_dir))
    assert len(theirs) == len(ours) and theirs.lengths() == ours.lengths()
    assert theirs.num_tokens == ours.num_tokens
    theirs.check_against(hidden_size=ours.hidden_size, aux=ours.aux,
                         vocab_size=ours.manifest["target"]["vocab_size"],
                         config_sha256=ours.manifest["target"]["config_sha256"])
    for i in (0, len(ours) - 1):
        a, b = ours[i], theirs[i]
        assert torch.equal(a["input_ids"], b["input_ids"])
        assert torch.equal(a["loss_mask"], b["loss_mask"])
        assert torch.equal(a["hidden_states"].float(), b["hidden_states"].float())
        if kind == "speculators":  # the final norm's input, as ours
            assert torch.equal(a["verifier_last_hidden_states"], b["verifier_last_hidden_states"])
    m = theirs.manifest
    assert m["final_state"] == ("pre_norm" if kind == "speculators" else "normed")
    assert m["aux_layers"]["capture_points"] == [2, 4, 5]  # 8 layers: [2, L//2, L-3]
    assert m["aux_layers"]["convention"] == ("vllm" if kind == "speculators" else "sglang")
    assert m["aux_layers"]["requested_ids"] == ([2, 4, 5] if kind == "speculators"
                                                else [1, 3, 4])
    assert "assumed" in m["aux_layers"]["source"]
    assert m["target"]["path"] == str(Path(sharp_target_dir).resolve())
    # recorded: a second open needs no target and lists the same
    again = open_shards(foreign_sets[kind])
    assert again.manifest["target"] == m["target"] and again.verify()["shards"] == len(ours)


def test_speculators_own_reader_reads_the_same_samples(foreign_sets, sharp_target_dir):
    """speculators' ArrowDataset (its trainer's dataset) over the same directory gives the
    same sample dicts as our reader."""
    import torch
    from speculators.train.data import ArrowDataset

    theirs = ArrowDataset(max_len=4096, datapath=str(foreign_sets["speculators"]),
                          on_missing="raise", hidden_states_dtype=torch.float32)
    ours = open_shards(foreign_sets["speculators"], target=str(sharp_target_dir))
    for i in (0, 5):
        a, b = theirs[i], ours[i]
        for k in ("hidden_states", "input_ids", "verifier_last_hidden_states"):
            assert torch.equal(a[k], b[k]), k
        assert torch.equal(a["loss_mask"].bool(), b["loss_mask"])


def test_vocab_map_from_token_freq_is_speculators_own(foreign_sets, sharp_target_dir):
    import torch
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    from eagle3lab.data.vocab import build_shard_vocab

    d = foreign_sets["speculators"]
    e = build_shard_vocab(data=d, draft_vocab_size=32, target=str(sharp_target_dir),
                          source="recorded", force=True)
    d2t, t2d = open_shards(d).vocab_map()
    freq = torch.load(d / "token_freq.pt", weights_only=True)
    want_d2t, want_t2d = build_vocab_mappings_from_distribution(freq, 32, 49152)
    assert torch.equal(d2t, want_d2t) and torch.equal(t2d, want_t2d)
    assert e["source_kind"] == "recorded" and "speculators" in e["source"]
    counted = build_shard_vocab(data=d, draft_vocab_size=32, force=True)
    assert counted["loss_tokens"] == sum(freq.values())  # the same loss-masked tokens


def test_crafted_pickle_is_refused_not_run(tmp_path, sharp_target_dir):
    """A .ckpt whose pickle calls a function: SpecForge's loader (weights_only=False) would
    run it; ours refuses the file, naming it, and the function never runs."""
    import torch

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    d = tmp_path / "sf" / "rows_0-2000"
    d.mkdir(parents=True)
    torch.save({"input_ids": torch.zeros(3, dtype=torch.long), "payload": Evil()},
               d / "data_0.ckpt")
    with pytest.raises(UserError, match=r"data_0\.ckpt is not a plain dict of tensors.*NOT "
                       r"loaded"):
        open_shards(tmp_path / "sf", target=str(sharp_target_dir))
    assert not marker.exists()


def test_widths_that_do_not_fit_the_target_are_refused(tmp_path, sharp_target_dir):
    """An aux state H wide where 3H is expected (hidden 64: 64 vs 192), as the 7168-vs-21504
    failure: refused when the set is opened, naming both widths."""
    import torch

    d = tmp_path / "sf" / "rows_0-2000"
    d.mkdir(parents=True)
    torch.save({"input_ids": torch.zeros(4, dtype=torch.long),
                "loss_mask": torch.ones(4, dtype=torch.long),
                "aux_hidden_state": torch.zeros(1, 4, 64),
                "hidden_state": torch.zeros(1, 4, 64)}, d / "data_0.ckpt")
    with pytest.raises(UserError, match=r"aux states are 64 wide.*3 x 64 = 192"):
        open_shards(tmp_path / "sf", target=str(sharp_target_dir))


def test_a_set_without_its_target_asks_for_it(foreign_sets, tmp_path):
    import shutil

    d = shutil.copytree(foreign_sets["specforge"], tmp_path / "copy")
    (d / "eagle3lab.manifest.json").unlink(missing_ok=True)
    with pytest.raises(UserError, match="do not\\s+record the target.*--target"):
        open_shards(d)
    with pytest.raises(UserError, match="not a hidden-state set"):
        open_shards(tmp_path)
