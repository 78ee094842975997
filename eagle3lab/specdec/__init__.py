"""Offline speculative decoding: the target verifying an EAGLE-3 drafter, with exact
per-position acceptance counts (and plain decoding as the baseline).

Prevents the "accept length 1.00 in production" surprise: a drafter's acceptance and
speedup are measured on a laptop, with an engine whose output at temperature 0 equals
plain greedy decoding token for token, before a GPU server is started.
"""
