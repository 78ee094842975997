"""Offline speculative decoding: the target verifying an EAGLE-3 drafter, with exact
per-position acceptance counts (and plain decoding as the baseline)."""
