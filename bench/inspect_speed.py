"""Time `inspect` on a drafter the size of an 8B target's (Llama-3.1-8B shapes).

Prevents the doctor from becoming the slow step people skip: it must answer in under 5 s
on a 2-core CPU for hidden 4096, intermediate 14336, vocab 128256, draft vocab 32000
(about 0.9 G parameters, 1.9 GB in bfloat16, embedding included), NaN scan and vocab map
included. Builds a random SGLang-format drafter plus a config-only target in a temp dir
(not timed), then prints the seconds of each inspect run. The files were just written, so
they are in the page cache: this measures the doctor, not the disk.

    .venv/bin/python bench/inspect_speed.py [--dtype bfloat16] [--repeat 3] [--keep DIR]
"""

from __future__ import annotations

import os
import sys

# This file is named like the standard library's `inspect`; run as a script, its folder is
# sys.path[0] and would shadow it for every later import. Drop it first.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

H, I, V, VD, LAYERS, HEADS, KV = 4096, 14336, 128256, 32000, 32, 32, 8


def build(root: Path, dtype_name: str) -> tuple[Path, Path]:
    import torch
    from safetensors.torch import save_file

    dtype = getattr(torch, dtype_name)
    target = root / "target"
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
        "intermediate_size": I, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV, "vocab_size": V, "max_position_embeddings": 131072}))
    hd = H // HEADS
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return (0.02 * torch.randn(*shape, generator=g)).to(dtype)

    ids = torch.sort(torch.randperm(V, generator=g)[:VD]).values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    state = {
        "embed_tokens.weight": rnd(V, H), "lm_head.weight": rnd(VD, H),
        "fc.weight": rnd(H, 3 * H), "norm.weight": torch.ones(H, dtype=dtype),
        "d2t": ids - torch.arange(VD), "t2d": t2d,
        "midlayer.self_attn.q_proj.weight": rnd(HEADS * hd, 2 * H),
        "midlayer.self_attn.k_proj.weight": rnd(KV * hd, 2 * H),
        "midlayer.self_attn.v_proj.weight": rnd(KV * hd, 2 * H),
        "midlayer.self_attn.o_proj.weight": rnd(H, HEADS * hd),
        "midlayer.mlp.gate_proj.weight": rnd(I, H), "midlayer.mlp.up_proj.weight": rnd(I, H),
        "midlayer.mlp.down_proj.weight": rnd(H, I),
        "midlayer.input_layernorm.weight": torch.ones(H, dtype=dtype),
        "midlayer.post_attention_layernorm.weight": torch.ones(H, dtype=dtype),
        "midlayer.hidden_norm.weight": torch.ones(H, dtype=dtype),
    }
    draft = root / "draft"
    draft.mkdir()
    save_file(state, str(draft / "model.safetensors"), metadata={"format": "pt"})
    (draft / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
        "intermediate_size": I, "num_hidden_layers": 1, "num_attention_heads": HEADS,
        "num_key_value_heads": KV, "vocab_size": V, "draft_vocab_size": VD,
        "target_hidden_size": H, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "torch_dtype": dtype_name,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28],
                         "use_aux_hidden_state": True}}))
    return draft, target


def plant_nan(path: Path, name: str) -> None:
    """Overwrite the last element of tensor `name` with NaN, in place (bf16/f16/f32)."""
    import struct

    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        entry = json.loads(f.read(n))[name]
        nan = {"BF16": b"\xc0\x7f", "F16": b"\x00\x7e", "F32": b"\x00\x00\xc0\x7f"}[
            entry["dtype"]]
        f.seek(8 + n + entry["data_offsets"][1] - len(nan))
        f.write(nan)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--repeat", type=int, default=3, help="inspect runs to time")
    ap.add_argument("--keep", default=None, help="build here and keep it (default: temp dir)")
    args = ap.parse_args(argv)

    from eagle3lab.formats import inspect_checkpoint

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-inspect-"))
    try:
        t0 = time.perf_counter()
        draft, target = build(root, args.dtype)
        size = sum(f.stat().st_size for f in draft.iterdir()) / 1e9
        print(f"built {size:.2f} GB drafter ({args.dtype}) in {time.perf_counter() - t0:.1f} s "
              f"at {draft}")
        for i in range(args.repeat):
            t = time.perf_counter()
            report = inspect_checkpoint(draft, target=target, engine="sglang")
            dt = time.perf_counter() - t
            print(f"inspect run {i + 1}: {dt:.2f} s  ok={report.ok}  "
                  f"findings={[f.code for f in report.findings]}")
        t = time.perf_counter()
        inspect_checkpoint(draft, target=target, engine="sglang", check_values=False)
        print(f"inspect --no-values: {time.perf_counter() - t:.2f} s")
        plant_nan(draft / "model.safetensors", "embed_tokens.weight")
        t = time.perf_counter()
        report = inspect_checkpoint(draft, target=target, engine="sglang")
        found = [(f.code, f.tensor) for f in report.findings]
        print(f"inspect with one NaN planted in the last embedding row: "
              f"{time.perf_counter() - t:.2f} s  found={found}")
        if ("nonfinite", "embed_tokens.weight") not in found:
            print("ERROR: the planted NaN was not found")
            return 1
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("inspect_speed.py", main))
