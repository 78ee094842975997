"""SGLang 0.5.23's Kimi-K2.x drafter (`Eagle3DeepseekV2ForCausalLM`, MLA attention,
srt/models/kimi_k25_eagle3.py): judged by its own key layout and shapes, not called
unknown; planted faults in it are named."""

from __future__ import annotations

import json

import pytest
from pfutil import sglang_cmd

from eagle3lab.formats.doctor import inspect_checkpoint
from eagle3lab.preflight.run import preflight

H, NH, QL, KVL, NOPE, ROPE, V, I = 64, 4, 32, 16, 8, 4, 8, 128


def _mla_draft(path, *, drop=(), reshape=None, layers=1):
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    cfg = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "deepseek_v3",
           "hidden_size": H, "intermediate_size": I, "num_attention_heads": NH,
           "num_key_value_heads": NH, "num_hidden_layers": layers, "vocab_size": 256,
           "draft_vocab_size": 128, "q_lora_rank": QL, "kv_lora_rank": KVL,
           "qk_nope_head_dim": NOPE, "qk_rope_head_dim": ROPE, "v_head_dim": V,
           "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "hidden_act": "silu",
           "tie_word_embeddings": False, "torch_dtype": "bfloat16",
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}}
    (path / "config.json").write_text(json.dumps(cfg))
    p = "layers.0."
    shapes = {p + "self_attn.q_a_proj.weight": (QL, 2 * H),
              p + "self_attn.q_a_layernorm.weight": (QL,),
              p + "self_attn.q_b_proj.weight": (NH * (NOPE + ROPE), QL),
              p + "self_attn.kv_a_proj_with_mqa.weight": (KVL + ROPE, 2 * H),
              p + "self_attn.kv_a_layernorm.weight": (KVL,),
              p + "self_attn.kv_b_proj.weight": (NH * (NOPE + V), KVL),
              p + "self_attn.o_proj.weight": (H, NH * V),
              p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
              p + "mlp.down_proj.weight": (H, I), p + "input_layernorm.weight": (H,),
              p + "hidden_norm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
              "fc.weight": (H, 3 * H), "norm.weight": (H,), "lm_head.weight": (128, H),
              "embed_tokens.weight": (256, H)}
    shapes.update(reshape or {})
    state = {k: torch.zeros(s, dtype=torch.bfloat16) for k, s in shapes.items()
             if k not in drop}
    state["d2t"] = torch.zeros(128, dtype=torch.int64)
    state["t2d"] = torch.cat([torch.ones(128), torch.zeros(128)]).bool()
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def test_mla_drafter_is_judged_by_its_own_layout(pf, tmp_path):
    d = _mla_draft(tmp_path / "mla")
    r = inspect_checkpoint(d, target=pf["target"], engine="sglang-0.5.23")
    assert r.ok, r.table()
    assert r.format == "eagle3" and r.config["mla"]["kv_lora_rank"] == KVL
    assert r.config["aux"]["engine_capture_points"] == [2, 4, 5]
    pre = preflight(sglang_cmd(pf["target"], d, "--dtype", "bfloat16"),
                    engine_version="0.5.23", engine_parser=False)
    assert pre.ok and pre.draft["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]


@pytest.mark.parametrize("fault,code,where", [
    ({"drop": ("layers.0.self_attn.kv_b_proj.weight",)}, "missing-keys", "kv_b_proj"),
    ({"reshape": {"layers.0.self_attn.q_a_proj.weight": (QL, H)}}, "shape", "q_a_proj"),
    ({"reshape": {"layers.0.self_attn.q_proj.weight": (NH * 12, 2 * H)}}, "unknown-keys",
     "q_proj"),
    ({"layers": 2}, "keys-layout", "one"),
])
def test_mla_planted_faults(pf, tmp_path, fault, code, where):
    r = inspect_checkpoint(_mla_draft(tmp_path / "mla", **fault), target=pf["target"],
                           engine="sglang-0.5.23")
    hits = [f for f in r.errors() if f.code == code]
    assert hits and where in hits[0].message, r.table()


def test_mla_drafter_on_an_engine_without_that_class(pf, tmp_path):
    r = inspect_checkpoint(_mla_draft(tmp_path / "mla"), target=pf["target"], engine="sglang")
    assert "architecture" in [f.code for f in r.errors()]
