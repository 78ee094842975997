"""KV-cache surgery for speculative decoding: keep a prefix or gather the accepted path.

Prevents stale draft/rejected entries from staying in a cache (the next forward would
attend to tokens that were never emitted and diverge from plain decoding). Works on
transformers' DynamicCache layers directly (`.keys` / `.values`), independent of the
`crop` API that changed meaning between transformers releases.
"""

from __future__ import annotations


def keep(cache, length: int) -> None:
    """Keep the first `length` positions of every layer."""
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]


def gather(cache, index) -> None:
    """Keep the positions in `index` (a 1-D LongTensor), in that order."""
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            idx = index.to(layer.keys.device)
            layer.keys = layer.keys.index_select(-2, idx)
            layer.values = layer.values.index_select(-2, idx)


def attention_mask(allowed, dtype):
    """[q, kv] bool (True = may attend) -> the 4-D additive mask HF attention takes.

    None stays None (a single query over the whole cache needs no mask)."""
    import torch

    if allowed is None:
        return None
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]
