"""The target LLM: load it (a preset, a directory or a hub id), know its shape, capture its
aux hidden states with hooks, and prepare the embedded default target.

Prevents the aux-layer silent failure: SGLang and vLLM read the same explicit layer-id list
differently, so every capture point is resolved with its convention and recorded
(`eagle3lab.targets.auxlayers`), and the default target is converted once and verified.
"""
