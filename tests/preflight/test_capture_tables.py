"""The capture-support tables: the committed SGLang table equals what the generator reads
from the installed sglang's source today, the committed vLLM table what it reads from a
vLLM source tree where one is found (drift fails), and the verdicts per version."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from eagle3lab.preflight.capture import capture_verdict, load_table, table_sizes
from eagle3lab.preflight.gen_capture_table import (build_table, build_vllm_table, scan,
                                                   scan_vllm, table_path)


def _vllm_source() -> Path | None:
    """A vLLM source tree: $EAGLE3LAB_VLLM_SOURCE (the `vllm` directory of an unpacked
    wheel), else the installed vllm's package directory."""
    given = os.environ.get("EAGLE3LAB_VLLM_SOURCE")
    if given:
        return Path(given)
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return None


def test_committed_sglang_table_matches_the_installed_source():
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (requirements-sglang-cpu.txt)")
    fresh = build_table()
    committed = json.loads(table_path(fresh["version"]).read_text())
    assert committed == fresh, ("capture table drift: run python -m "
                                "eagle3lab.preflight.gen_capture_table and commit it")
    assert fresh["counts"]["with_capture"] > 20 and fresh["counts"]["without_capture"] > 20


def test_committed_vllm_table_matches_a_vllm_source_tree():
    src = _vllm_source()
    if src is None or not (src / "model_executor" / "models" / "registry.py").is_file():
        pytest.skip("no vLLM source here: set EAGLE3LAB_VLLM_SOURCE to an unpacked wheel's "
                    "vllm/ directory (vLLM does not install on this CPU machine)")
    fresh = build_vllm_table(src)
    path = table_path(fresh["version"], "vllm")
    if not path.is_file():
        pytest.skip(f"no committed table for vLLM {fresh['version']}")
    assert json.loads(path.read_text()) == fresh, (
        "capture table drift: run python -m eagle3lab.preflight.gen_capture_table --engine "
        "vllm --source DIR/vllm and commit it")


def test_vllm_generator_registry_protocol_packages_and_platform_branches(tmp_path):
    """A tiny vllm tree: the registry's merged dicts (drafters left out), SupportsEagle3
    declared directly, inherited through an import, not at all; a hardware-isolated
    package whose __init__ picks the CUDA implementation in an if/else."""
    models = tmp_path / "model_executor" / "models"
    models.mkdir(parents=True)
    (models / "interfaces.py").write_text("class SupportsEagle3:\n    pass\n")
    (models / "llama.py").write_text(
        "from .interfaces import SupportsEagle3\n"
        "class LlamaForCausalLM(object, SupportsEagle3):\n    pass\n")
    (models / "mistral.py").write_text(
        "from vllm.model_executor.models.llama import LlamaForCausalLM\n"
        "class MistralForCausalLM(LlamaForCausalLM):\n    pass\n")
    (models / "glm4.py").write_text("class Glm4ForCausalLM:\n    pass\n")
    (models / "registry.py").write_text(
        "_TEXT_GENERATION_MODELS = {\n"
        "    'LlamaForCausalLM': ('llama', 'LlamaForCausalLM'),\n"
        "    'MistralForCausalLM': ('mistral', 'MistralForCausalLM'),\n"
        "    'Glm4ForCausalLM': ('glm4', 'Glm4ForCausalLM'),\n"
        "    'BigForCausalLM': ('vllm.models.big', 'BigForCausalLM'),\n}\n"
        "_SPECULATIVE_DECODING_MODELS = {'Eagle3LlamaForCausalLM': ('llama', 'X')}\n"
        "_VLLM_MODELS = {**_TEXT_GENERATION_MODELS, **_SPECULATIVE_DECODING_MODELS}\n")
    big = tmp_path / "models" / "big"
    for plat, bases in (("nvidia", "(SupportsEagle3)"), ("amd", "")):
        (big / plat).mkdir(parents=True)
        (big / plat / "model.py").write_text(
            "from vllm.model_executor.models.interfaces import SupportsEagle3\n"
            f"class BigForCausalLM{bases}:\n    pass\n")
    (big / "__init__.py").write_text(
        "from vllm.platforms import current_platform\n"
        "if current_platform.is_rocm():\n    from .amd.model import BigForCausalLM\n"
        "else:\n    from .nvidia.model import BigForCausalLM\n")
    t = scan_vllm(tmp_path)
    assert set(t) == {"LlamaForCausalLM", "MistralForCausalLM", "Glm4ForCausalLM",
                      "BigForCausalLM"}
    assert t["LlamaForCausalLM"]["capture"] and \
        t["LlamaForCausalLM"]["source"] == "vllm/model_executor/models/llama.py"
    assert t["MistralForCausalLM"]["capture"] and "bases of LlamaForCausalLM" in \
        t["MistralForCausalLM"]["via"]
    assert not t["Glm4ForCausalLM"]["capture"]
    assert t["BigForCausalLM"]["capture"] and \
        t["BigForCausalLM"]["source"] == "vllm/models/big/nvidia/model.py"


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
    assert capture_verdict(engine="reference", version=None,
                           architecture="Anything").status == "yes"


@pytest.mark.parametrize("version", [None, "unknown", "0.25.1", "0.26.0"])
def test_vllm_verdicts_use_the_0251_table_for_unknown_exact_and_newer(version):
    llama = capture_verdict(engine="vllm", version=version, architecture="LlamaForCausalLM")
    assert llama.status == "yes" and llama.table == "vllm-0.25.1"
    assert llama.entry["source"] == "vllm/model_executor/models/llama.py"
    glm = capture_verdict(engine="vllm", version=version, architecture="Glm4ForCausalLM")
    assert glm.status == "no" and "Model does not support EAGLE3" in glm.absent_behaviour
    assert capture_verdict(engine="vllm", version=version,
                           architecture="KimiK25ForConditionalGeneration").status == "yes"
    if version in (None, "unknown"):
        assert "not known here" in llama.note and "0.25.1" in llama.version
    if version == "0.26.0":
        assert "the newest older one" in llama.note


def test_vllm_verdicts_for_an_older_release_keep_only_the_noes():
    old = capture_verdict(engine="vllm", version="0.10.2", architecture="LlamaForCausalLM")
    assert old.status == "unknown" and "was not read" in old.note
    assert capture_verdict(engine="vllm", version="0.10.2",
                           architecture="Glm4ForCausalLM").status == "no"
    odd = capture_verdict(engine="vllm", version="0.25.1", architecture="NoSuchForCausalLM")
    assert odd.status == "unknown" and "registry" in odd.note


def test_every_entry_cites_its_source_and_sizes_are_reported():
    sizes = {s["table"]: s for s in table_sizes()}
    assert {"vllm-0.25.1", "sglang-0.5.23", "sglang-reported"} <= set(sizes)
    for name in sizes:
        t = load_table(name)
        assert t["version"] and t["method"] and t["absent_behaviour"]
        for arch, e in t["architectures"].items():
            assert e["source"], arch
    assert sizes["vllm-0.25.1"]["with_capture"] > 50
    assert sizes["vllm-0.25.1"]["without_capture"] > 50
