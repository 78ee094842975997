"""Preflight of an 8B-sized drafter (Llama-3.1-8B's EAGLE-3 shapes: hidden 4096, 128256
target vocabulary, 32000 draft vocabulary) reads config + safetensors headers only and takes
well under 10 s on a CPU. The weight file is sparse (header written, data never), so the
test writes ~1.6 GB of apparent size in no time."""

from __future__ import annotations

import json
import struct
import time

from pfutil import sglang_cmd, target_like

from eagle3lab.preflight.run import preflight

H, I, V, VD, NH, KV, L = 4096, 14336, 128256, 32000, 32, 8, 32


def write_sparse_safetensors(path, shapes: dict[str, tuple[tuple[int, ...], str]]) -> int:
    """A valid safetensors file whose data region is a hole; returns its apparent size."""
    size = {"BF16": 2, "I64": 8, "BOOL": 1}
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, (shape, dtype) in shapes.items():
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        f.truncate(8 + len(blob) + off)
    return 8 + len(blob) + off


def eight_b_drafter(pf, path):
    spec = json.loads((pf["spec"] / "config.json").read_text())
    layer = spec["transformer_layer_config"]
    layer.update(hidden_size=H, intermediate_size=I, num_attention_heads=NH,
                 num_key_value_heads=KV, head_dim=H // NH, vocab_size=V,
                 max_position_embeddings=131072)
    spec.update(draft_vocab_size=VD, eagle_aux_hidden_state_layer_ids=[2, L // 2, L - 3])
    spec.pop("eagle3lab", None)
    path.mkdir()
    (path / "config.json").write_text(json.dumps(spec))
    p = "layers.0."
    bf = "BF16"
    shapes = {p + "self_attn.q_proj.weight": ((H, 2 * H), bf),
              p + "self_attn.k_proj.weight": ((KV * 128, 2 * H), bf),
              p + "self_attn.v_proj.weight": ((KV * 128, 2 * H), bf),
              p + "self_attn.o_proj.weight": ((H, H), bf),
              p + "mlp.gate_proj.weight": ((I, H), bf), p + "mlp.up_proj.weight": ((I, H), bf),
              p + "mlp.down_proj.weight": ((H, I), bf),
              p + "input_layernorm.weight": ((H,), bf), p + "hidden_norm.weight": ((H,), bf),
              p + "post_attention_layernorm.weight": ((H,), bf),
              "fc.weight": ((H, 3 * H), bf), "norm.weight": ((H,), bf),
              "lm_head.weight": ((VD, H), bf), "embed_tokens.weight": ((V, H), bf),
              "d2t": ((VD,), "I64"), "t2d": ((V,), "BOOL")}
    return write_sparse_safetensors(path / "model.safetensors", shapes)


def test_8b_drafter_preflight_under_10_s(pf, tmp_path):
    target = target_like(pf, tmp_path / "llama8b", architectures=["LlamaForCausalLM"],
                         hidden_size=H, intermediate_size=I, num_attention_heads=NH,
                         num_key_value_heads=KV, num_hidden_layers=L, vocab_size=V,
                         max_position_embeddings=131072)
    size = eight_b_drafter(pf, tmp_path / "draft8b")
    assert size > 1.5e9
    t0 = time.perf_counter()
    r = preflight(sglang_cmd(target, tmp_path / "draft8b", "--tp", "8"),
                  engine_version="0.5.23", engine_parser=False)
    seconds = time.perf_counter() - t0
    print(f"preflight of an 8B-sized drafter (apparent {size / 1e9:.2f} GB): {seconds:.2f} s")
    assert seconds < 10
    assert r.capture["status"] == "yes" and r.aux["engine_capture_points"] is not None
    # a speculators checkpoint on SGLang: the dropped layers.0.* keys, not a shape problem
    assert "keys-layout" in r.codes and "shape" not in r.codes and "fc-dim" not in r.codes
