"""Plain autoregressive decoding with the target and a KV cache: the baseline that
speculative decoding must match token for token (at temperature 0) and beat in tokens/s.
"""

from __future__ import annotations

import time
from typing import Callable

from eagle3lab.specdec.result import GenerationResult


def sampling_probs(logits, temperature: float, top_p: float = 1.0):
    """The distribution tokens are sampled from: softmax(logits / T), then nucleus top_p."""
    import torch

    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, idx = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < top_p
        probs = torch.zeros_like(probs).scatter(0, idx[keep], sorted_p[keep])
        probs = probs / probs.sum()
    return probs


def sample_token(logits, temperature: float, top_p: float, generator=None) -> int:
    """Greedy at temperature 0, else a draw from sampling_probs. logits: [V]."""
    import torch

    if temperature <= 0:
        return int(torch.argmax(logits))
    return int(torch.multinomial(sampling_probs(logits, temperature, top_p), 1,
                                 generator=generator))


class PlainEngine:
    """Target-only decoding. `generate` returns a GenerationResult with verify_ct = tokens."""

    num_draft_tokens = 0

    def __init__(self, target):
        self.target = target
        self.tokenizer = target.tokenizer
        eos = target.model.generation_config.eos_token_id
        self.stop_token_ids = set(eos if isinstance(eos, list) else [eos]) - {None}

    def generate(self, input_ids: list[int], *, max_new_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None,
                 stop_token_ids: set[int] | None = None,
                 on_step: Callable[[list[int], int | None], None] | None = None
                 ) -> GenerationResult:
        """`on_step(tokens, accepted)`: called with each new token as it is decided
        (accepted None: plain decoding has no drafts), for a server that streams."""
        import torch
        from transformers import DynamicCache

        model, dev = self.target.model, self.target.device
        stops = self.stop_token_ids if stop_token_ids is None else set(stop_token_ids)
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        cache = DynamicCache(config=model.config)
        out: list[int] = []
        finish = "length"
        with torch.inference_mode():
            t0 = time.perf_counter()
            logits = model(input_ids=torch.tensor([input_ids], device=dev),
                           past_key_values=cache, use_cache=True).logits[0, -1]
            t1 = time.perf_counter()
            for _ in range(max_new_tokens):
                tok = sample_token(logits.cpu(), temperature, top_p, gen)
                out.append(tok)
                if on_step is not None:
                    on_step([tok], None)
                if tok in stops:
                    finish = "stop"
                    break
                if len(out) == max_new_tokens:
                    break
                logits = model(input_ids=torch.tensor([[tok]], device=dev),
                               past_key_values=cache, use_cache=True).logits[0, -1]
            t2 = time.perf_counter()
        return GenerationResult(output_ids=out, finish_reason=finish, verify_ct=len(out),
                                accept_histogram=[len(out)], num_draft_tokens=0,
                                prefill_s=t1 - t0, decode_s=t2 - t1, verify_s=t2 - t1)
