"""The EAGLE-3 drafter at inference time: speculators' own modules driven step by step
with a KV cache, exactly as its training forward pairs inputs.

Prevents the train/infer misalignment that silently caps acceptance (input alignment): step
0 feeds (token x_p, fc(fused aux states of p-1)) at position p; each
later draft step feeds (the drafted token, the drafter's own layer output before its final
norm, not re-normed, not through fc) at the next position; draft ids are mapped to target
ids with the d2t OFFSETS (target = i + d2t[i]). `features="last_layer"` reproduces a server
that captured no aux states: the target's last (normed) hidden state, width H, and `fc`
skipped when H equals the drafter's width (SGLang's `if hidden.shape[-1] != embeds.shape[-1]`).
"""

from __future__ import annotations

from eagle3lab.specdec.kvcache import attention_mask, keep


class Drafter:
    """Wraps a speculators `Eagle3DraftModel` (eval mode) for cached incremental drafting."""

    def __init__(self, model, *, device=None, dtype=None):
        import torch

        self.model = model.eval()
        if device is not None or dtype is not None:
            self.model.to(device=device, dtype=dtype)
        self.layer = model.layers[0]
        self.hidden_size = model.hidden_size
        self.draft_vocab_size = model.draft_vocab_size
        d2t = getattr(model, "d2t", None)
        n = self.draft_vocab_size
        self.hot_ids = (d2t.to(torch.long) + torch.arange(n, device=d2t.device)
                        if d2t is not None else torch.arange(n))
        self.cache = None

    @property
    def device(self):
        return self.model.fc.weight.device

    @property
    def dtype(self):
        return self.model.fc.weight.dtype

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache()

    @property
    def cache_len(self) -> int:
        return self.cache.get_seq_length() if self.cache is not None else 0

    def project(self, features):
        """Target features -> drafter width: fc (after the optional input norms)."""
        m = self.model
        if features.shape[-1] == self.hidden_size:
            return features  # SGLang skips fc when the width already matches (last_layer)
        if m.input_norm is not None:
            features = m.input_norm(features)
        if m.fc_norm is not None:
            import torch

            chunks = features.chunk(len(m.fc_norm), dim=-1)
            features = torch.cat([nrm(c) for nrm, c in zip(m.fc_norm, chunks)], dim=-1)
        return m.fc(features)

    def forward(self, token_ids, hidden, positions, mask=None):
        """One cached forward over n new entries.

        token_ids [n] (target ids), hidden [n, H] (already projected / the drafter's own
        states), positions [n]; mask [n, cache_len + n] bool (None = causal chain).
        Returns (draft logits [n, Vd], output hidden [n, H] before the final norm).
        """
        import torch

        m = self.model
        n = token_ids.shape[0]
        embeds = m.embed_tokens(token_ids.unsqueeze(0))
        x = torch.cat([embeds, hidden.unsqueeze(0).to(embeds.dtype)], dim=-1)
        pos = positions.unsqueeze(0)
        pos_emb = m.rotary_emb(x, pos)
        if mask is None and n > 1:
            mask = torch.ones(n, self.cache_len + n, dtype=torch.bool, device=x.device).tril(
                self.cache_len)
        out = self.layer(x, attention_mask=attention_mask(mask, x.dtype), position_ids=pos,
                         past_key_values=self.cache, use_cache=True, position_embeddings=pos_emb)
        out = out[0] if isinstance(out, tuple) else out
        out = out[0]
        if m.config.norm_output:
            normed = m.norm(out)
            return m.lm_head(normed), normed
        return m.lm_head(m.norm(out)), out

    def crop(self, length: int) -> None:
        keep(self.cache, length)

    def to_target_ids(self, draft_ids):
        return self.hot_ids.to(draft_ids.device)[draft_ids]

