"""The capture-support tables: the committed SGLang table equals what the generator reads
from the installed sglang's source today (drift fails), and the verdicts per version."""

from __future__ import annotations

import importlib.util
import json

import pytest

from eagle3lab.preflight.capture import capture_verdict, load_table, table_sizes
from eagle3lab.preflight.gen_capture_table import build_table, scan, table_path


def test_committed_sglang_table_matches_the_installed_source():
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (requirements-sglang-cpu.txt)")
    fresh = build_table()
    committed = json.loads(table_path(fresh["version"]).read_text())
    assert committed == fresh, ("capture table drift: run python -m "
                                "eagle3lab.preflight.gen_capture_table and commit it")
    assert fresh["counts"]["with_capture"] > 20 and fresh["counts"]["without_capture"] > 20


def test_generator_resolves_bases_across_modules_forwarders_and_raisers(tmp_path):
    """A tiny srt/models tree: inheritance through an import, an alias, a wrapper that
    forwards to its language model, one that only raises, one without the method."""
    (tmp_path / "base.py").write_text(
        "class Base:\n    def set_eagle3_layers_to_capture(self, ids=None):\n"
        "        self.ids = ids\n")
    (tmp_path / "child.py").write_text(
        "from sglang.srt.models.base import Base as B\nfrom .base import Base\n"
        "class Child(B):\n    pass\nAlias = Child\nclass Plain:\n    pass\n"
        "EntryClass = [Alias, Plain]\n")
    (tmp_path / "wrap.py").write_text(
        "class Wrap:\n    def set_eagle3_layers_to_capture(self, ids=None):\n"
        "        '''doc'''\n        self.language_model.set_eagle3_layers_to_capture(ids)\n"
        "class No:\n    def set_eagle3_layers_to_capture(self, ids=None):\n"
        "        raise NotImplementedError\nEntryClass = (Wrap, No)\n")
    t = scan(tmp_path)
    assert t["Child"]["capture"] and "Base (sglang/srt/models/base.py)" in t["Child"]["via"]
    assert not t["Plain"]["capture"] and "via" not in t["Plain"]
    assert t["Wrap"]["capture"] and "to self.language_model" in t["Wrap"]["via"]
    assert not t["No"]["capture"] and t["No"]["via"].startswith("raises")


def test_verdicts_per_engine_and_version():
    assert capture_verdict(engine="sglang", version="0.5.23",
                           architecture="LlamaForCausalLM").status == "yes"
    assert capture_verdict(engine="sglang", version="0.5.23",
                           architecture="Glm4ForCausalLM").status == "no"
    newer = capture_verdict(engine="sglang", version="0.6.1", architecture="LlamaForCausalLM")
    assert newer.status == "yes" and "the newest older one" in newer.note
    kimi_old = capture_verdict(engine="sglang", version="0.5.9",
                               architecture="KimiK25ForConditionalGeneration")
    assert kimi_old.status == "no" and kimi_old.table == "sglang-reported"
    llama_old = capture_verdict(engine="sglang", version="0.5.9",
                                architecture="LlamaForCausalLM")
    assert llama_old.status == "unknown" and "was not read" in llama_old.note
    assert capture_verdict(engine="vllm", version=None,
                           architecture="Qwen3ForCausalLM").status == "yes"
    kimi_vllm = capture_verdict(engine="vllm", version=None,
                                architecture="KimiK25ForConditionalGeneration")
    assert kimi_vllm.status == "yes" and "older vLLM" in kimi_vllm.entry["caveat"]
    assert capture_verdict(engine="reference", version=None,
                           architecture="Anything").status == "yes"


def test_every_entry_cites_its_source_and_sizes_are_reported():
    sizes = {s["table"]: s for s in table_sizes()}
    assert {"vllm", "sglang-reported"} <= set(sizes)
    for name in sizes:
        t = load_table(name)
        assert t["version"] and t["method"] and t["absent_behaviour"]
        for arch, e in t["architectures"].items():
            assert e["source"], arch
    assert sizes["vllm"]["complete"] is False
