"""Training data, stage by stage: prompts, self-written prompts, regenerated conversations,
extracted hidden-state shards and the draft vocabulary map; under torchrun, each rank's
share of a stage and the merge of their parts (`distributed`, `rankparts`).

Prevents training on the wrong thing: text the target never writes, tokens outside the
assistant's turns, half-written shards, or shards made from another target or aux layers.
"""
