"""Train an EAGLE-3 drafter (speculators' model and loss) on eagle3lab shards.

Prevents three silent failures of drafter training, one module each:
- a drafter built for other features (`model.py`, `data.py`): hidden size, aux layers,
  target vocab and draft vocab map come from the shard manifest; mismatched shards are
  refused before any step, naming both values;
- options the serving engine ignores (`config.py`): `serve_engine` picks the speculators
  flags that engine implements (ENGINE_PROFILES) and the run records the choice;
- a run that cannot be trusted after a crash (`checkpoints.py`, `loop.py`): atomic
  checkpoints with optimizer, scheduler, data position and RNG, so `resume=True` logs
  exactly what an uninterrupted run logs; a NaN/inf loss stops the run naming the step and
  the samples, keeping the last good checkpoint.

`online.py` trains without shards: `OnlineSet`, conversations whose states the target
computes inside the loop with extract's capture (`train(online=True, ...)`).
`evaluation.py` holds `evaluate`, the code behind every eval line. This file only
re-exports the public names, so `from eagle3lab.train import X` works for each of them.
"""

from eagle3lab.train.checkpoints import RUN_FORMAT, RUN_VERSION, is_finished, pack_drafter, read_run
from eagle3lab.train.config import ENGINE_PROFILES, TrainConfig
from eagle3lab.train.data import PackedData, shard_identity, split_samples
from eagle3lab.train.evaluation import evaluate
from eagle3lab.train.loop import SIGTERM_EXIT, TrainingDiverged, train, train_run
from eagle3lab.train.model import (build_drafter, check_drafter_against_shards, draft_layer_config,
                                   load_drafter, match_final_state)
from eagle3lab.train.online import OnlineSet

__all__ = [
    "ENGINE_PROFILES", "OnlineSet", "RUN_FORMAT", "RUN_VERSION", "PackedData", "SIGTERM_EXIT",
    "TrainConfig",
    "TrainingDiverged", "build_drafter", "check_drafter_against_shards", "draft_layer_config",
    "evaluate", "is_finished", "load_drafter", "match_final_state", "pack_drafter",
    "read_run", "shard_identity", "split_samples",
    "train", "train_run",
]
