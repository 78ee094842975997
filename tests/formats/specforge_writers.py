"""SpecForge's exported drafters and step checkpoints, written as SpecForge 0.2.0 writes them
(specforge does not import without its GPU stack, so its format is reproduced here, citing
the source at a6b6b02):

- `specforge export --to sglang|hf` (specforge/export/to_sglang.py, to_hf.py,
  checkpoint_io.py): `materialize_draft` builds `LlamaForCausalLMEagle3`
  (specforge/modeling/draft/llama3_eagle.py: embed_tokens, midlayer.{self_attn, mlp,
  hidden_norm, input_layernorm, post_attention_layernorm}, fc, norm, lm_head and the bool
  t2d / int64 d2t buffers) in bf16 from a flat LlamaConfig draft config, then
  `save_pretrained(OUT, state_dict=...)`: without any `embed` key for sglang, with the
  target's embedding for hf; `apply_legacy_rope_scaling` copies rope_theta to the top level.
  The module below has SpecForge's module names, so transformers' own save_pretrained
  writes the same file names, tensor names, dtypes and config fields.
- a step checkpoint (specforge/training/checkpoint.py `CheckpointManager`): OUT/{run_id}-
  step{N}/training_state.pt (torch.save of the shared state, whose `draft_state_dict` the
  exporter reads), the `{run_id}-latest` / `{run_id}-best` relative links and
  `{run_id}.best_meta.json`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def _classes():
    import torch
    from torch import nn
    from transformers import LlamaConfig, PreTrainedModel

    class RMSNorm(nn.Module):
        def __init__(self, h):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(h))

    class Attention(nn.Module):
        def __init__(self, c):
            super().__init__()
            hd = c.hidden_size // c.num_attention_heads
            self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * hd, bias=False)
            self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * hd, bias=False)
            self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * hd, bias=False)
            self.o_proj = nn.Linear(c.num_attention_heads * hd, c.hidden_size, bias=False)

    class MLP(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
            self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
            self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    class DecoderLayer(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.self_attn, self.mlp = Attention(c), MLP(c)
            self.hidden_norm = RMSNorm(c.hidden_size)
            self.input_layernorm = RMSNorm(c.hidden_size)
            self.post_attention_layernorm = RMSNorm(c.hidden_size)

    class LlamaForCausalLMEagle3(PreTrainedModel):
        config_class = LlamaConfig

        def __init__(self, config):
            super().__init__(config)
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                             config.pad_token_id)
            self.midlayer = DecoderLayer(config)
            self.fc = nn.Linear(3 * config.hidden_size, config.hidden_size, bias=False)
            self.norm = RMSNorm(config.hidden_size)
            self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
            self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool))
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.int64))
            self.post_init()

    return LlamaConfig, LlamaForCausalLMEagle3


def draft_state_from_speculators(spec_dir) -> dict:
    """A speculators draft's weights under SpecForge's trainer names (midlayer.*), no
    embedding and no verifier copies: the `draft_state_dict` of a SpecForge checkpoint."""
    from safetensors.torch import load_file

    out = {}
    for k, v in load_file(str(Path(spec_dir) / "model.safetensors")).items():
        if k.startswith(("verifier_", "embed_tokens")):
            continue
        out["midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k] = v
    return out


def export(draft_state: dict, out, *, target_dir, to: str = "sglang") -> Path:
    """`specforge export --to {to}` of a checkpoint whose draft_state_dict is `draft_state`,
    with a draft config made for the target (as SpecForge's configs/*-eagle3.json)."""
    import torch
    from transformers import AutoConfig

    LlamaConfig, Model = _classes()
    t = AutoConfig.from_pretrained(str(target_dir))
    draft_vocab = draft_state["lm_head.weight"].shape[0]
    cfg = LlamaConfig(architectures=["LlamaForCausalLMEagle3"], hidden_size=t.hidden_size,
                      intermediate_size=t.intermediate_size, num_hidden_layers=1,
                      num_attention_heads=t.num_attention_heads,
                      num_key_value_heads=t.num_key_value_heads, vocab_size=t.vocab_size,
                      max_position_embeddings=t.max_position_embeddings,
                      rms_norm_eps=t.rms_norm_eps, hidden_act="silu", pad_token_id=0,
                      tie_word_embeddings=False)
    cfg.draft_vocab_size = draft_vocab
    model = Model(cfg).to(torch.bfloat16)  # materialize_draft: torch_dtype=torch.bfloat16
    missing, unexpected = model.load_state_dict(draft_state, strict=False)
    assert not unexpected and all("embed" in k for k in missing), (missing, unexpected)
    out = Path(out)
    if to == "sglang":
        state = {k: v for k, v in model.state_dict().items() if "embed" not in k.lower()}
    else:
        from eagle3lab.formats.targetinfo import target_tensor

        state = dict(model.state_dict())
        state["embed_tokens.weight"] = target_tensor(target_dir, "embed").to(torch.bfloat16)
    model.save_pretrained(out, state_dict=state)
    config = json.loads((out / "config.json").read_text())  # apply_legacy_rope_scaling
    theta = (config.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None and config.get("rope_theta") != theta:
        config["rope_theta"] = theta
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


def step_checkpoint(output_dir, run_id: str, step: int, draft_state: dict, *,
                    latest: bool = False, best_score: float | None = None) -> Path:
    """CheckpointManager.save (+ update_best): OUT/{run_id}-step{step}/training_state.pt."""
    import torch

    out = Path(output_dir)
    d = out / f"{run_id}-step{step}"
    d.mkdir(parents=True, exist_ok=True)
    torch.save({"draft_state_dict": draft_state, "global_step": step, "strategy": "eagle3",
                "run_id": run_id, "world_size": 1}, d / "training_state.pt")
    if latest:
        _point(out / f"{run_id}-latest", d.name)
    if best_score is not None:
        _point(out / f"{run_id}-best", d.name)
        (out / f"{run_id}.best_meta.json").write_text(json.dumps(
            {"run_id": run_id, "step": step, "score": best_score,
             "metric": "eval/simulated_acc_len", "metrics": {}}, indent=2))
    return d


def _point(link: Path, name: str) -> None:
    if link.is_symlink():
        link.unlink()
    os.symlink(name, link)
