"""An oracle drafter for engine tests: it knows the target's greedy continuation and
proposes it, corrupting a seeded fraction of its guesses. It implements the Drafter
interface (reset/cache_len/project/forward/crop/to_target_ids) with a full-vocabulary
head and ignores the features, so the only thing under test is the engine's verify loop
and cache handling: whatever the oracle proposes, the output must equal plain greedy."""

from __future__ import annotations

import random

import torch


class OracleDrafter:
    def __init__(self, sequence: list[int], vocab: int, hidden: int, wrong: float = 0.3,
                 seed: int = 0):
        self.seq = sequence  # prompt + the target's greedy continuation
        self.vocab, self.hidden_size, self.draft_vocab_size = vocab, hidden, vocab
        self.wrong, self.rng = wrong, random.Random(seed)
        self.hot_ids = torch.arange(vocab)
        self.entries: list[int] = []
        self.device, self.dtype = torch.device("cpu"), torch.float32

    def reset(self):
        self.entries = []

    @property
    def cache_len(self):
        return len(self.entries)

    def project(self, feats):
        return torch.zeros(feats.shape[0], self.hidden_size)

    def crop(self, n):
        self.entries = self.entries[:n]

    def to_target_ids(self, ids):
        return ids

    def forward(self, token_ids, hidden, positions, mask=None):
        n = token_ids.shape[0]
        logits = torch.full((n, self.vocab), -10.0)
        for r, (t, p) in enumerate(zip(token_ids.tolist(), positions.tolist())):
            self.entries.append(t)
            on_track = p < len(self.seq) and self.seq[p] == t
            nxt = self.seq[p + 1] if on_track and p + 1 < len(self.seq) else None
            if nxt is None or self.rng.random() < self.wrong:
                guess = self.rng.randrange(self.vocab)
                logits[r, guess] = 5.0
                if nxt is not None:
                    logits[r, nxt] = 4.0  # the right token is second best (trees find it)
            else:
                logits[r, nxt] = 5.0
                logits[r, (nxt + 1) % self.vocab] = 4.0
        return logits, torch.zeros(n, self.hidden_size)
