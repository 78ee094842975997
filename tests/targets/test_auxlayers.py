"""eagle3lab.targets.auxlayers: aux ids, their two conventions, and the `aux_layers` record
that shard manifests and the shipped drafter already hold (a file format: read back as is)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3lab.errors import UserError
from eagle3lab.targets.auxlayers import (AuxLayers, capture_to_ids, ids_to_capture,
                                         resolve_aux_layers)

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "data" / "drafters" / "smollm2-135m-instruct"
#: The keys of the record, in order, as manifests and drafter records hold them.
RECORD_KEYS = ["capture_points", "capture_semantics", "layer_outputs", "convention",
               "requested_ids", "is_default", "sglang_ids", "vllm_ids", "num_layers"]


def test_default_capture_points_follow_sglang():
    aux = resolve_aux_layers(30)
    assert list(aux.capture_points) == [2, 15, 27]
    assert aux.layer_outputs == [1, 14, 26]
    assert aux.sglang_ids == [1, 14, 26] and aux.vllm_ids == [2, 15, 27]
    assert aux.to_dict()["is_default"] is True


def test_explicit_ids_depend_on_convention():
    # The same explicit list means different layers in the two engines.
    sg = resolve_aux_layers(30, [1, 14, 26], "sglang")
    vl = resolve_aux_layers(30, [1, 14, 26], "vllm")
    assert list(sg.capture_points) == [2, 15, 27]
    assert list(vl.capture_points) == [1, 14, 26]
    rec = sg.to_dict()
    assert rec["convention"] == "sglang" and rec["requested_ids"] == [1, 14, 26]
    for conv in ("sglang", "vllm"):
        assert capture_to_ids(ids_to_capture([1, 14, 26], conv), conv) == [1, 14, 26]


@pytest.mark.parametrize("ids,conv,msg", [
    ([1, 1, 5], "sglang", "repeat"),
    ([2, 15, 29], "sglang", "Out of range"),
    ([0, 15, 27], "vllm", "Out of range"),
    ([2, 15, 27], "hf", "Unknown aux layer id convention"),
])
def test_bad_aux_ids_refused(ids, conv, msg):
    with pytest.raises(UserError, match=msg):
        resolve_aux_layers(30, ids, conv)


def test_chosen_capture_points_record_the_ids_of_their_convention():
    vl = AuxLayers.from_capture_points([3, 10, 20], 30)
    assert vl == resolve_aux_layers(30, [3, 10, 20], "vllm")
    sg = AuxLayers.from_capture_points([3, 10, 20], 30, "sglang")
    assert sg == resolve_aux_layers(30, [2, 9, 19], "sglang")
    assert sg.ids("vllm") == [3, 10, 20] and sg.to_dict()["requested_ids"] == [2, 9, 19]


def test_the_shipped_drafters_record_reads_back_byte_for_byte():
    """The shipped drafter's training record (written by an earlier version) is read into
    the value type and written out again unchanged, keys in the same order."""
    info = json.loads((SHIPPED / "eagle3lab.json").read_text())
    for split in ("train", "eval"):
        rec = info["data"][split]["aux_layers"]
        assert list(rec) == RECORD_KEYS
        aux = AuxLayers.from_dict(rec)
        assert json.dumps(aux.to_dict()) == json.dumps(rec)
        assert aux == resolve_aux_layers(30)


def test_the_shipped_drafters_config_agrees_with_its_record():
    """The checkpoint doctor reads the shipped drafter's config (speculators format: ids at
    the top level, vLLM convention) as the capture points its training record holds."""
    from eagle3lab.formats.detect import parse_draft_config
    from eagle3lab.formats.profiles import get_profile
    from eagle3lab.formats.schema import engine_capture

    cfg = parse_draft_config(json.loads((SHIPPED / "config.json").read_text()))
    points, source = cfg.training_capture()
    assert points == list(resolve_aux_layers(30).capture_points) and "vllm" in source
    assert engine_capture(get_profile("vllm"), cfg, 30) == (points, False)
    assert engine_capture(get_profile("sglang"), cfg, 30) == (points, True)  # its defaults


def test_manifest_readers_need_no_torch():
    """The lowest layer: shards, formats and aux ids import without torch."""
    code = ("import sys, eagle3lab.targets.auxlayers, eagle3lab.data.shards, "
            "eagle3lab.formats.schema; print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
