"""Where the drafter is in what the at-scale trainers leave on disk: speculators' epoch
checkpoints and SpecForge's step checkpoints, read from their directory layouts alone.

Prevents two silent mix-ups when a user points the doctor, `convert` or `accept` at a
trainer's output instead of a drafter directory: a speculators `save_path` judged as
"no config.json" although its best epoch is one level down, and a SpecForge step
checkpoint (a pickled training state, never unpickled here) taken for a drafter. A
speculators save_path resolves to its `checkpoint_best` epoch, else its last complete one
(saying which); a SpecForge checkpoint is refused with the `specforge export` command that
makes a drafter of it. The listings also give the study its checkpoint table
(eagle3lab.study.runs).

Layouts read (no file is opened but speculators' small JSON records):
- speculators 0.9.0 `speculators/train/checkpointer.py` + `trainer.py`: SAVE/<epoch>/ with
  model.safetensors + config.json (`save_pretrained`, floats cast to bf16 and the config's
  dtype patched), optimizer_state_dict.pt, scheduler_state_dict.pt, training_state.json
  ({epoch, local_step, global_step}), val_metrics.json (best epochs); SAVE/checkpoint_best
  -> <epoch>; SAVE/epoch{E}_step{S} or epoch{E}_end -> <epoch>; SAVE/interrupted/.
- SpecForge 0.2.0 `specforge/training/checkpoint.py` (a6b6b02): OUT/{run_id}-step{N}/
  training_state.pt (+ training_state_rank{r}.pt), OUT/{run_id}-latest and {run_id}-best
  links, OUT/{run_id}.best_meta.json; `specforge/export/to_sglang.py` / `to_hf.py` turn one
  into a drafter directory (`save_pretrained` of LlamaForCausalLMEagle3), which every
  eagle3lab command reads as it is.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

from eagle3lab.errors import UserError

SPECFORGE_STATE = "training_state.pt"
_SF_STEP = re.compile(r"^(.+)-step(\d+)$")


@dataclasses.dataclass(frozen=True)
class FoundCheckpoint:
    path: Path
    step: int | None  # optimizer steps (global) when known
    epoch: int | None
    complete: bool  # every file the tool writes last is there
    servable: bool  # a drafter directory (config.json + weights) every command reads
    best: bool
    latest: bool
    note: str = ""
    record: dict[str, Any] = dataclasses.field(default_factory=dict)


def _json(p: Path) -> dict[str, Any]:
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _link_target(p: Path) -> str | None:
    return os.path.basename(os.readlink(p)) if p.is_symlink() else None


def speculators_epochs(save_path: str | os.PathLike) -> list[FoundCheckpoint]:
    """speculators' epoch checkpoints under `save_path`, oldest first."""
    root = Path(save_path)
    if not root.is_dir():
        return []
    best = _link_target(root / "checkpoint_best")
    last_epoch = None
    found = []
    for d in root.iterdir():
        if d.is_symlink() or not d.is_dir() or not d.name.isdigit():
            continue
        epoch = int(d.name)
        state = _json(d / "training_state.json")
        complete = (d / "model.safetensors").is_file() and (d / "config.json").is_file()
        val = _json(d / "val_metrics.json")
        found.append(FoundCheckpoint(
            path=d, step=state.get("global_step"), epoch=epoch, complete=complete,
            servable=complete, best=best == d.name, latest=False,
            note="" if complete else "no model.safetensors + config.json (save cut short?)",
            record={**({"val_loss": val["loss_epoch"]} if "loss_epoch" in val else {}),
                    **({"local_step": state["local_step"]} if "local_step" in state
                       else {})}))
        if complete:
            last_epoch = max(epoch, last_epoch if last_epoch is not None else -1)
    found.sort(key=lambda c: c.epoch)
    return [dataclasses.replace(c, latest=c.epoch == last_epoch) for c in found]


def specforge_steps(output_dir: str | os.PathLike) -> list[FoundCheckpoint]:
    """SpecForge's `{run_id}-step{N}/` checkpoints under `output_dir`, by run and step."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = _SF_STEP.match(d.name)
        if not m or d.is_symlink() or not d.is_dir():
            continue
        run_id, step = m.group(1), int(m.group(2))
        meta = _json(root / f"{run_id}.best_meta.json")
        best = (_link_target(root / f"{run_id}-best") == d.name
                or (meta.get("run_id") == run_id and meta.get("step") == step))
        found.append(FoundCheckpoint(
            path=d, step=step, epoch=None, complete=(d / SPECFORGE_STATE).is_file(),
            servable=False, best=best,
            latest=_link_target(root / f"{run_id}-latest") == d.name,
            note="training state: `specforge export` makes a drafter of it",
            record={"run_id": run_id, **({"best_score": meta["score"],
                                          "best_metric": meta.get("metric")}
                                         if best and "score" in meta else {})}))
    return sorted(found, key=lambda c: (c.record["run_id"], c.step))


def export_hint(path: Path) -> str:
    return (f"Make a drafter of it with SpecForge's exporter, then pass the export: "
            f"`specforge export --to sglang --checkpoint {path} --draft-config "
            f"DRAFT_CONFIG.json --output-dir OUT` (or `--to hf`, which also writes the "
            f"target's embedding).")


def locate_checkpoint(path: str | os.PathLike, *, log=None) -> Path:
    """The drafter directory `path` means: itself when it holds a config.json; the
    `checkpoint_best` (else last complete) epoch of a speculators save_path; a SpecForge
    step checkpoint or output dir is refused with the export command. Anything else is
    returned unchanged (the doctor then says what it lacks). `log`: told which epoch."""
    p = Path(path)
    if not p.is_dir() or (p / "config.json").is_file():
        return p
    if (p / SPECFORGE_STATE).is_file() or specforge_steps(p):
        what = ("a SpecForge training checkpoint" if (p / SPECFORGE_STATE).is_file()
                else "a SpecForge output directory (its {run_id}-step{N}/ checkpoints)")
        raise UserError(f"{p} is {what}: a pickled training state, not a drafter "
                        f"directory (eagle3lab never unpickles it). " + export_hint(p))
    epochs = [c for c in speculators_epochs(p) if c.servable]
    if not epochs:
        return p
    chosen = next((c for c in epochs if c.best), None) or epochs[-1]
    if log is not None:
        log(f"{p} is a speculators save_path: using epoch {chosen.epoch} "
            f"({'checkpoint_best' if chosen.best else 'the last complete epoch'}).")
    return chosen.path
