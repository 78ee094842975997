"""Preflight of an 8B-sized drafter (Llama-3.1-8B's EAGLE-3 shapes: hidden 4096, 128256
target vocabulary, 32000 draft vocabulary) reads config + safetensors headers, and of the
tensors' data at most the small vocabulary maps (d2t, t2d): what it reads is counted, not
timed, so the check holds on a loaded machine (reading the weights' values would read
~1.6 GB). The weight file is sparse (header written, data never), so the test writes
~1.6 GB of apparent size in no time."""

from __future__ import annotations

import json
import struct

import pytest
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


@pytest.fixture
def tensor_reads(monkeypatch) -> list[tuple[str, int]]:
    """(name, bytes) of every tensor read through safetensors (`safe_open`'s get_tensor and
    get_slice, which the checkpoint reader uses, and `load_file`) while the test runs."""
    import safetensors
    import safetensors.torch

    reads: list[tuple[str, int]] = []
    real_open, real_load = safetensors.safe_open, safetensors.torch.load_file

    def count(name, t):
        reads.append((name, t.numel() * t.element_size()))
        return t

    class Slice:
        def __init__(self, sl, name):
            self._sl, self._name = sl, name

        def __getitem__(self, index):
            return count(self._name, self._sl[index])

        def __getattr__(self, attr):
            return getattr(self._sl, attr)

    class CountingOpen:
        def __init__(self, *a, **k):
            self._h = real_open(*a, **k)

        def __enter__(self):
            self._h.__enter__()
            return self

        def __exit__(self, *exc):
            return self._h.__exit__(*exc)

        def get_tensor(self, name):
            return count(name, self._h.get_tensor(name))

        def get_slice(self, name):
            return Slice(self._h.get_slice(name), name)

        def __getattr__(self, attr):
            return getattr(self._h, attr)

    def load_file(*a, **k):
        return {n: count(n, t) for n, t in real_load(*a, **k).items()}

    monkeypatch.setattr(safetensors, "safe_open", CountingOpen)
    monkeypatch.setattr(safetensors.torch, "load_file", load_file)
    return reads


def test_8b_drafter_preflight_reads_headers_not_weights(pf, tmp_path, tensor_reads):
    target = target_like(pf, tmp_path / "llama8b", architectures=["LlamaForCausalLM"],
                         hidden_size=H, intermediate_size=I, num_attention_heads=NH,
                         num_key_value_heads=KV, num_hidden_layers=L, vocab_size=V,
                         max_position_embeddings=131072)
    size = eight_b_drafter(pf, tmp_path / "draft8b")
    assert size > 1.5e9
    r = preflight(sglang_cmd(target, tmp_path / "draft8b", "--tp", "8"),
                  engine_version="0.5.23", engine_parser=False)
    read = sum(n for _, n in tensor_reads)
    print(f"preflight of an 8B-sized drafter (apparent {size / 1e9:.2f} GB) read "
          f"{read / 1e6:.2f} MB of tensors: {sorted({t for t, _ in tensor_reads})}")
    assert {t for t, _ in tensor_reads} <= {"d2t", "t2d"}, tensor_reads  # no weight
    assert read <= (VD * 8 + V) * 2, read  # the vocabulary maps, each at most twice
    assert r.capture["status"] == "yes" and r.aux["engine_capture_points"] is not None
    # a speculators checkpoint on SGLang: the dropped layers.0.* keys, not a shape problem
    assert "keys-layout" in r.codes and "shape" not in r.codes and "fc-dim" not in r.codes
