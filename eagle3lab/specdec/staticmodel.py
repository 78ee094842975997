"""Static-KV forwards of the target and the drafter, replayed as CUDA graphs per shape.

Prevents the offline engine's GPU speed from measuring Python overhead instead of the
models: HF eager decoding on an H200 spends 20-34 ms per step launching kernels, whatever
the number of tokens (1 or 16 new tokens after a 256-token context cost the same), so
"speculative vs plain" there says more about HF eager than about the drafter.

What is here, and what it mirrors:
- `StaticKV`: one preallocated buffer `[layers, 2, batch, kv_heads, max_len, head_dim]`
  per model; every forward writes its new keys/values at given slots per row (rows may
  sit at different lengths: ragged batches) and attends over a fixed-size prefix of the
  buffer, so the shapes of a step never change and it can be captured once.
- `window_mask`: which cached slots each new token may see, from per-row `start` (slots
  below it are the row's context) and a `[batch, q, W]` window of allowed slots from
  `start` on (causal for chains and catch-up, the tree's ancestry for tree verify and
  tree drafting). One mask form for prefill, plain steps, chain/tree verify and drafting.
- `TargetForward`: the decoder of a Llama-family target (Llama, Qwen2, Qwen3, Mistral
  without a sliding window) run layer by layer through the model's OWN modules (its
  embedding, norms, q/k/v/o projections, q/k norms, MLPs, rotary embedding and the
  `apply_rotary_pos_emb` of its modeling module); only the attention over the static
  cache is ours. The inputs of the capture layers are the fused drafter features, exactly
  the states `Target.capture` hooks.
- `DrafterForward`: the speculators EAGLE-3 first layer (speculators 0.9.0
  `models/eagle3/model_definitions.py`, `Eagle3FirstLayerMixin.forward`: split
  [embeds, hidden], `input_layernorm` on the embeds, `hidden_norm` on the hidden,
  residual = hidden (normed when `norm_before_residual`), attention over the
  concatenation, MLP), with the drafter's own modules.
- `Graphs`: `torch.cuda.CUDAGraph` per (kind, shape), warmed up on a side stream, replayed
  with the inputs copied into the captured tensors; on a CPU (CI) the same functions run
  eagerly, so the logic is tested where no GPU is.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

#: model types whose decoder layer `TargetForward` mirrors.
SUPPORTED_TARGETS = ("llama", "qwen2", "qwen3", "mistral")


def unsupported_reason(config, max_len: int | None = None, model=None) -> str | None:
    """Why the static forward cannot run this target (None: it can). model: the loaded
    model, to refuse one spread over several devices (accelerate's device maps)."""
    placed = set((getattr(model, "hf_device_map", None) or {}).values())
    if len(placed) > 1:
        return f"its layers are spread over {len(placed)} devices (a device map)"
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    mt = getattr(cfg, "model_type", None)
    if mt not in SUPPORTED_TARGETS:
        return (f"model type {mt!r} is not one the static engine mirrors "
                f"({', '.join(SUPPORTED_TARGETS)})")
    window = getattr(cfg, "sliding_window", None)
    if getattr(cfg, "use_sliding_window", True) is False:
        window = None
    if "sliding_attention" in (getattr(cfg, "layer_types", None) or []) or (
            window and max_len and window < max_len):
        return f"it uses sliding-window attention (window {window})"
    return None


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


class StaticKV:
    """A model's whole KV cache in one buffer: [layers, 2 (k, v), batch, kv_heads,
    max_len, head_dim]."""

    def __init__(self, *, layers: int, batch: int, kv_heads: int, max_len: int,
                 head_dim: int, dtype, device):
        import torch

        self.max_len = max_len
        self.data = torch.zeros(layers, 2, batch, kv_heads, max_len, head_dim, dtype=dtype,
                                device=device)

    def row(self, b: int):
        """Row b alone (a view: a prefill writes into the batch's buffer)."""
        return self.data[:, :, b:b + 1]

    def move(self, src, dst) -> None:
        move_slots(self.data, src, dst)


def move_slots(data, src, dst) -> None:
    """Per row of a StaticKV buffer, copy slots src[b, i] -> dst[b, i] in every layer (all
    read first). Keeps a tree's accepted path contiguous after verification."""
    import torch

    ar = torch.arange(src.shape[0], device=src.device)[:, None].expand_as(src)
    picked = data[:, :, ar, :, src]  # [B, m, layers, 2, kv_heads, head_dim]
    data[:, :, ar, :, dst] = picked


def window_mask(start, anc, kv_len: int):
    """[B, 1, q, kv_len] bool: slot j is visible to new token i of row b when
    j < start[b] (the row's context), or when 0 <= j - start[b] < W and anc[b, i, j-start[b]]."""
    import torch

    B, q, W = anc.shape
    j = torch.arange(kv_len, device=anc.device)
    rel = j[None, :] - start[:, None]
    inside = (rel >= 0) & (rel < W)
    allowed = torch.gather(anc, 2, rel.clamp(0, W - 1)[:, None, :].expand(B, q, kv_len))
    return ((rel < 0)[:, None, :] | (inside[:, None, :] & allowed))[:, None]


def fold_mask(mask, groups: int):
    """[B, 1, q, kv] -> [B, 1, groups*q, kv]: the mask of queries folded per kv head
    (see `attention`); computed once per forward, not per layer."""
    if groups == 1:
        return mask
    B, _, q, kv = mask.shape
    return mask.expand(B, groups, q, kv).reshape(B, 1, groups * q, kv)


def attention(attn, x, cos, sin, kv, layer: int, write, mask, kv_len: int):
    """One attention block over the static cache: project with the module's own q/k/v
    (and q/k norms), rotate with its modeling module's `apply_rotary_pos_emb`, write the
    new keys/values at slots `write` [B, q], attend over slots [0, kv_len) under `mask`
    (`fold_mask`ed). Grouped-query heads are folded into the query length (one kv head
    per group), so the fused SDPA kernels take the boolean mask with no repeated keys."""
    import torch
    import torch.nn.functional as F

    B, q, _ = x.shape
    hd = attn.head_dim
    qs = attn.q_proj(x).view(B, q, -1, hd)
    ks = attn.k_proj(x).view(B, q, -1, hd)
    vs = attn.v_proj(x).view(B, q, -1, hd)
    if getattr(attn, "q_norm", None) is not None:
        qs, ks = attn.q_norm(qs), attn.k_norm(ks)
    # rotated in the projections' own [B, q, heads, hd] layout (unsqueeze_dim=2): the
    # same elementwise arithmetic, on contiguous tensors (vectorised kernels on a GPU; a
    # transposed layout costs a verify of q > 1 tokens ~120 extra, slower kernels)
    rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
    qs, ks = rope(qs, ks, cos, sin, unsqueeze_dim=2)
    rows = torch.arange(B, device=x.device)[:, None].expand(B, q)
    kv[layer, 0][rows, :, write] = ks.to(kv.dtype)
    kv[layer, 1][rows, :, write] = vs.to(kv.dtype)
    k, v = kv[layer, 0, :, :, :kv_len], kv[layer, 1, :, :, :kv_len]
    kvh = k.shape[1]
    g = qs.shape[2] // kvh
    qf = qs.transpose(1, 2).reshape(B, kvh, g * q, hd)
    o = F.scaled_dot_product_attention(qf, k, v, attn_mask=mask, scale=attn.scaling)
    o = o.reshape(B, kvh * g, q, hd).transpose(1, 2).reshape(B, q, -1)
    return attn.o_proj(o)


class TargetForward:
    """The target's decoder over a static cache; returns (logits, drafter features,
    greedy next tokens). `features`: "fused" (inputs of the capture layers, concatenated)
    or "last_layer" (the final normed state, what a server without aux capture passes);
    None: no features (plain decoding)."""

    def __init__(self, target, capture_points, features: str | None = "fused"):
        m = target.model
        base = m.model
        self.embed, self.layers, self.norm = base.embed_tokens, base.layers, base.norm
        self.rotary, self.lm_head = base.rotary_emb, m.lm_head
        self.points = {p: j for j, p in enumerate(capture_points)} if features == "fused" \
            else {}
        self.features = features
        cfg = m.config.get_text_config() if hasattr(m.config, "get_text_config") else m.config
        self.num_layers = len(self.layers)
        a = self.layers[0].self_attn
        self.head_dim = a.head_dim
        self.kv_heads = a.k_proj.out_features // a.head_dim
        self.groups = a.q_proj.out_features // a.k_proj.out_features
        self.vocab = int(cfg.vocab_size)

    def new_cache(self, *, batch: int, max_len: int, dtype, device) -> StaticKV:
        return StaticKV(layers=self.num_layers, batch=batch, kv_heads=self.kv_heads,
                        max_len=max_len, head_dim=self.head_dim, dtype=dtype, device=device)

    def __call__(self, kv, ids, pos, start, write, anc, *, kv_len: int, last_only=False):
        import torch

        x = self.embed(ids)
        cos, sin = self.rotary(x, pos)
        mask = fold_mask(window_mask(start, anc, kv_len), self.groups)
        caps: list = [None] * len(self.points)
        for i, layer in enumerate(self.layers):
            j = self.points.get(i)
            if j is not None:
                caps[j] = x
            h = attention(layer.self_attn, layer.input_layernorm(x), cos, sin, kv, i, write,
                          mask, kv_len)
            x = x + h
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        normed = self.norm(x)
        feats = (torch.cat(caps, dim=-1) if self.features == "fused" else
                 normed if self.features == "last_layer" else None)
        logits = self.lm_head(normed[:, -1:] if last_only else normed)
        return logits, feats, torch.argmax(logits, dim=-1)


class DrafterForward:
    """The EAGLE-3 drafter's first layer over a static cache (see the module docstring).
    Returns (draft logits, the layer output fed to the next draft step, greedy next
    tokens as TARGET ids)."""

    def __init__(self, drafter):
        m = drafter.model
        self.m, self.layer, self.drafter = m, m.layers[0], drafter
        a = self.layer.self_attn
        self.head_dim = a.head_dim
        self.kv_heads = a.k_proj.out_features // a.head_dim
        self.groups = a.q_proj.out_features // a.k_proj.out_features
        self.hidden_size = drafter.hidden_size

    def new_cache(self, *, batch: int, max_len: int, dtype, device) -> StaticKV:
        return StaticKV(layers=1, batch=batch, kv_heads=self.kv_heads, max_len=max_len,
                        head_dim=self.head_dim, dtype=dtype, device=device)

    def __call__(self, kv, ids, hidden, pos, start, write, anc, hot, *, kv_len: int,
                 project: bool = False):
        import torch

        m, layer = self.m, self.layer
        if project:
            hidden = self.drafter.project(hidden)
        emb = m.embed_tokens(ids)
        hidden = hidden.to(emb.dtype)
        cos, sin = m.rotary_emb(torch.cat([emb, hidden], dim=-1), pos)
        mask = fold_mask(window_mask(start, anc, kv_len), self.groups)
        hn = layer.hidden_norm(hidden)
        residual = hn if layer.norm_before_residual else hidden
        z = torch.cat([layer.input_layernorm(emb), hn], dim=-1)
        x = residual + attention(layer.self_attn, z, cos, sin, kv, 0, write, mask, kv_len)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        normed = m.norm(x)
        out = normed if m.config.norm_output else x
        logits = m.lm_head(normed)
        return logits, out, hot[torch.argmax(logits, dim=-1)]


class Graphs:
    """Replays `fn` as a CUDA graph per key (captured on first use), or runs it eagerly
    (CPU, or `enabled=False`). Outputs of a replay are the graph's own tensors: use them
    before the same key replays again. `compile`: capture torch.compile'd functions
    (fused kernels; compiles once per shape, slow to start). `capture_s`: host seconds
    spent capturing (warm-up included, between device synchronisations), so that timings
    can leave out this one-off cost, which a serving engine pays at its start; `captures`:
    how many graphs were captured (a graph dropped by `clear` and captured again counts
    again)."""

    def __init__(self, enabled: bool, compile: bool = False):
        self.enabled, self.compile = enabled, compile
        self.graphs: dict[Any, tuple] = {}
        self._compiled: dict[tuple, Callable] = {}
        self.capture_s = 0.0
        self.captures = 0

    def clear(self) -> None:
        self.graphs.clear()

    def __len__(self) -> int:
        return len(self.graphs)

    def run(self, key, fn: Callable, tensors: dict[str, Any], **static: Any):
        if not self.enabled:
            return fn(**tensors, **static)
        import torch

        entry = self.graphs.get(key)
        if entry is None:
            torch.cuda.synchronize()
            t_capture = time.perf_counter()
            f = fn
            if self.compile:
                which = (getattr(fn, "__func__", fn), id(getattr(fn, "__self__", None)))
                if which not in self._compiled:
                    self._compiled[which] = torch.compile(fn, dynamic=False)
                f = self._compiled[which]
            inputs = {k: v.clone() for k, v in tensors.items()}
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-up (and compilation) outside the capture
                    f(**inputs, **static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = f(**inputs, **static)
            entry = self.graphs[key] = (graph, inputs, out)
            torch.cuda.synchronize()
            self.capture_s += time.perf_counter() - t_capture
            self.captures += 1
        graph, inputs, out = entry
        for k, v in tensors.items():
            inputs[k].copy_(v)
        graph.replay()
        return out
