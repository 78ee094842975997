"""The SGLang profiles are checked against the installed sglang package's own source.

sglang is installed with --no-deps (requirements-sglang-cpu.txt); its EAGLE-3 module cannot
be imported on this CPU machine (`import sglang` needs orjson & co; past those, the module
imports sglang.srt.configs, whose __init__ reaches `from torchvision...` at module level, and
torchvision must never be installed here), so the files are located with
importlib.util.find_spec (no import) and read with `ast`. The last test tries the import in a
subprocess and, when it fails, skips with the exact error and the torchvision import chain.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3lab.formats.profiles import SGLANG, SGLANG_0523
from eagle3lab.targets.auxlayers import capture_to_ids, default_capture_points, ids_to_capture

SPEC = importlib.util.find_spec("sglang")
pytestmark = pytest.mark.skipif(SPEC is None, reason="sglang is not installed "
                                "(pip install --no-deps -r requirements-sglang-cpu.txt)")
SRT = Path(SPEC.origin).parent / "srt" if SPEC else None


def _tree(rel: str) -> ast.Module:
    return ast.parse((SRT / rel).read_text())


def _cls(tree: ast.Module, name: str) -> ast.ClassDef:
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    assert found, f"class {name} is gone"
    return found[-1]


def _fn(node: ast.AST, name: str) -> ast.FunctionDef:
    found = [n for n in ast.walk(node) if isinstance(n, ast.FunctionDef) and n.name == name]
    assert found, f"function {name} is gone"
    return found[0]


def _src(node: ast.AST) -> str:
    return ast.unparse(node)


@pytest.fixture(scope="module")
def eagle3():
    return _tree("models/llama_eagle3.py")


def test_installed_version_is_the_pinned_one():
    from importlib.metadata import version

    pinned = (Path(__file__).resolve().parents[2] / "requirements-sglang-cpu.txt").read_text()
    assert f"sglang=={version('sglang')}" in pinned
    assert SGLANG_0523.name == f"sglang-{version('sglang')}"


def test_entry_class_is_the_architecture_sglang_profiles_expect(eagle3):
    _cls(eagle3, "LlamaForCausalLMEagle3")
    entry = next(n for n in eagle3.body if isinstance(n, ast.Assign)
                 and _src(n.targets[0]) == "EntryClass")
    assert [_src(e) for e in entry.value.elts] == list(SGLANG.architectures)


def test_load_weights_renames_as_profiled_and_skips_unknown_names(eagle3):
    lw = _fn(_cls(eagle3, "LlamaForCausalLMEagle3"), "load_weights")
    maps = [n for n in ast.walk(lw) if isinstance(n, ast.Assign)
            and _src(n.targets[0]) == "legacy_name_map"]
    assert maps, "legacy_name_map is gone: re-check SGLANG_0523.key_renames"
    renames = ast.literal_eval(maps[0].value)
    assert renames == dict(SGLANG_0523.key_renames)
    assert renames["midlayer"] == "layers.0"  # 0.5.23 loads layers.0.* AND midlayer.*
    # unknown names: looked up with `in params_dict`, never raised on -> silently dropped
    assert not [n for n in ast.walk(lw) if isinstance(n, ast.Raise)]
    assert "if param_name in params_dict:" in _src(lw)
    assert SGLANG.unknown_keys == SGLANG_0523.unknown_keys == "drop"
    text = _src(lw)
    assert "self.hot_token_id = loaded_weight + torch.arange(loaded_weight.shape[0])" in text
    skip_t2d = [n for n in ast.walk(lw) if isinstance(n, ast.If)
                and _src(n.test) == "'t2d' in name"]
    assert skip_t2d and isinstance(skip_t2d[0].body[0], ast.Continue)
    stacked = next(n for n in ast.walk(lw) if isinstance(n, ast.Assign)
                   and _src(n.targets[0]) == "stacked_params_mapping")
    pairs = {(e.elts[0].value, e.elts[1].value) for e in stacked.value.elts}
    assert pairs == {(".qkv_proj", ".q_proj"), (".qkv_proj", ".k_proj"),
                     (".qkv_proj", ".v_proj"), (".gate_up_proj", ".gate_proj"),
                     (".gate_up_proj", ".up_proj")}


def test_decoder_layer_is_a_midlayer_with_double_input_and_no_qkv_bias(eagle3):
    layer = _cls(eagle3, "LlamaDecoderLayer")
    text = _src(layer)
    assert "hidden_size = 2 * self.hidden_size if self.is_input_layer else self.hidden_size" \
        in text
    qkv = next(n for n in ast.walk(layer) if isinstance(n, ast.Call)
               and _src(n.func) == "QKVParallelLinear")
    assert {k.arg: _src(k.value) for k in qkv.keywords}["bias"] == "False"
    assert SGLANG.qkv_bias == SGLANG_0523.qkv_bias == "never"
    assert "self.hidden_norm = RMSNorm(" in text


def test_fc_input_width_and_aux_count(eagle3):
    init = _fn(_cls(eagle3, "LlamaModel"), "__init__")
    text = _src(init)
    fc = next(n for n in ast.walk(init) if isinstance(n, ast.Assign)
              and _src(n.targets[0]) == "self.fc")
    assert _src(fc.value.args[0]) == "self.hidden_size_in * self.num_aux_hidden_states"
    assert "self.hidden_size_in = config.target_hidden_size" in text  # under hasattr(...)
    assert "hasattr(config, 'target_hidden_size')" in text
    # num_aux: explicit attr > eagle_config ids > 3 (SGLANG_0523.fc_num_aux == "config")
    assert "len(layer_ids) if layer_ids else 3" in text
    assert "eagle_config.get('eagle_aux_hidden_state_layer_ids')" in text
    assert SGLANG_0523.fc_num_aux == "config" and SGLANG.fc_num_aux == "fixed3"


def test_fc_is_skipped_when_the_feature_width_equals_the_embedding(eagle3):
    fwd = _fn(_cls(eagle3, "LlamaModel"), "forward")
    guard = next(n for n in ast.walk(fwd) if isinstance(n, ast.If)
                 and "hidden_states.shape[-1] != embeds.shape[-1]" in _src(n.test))
    assert "self.fc(hidden_states)" in _src(guard)


def test_norm_variants_as_profiled(eagle3):
    text = _src(_fn(_cls(eagle3, "LlamaModel"), "__init__"))
    # norm_before_fc: eagle_config first, then the top level
    assert ("eagle_config.get('norm_before_fc', getattr(config, 'norm_before_fc', False))"
            in text)
    assert SGLANG_0523.input_norm_flag_paths == (("eagle_config", "norm_before_fc"),
                                                 ("norm_before_fc",))
    assert "getattr(config, 'fc_norm', None) or getattr(config, 'use_aux_norm', False)" in text
    assert "getattr(config, 'norm_output', False)" in text
    whole = (SRT / "models/llama_eagle3.py").read_text()
    assert "norm_before_residual" not in whole  # no such variant in SGLang
    assert SGLANG.norm_before_residual == SGLANG_0523.norm_before_residual == "never"
    assert SGLANG.input_norm == "never" and SGLANG_0523.input_norm == "config"


def test_aux_capture_defaults_and_plus_one_shift():
    fn = _fn(_cls(_tree("models/llama.py"), "LlamaForCausalLM"),
             "set_eagle3_layers_to_capture")
    text = _src(fn)
    assert "[2, num_layers // 2, num_layers - 3]" in text
    assert "[val + 1 for val in layer_ids]" in text
    assert default_capture_points(30) == [2, 15, 27]
    assert SGLANG.aux_convention == "sglang"
    assert ids_to_capture([1, 14, 26], "sglang") == [2, 15, 27]
    assert capture_to_ids([2, 15, 27], "sglang") == [1, 14, 26]


def test_explicit_ids_only_from_eagle_config():
    tree = _tree("model_executor/model_runner_components/spec_aux_hidden_state.py")
    fn = _fn(tree, "_resolve_eagle_aux_hidden_state")
    assert "config.eagle_aux_hidden_state_layer_ids = eagle_config['eagle_aux_hidden_state" \
           "_layer_ids']" in _src(fn)
    assert SGLANG.aux_ids_path == ("eagle_config", "eagle_aux_hidden_state_layer_ids")


def test_embedding_replaced_unless_hidden_sizes_differ():
    fn = _fn(_cls(_tree("models/llama.py"), "LlamaForCausalLM"), "set_embed")
    text = _src(fn)
    assert "self.config.target_hidden_size != self.config.hidden_size" in text
    assert "self.model.embed_tokens.weight = embed" in text
    assert SGLANG.embedding == "target-unless-hidden-differs"


def _module_imports(rel: str) -> list[str]:
    return [n.module for n in _tree(rel).body if isinstance(n, ast.ImportFrom) and n.module]


def _torchvision_chain() -> str:
    """Which top-level import of the EAGLE-3 module's config package reaches torchvision."""
    for mod in _module_imports("configs/__init__.py"):
        rel = mod.removeprefix("sglang.srt.").replace(".", "/") + ".py"
        if not (SRT / rel).is_file():
            continue
        for sub in [mod] + _module_imports(rel):
            srel = sub.removeprefix("sglang.srt.").replace(".", "/") + ".py"
            if sub.startswith("sglang.srt.") and (SRT / srel).is_file() and any(
                    m.startswith("torchvision") for m in _module_imports(srel)):
                return (f"torchvision (llama_eagle3 -> sglang.srt.configs -> {mod} -> {sub}: "
                        f"`from torchvision...` at module level), which must never be "
                        f"installed here")
    return "its GPU stack"


def test_import_on_cpu_or_say_exactly_why_not():
    """Importing the model module needs sglang's GPU stack; report the first failure."""
    code = "import sglang.srt.models.llama_eagle3 as m; print(m.LlamaForCausalLMEagle3)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0:
        last = [ln for ln in r.stderr.strip().splitlines() if ln.strip()][-1]
        chain = _torchvision_chain()
        pytest.skip(f"sglang.srt.models.llama_eagle3 does not import on this CPU machine: "
                    f"{last}; past sglang's pure deps it would still need {chain}; its source "
                    f"was checked instead")
    assert "LlamaForCausalLMEagle3" in r.stdout
