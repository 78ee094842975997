"""What every reader of another tool's hidden-state dataset shares: the manifest it
synthesises (kept beside the data as `eagle3lab.manifest.json`), the width check, the
ShardSet interface over per-sample files.

Prevents three silent failures of training on data eagle3lab did not extract:
- features from other layers than assumed: the files of SpecForge and speculators do not
  record which target layers they hold, so the synthesised manifest records the aux ids
  it assumes AND their convention (`aux_layers.source` says whether they were given or
  are the tool's default), and the target they were made from (asked for: neither tool
  records it), so `train` checks them as it checks our own shards;
- a set whose widths do not fit the target: the aux states must be n_aux x H wide and the
  final state H wide (a 7168-wide aux state against a 21504-wide drafter fc: the
  "7168 vs 21504" failure, caught here at data level before a drafter is built);
- targets computed from the wrong final state: `final_state` records whether the set's
  final state is the input of the target's final norm (speculators, us) or its output
  (SpecForge); training then drops the drafter's verifier norm for a normed set
  (`eagle3lab.train.model.match_final_state`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterator

from eagle3lab import __version__
from eagle3lab.config import TARGET_PRESETS
from eagle3lab.errors import UserError
from eagle3lab.fsutil import atomic_write_json, read_json_object
from eagle3lab.data.rendering import unknown
from eagle3lab.data.shards import ShardSet
from eagle3lab.targets.adapter import config_sha256, resolve_target_path
from eagle3lab.targets.auxlayers import resolve_aux_layers

SIDECAR = "eagle3lab.manifest.json"
SIDECAR_FORMAT = "eagle3lab-foreign-data"
SIDECAR_VERSION = 1
#: What `final_state` may say about the set's final hidden state.
FINAL_STATES = {"pre_norm": "input of the target's final norm (speculators' and eagle3lab's "
                "verifier_last_hidden_states)",
                "normed": "output of the target's final norm (SGLang's logits-processor "
                "input); the drafter's targets are lm_head(state), with no norm"}


def target_record(target: str) -> dict[str, Any]:
    """What the manifest records about the target, from its config alone (no weights)."""
    from transformers import AutoConfig

    path = resolve_target_path(target)
    try:
        cfg = AutoConfig.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 (any failure means: not a model dir)
        raise UserError(f"Cannot read the target config of {target!r} ({path}): "
                        f"{type(e).__name__}: {e}") from None
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return {"name": str(target) if str(target) in TARGET_PRESETS else Path(path).name,
            "path": path, "config_sha256": config_sha256(cfg.to_dict()),
            "architecture": (cfg.architectures or ["?"])[0],
            "num_layers": int(text.num_hidden_layers), "hidden_size": int(text.hidden_size),
            "vocab_size": int(text.vocab_size),
            "max_position_embeddings": getattr(text, "max_position_embeddings", None)}


def check_widths(*, aux_width: int, last_width: int, hidden: int, n_aux: int,
                 where: str, tool: str) -> None:
    """Refuse a sample whose widths do not fit a target of hidden size `hidden`."""
    problems = []
    if aux_width != n_aux * hidden:
        problems.append(f"the aux states are {aux_width} wide, a drafter for this target "
                        f"reads {n_aux} x {hidden} = {n_aux * hidden}")
    if last_width != hidden:
        problems.append(f"the final state is {last_width} wide, the target's hidden size is "
                        f"{hidden}")
    if problems:
        raise UserError(f"{where} ({tool}) does not fit the target: " + "; ".join(problems)
                        + ". The set was captured from another target or with another "
                        "number of aux layers; pass the target (--target) and aux ids "
                        "(--aux-ids) it was made with.")


class ForeignSet(ShardSet):
    """A ShardSet over another tool's per-sample files: same samples dict, same checks.

    Subclasses set TOOL, FINAL_STATE, DEFAULT_CONVENTION and implement `_list` (sample
    keys + file paths as str, no tensor loaded), `_read` (one sample: aux [T, A*H], last [T, H],
    input_ids, loss_mask), `_shapes` (the first sample's widths and dtype) and
    `_default_aux_ids`."""

    TOOL = "?"
    FORMAT = "?"
    FINAL_STATE = "pre_norm"
    DEFAULT_CONVENTION = "sglang"
    SOURCE = ""  # the tool's file and version that define the format (cited in manifests)

    def __init__(self, path: str | os.PathLike, *, verify: bool = False,
                 target: str | None = None, aux_ids: list[int] | None = None,
                 aux_convention: str | None = None):
        # ShardSet.__init__ is not called: there is no shard manifest to read.
        self.path = Path(path)
        if not self.path.is_dir():
            raise UserError(f"{self.TOOL} data directory {str(self.path)!r} does not exist.")
        self._handles: dict[int, Any] = {}
        self.files = self._list()
        if not self.files:
            raise UserError(f"{self.path} holds no {self.TOOL} samples ({self.FORMAT}).")
        self.manifest = self._manifest(target, aux_ids, aux_convention)
        self.shards = []  # no shard files: per-sample files (see self.files)
        self.num_samples = len(self.files)
        if verify:
            self.verify()

    # --- the manifest ----------------------------------------------------------------
    def _manifest(self, target, aux_ids, aux_convention) -> dict[str, Any]:
        side = self.path / SIDECAR
        if side.is_file():
            m = read_json_object(side, what=f"eagle3lab manifest of a {self.TOOL} set",
                                 fix=f"Delete {side}; it is re-made on the next open.")
            if m.get("format") != SIDECAR_FORMAT or m.get("tool") != self.TOOL:
                raise UserError(f"{side} is not an eagle3lab manifest of a {self.TOOL} set "
                                f"(format {m.get('format')!r}, tool {m.get('tool')!r}); "
                                f"delete it.")
            self._check_same(m, target, aux_ids, aux_convention, side)
            if m["samples"] == len(self.files):
                return m
            # samples were added or removed since: synthesise again, keeping the target
            target = target or m["target"]["path"]
            if aux_ids is None and m["aux_layers"].get("requested_ids") is not None \
                    and "given" in m["aux_layers"].get("source", ""):
                aux_ids = m["aux_layers"]["requested_ids"]
                aux_convention = m["aux_layers"]["convention"]
        if target is None:
            raise UserError(f"{self.path} is a {self.TOOL} hidden-state set; its files do not "
                            f"record the target they were captured from. Pass it once "
                            f"(--target DIR, or target=...): eagle3lab then records it in "
                            f"{side}.")
        return self._synthesise(target, aux_ids, aux_convention)

    def _check_same(self, m, target, aux_ids, aux_convention, side) -> None:
        problems = []
        if target is not None:
            got = target_record(target)["config_sha256"]
            if got != m["target"]["config_sha256"]:
                problems.append(f"target: recorded {m['target']['path']}, given {target}")
        if aux_ids is not None:
            conv = aux_convention or self.DEFAULT_CONVENTION
            want = resolve_aux_layers(m["aux_layers"]["num_layers"], aux_ids, conv)
            if list(want.capture_points) != m["aux_layers"]["capture_points"]:
                problems.append(f"aux capture points: recorded "
                                f"{m['aux_layers']['capture_points']}, given ids {aux_ids} "
                                f"({conv}) = {list(want.capture_points)}")
        if problems:
            raise UserError(f"{side} records another reading of {self.path}: "
                            + "; ".join(problems) + f". Delete {side} to record the new "
                            "one (and rebuild its vocab map), or drop the option.")

    def _synthesise(self, target, aux_ids, aux_convention) -> dict[str, Any]:
        t = target_record(target)
        conv = aux_convention or self.DEFAULT_CONVENTION
        given = aux_ids is not None
        ids = list(aux_ids) if given else self._default_aux_ids(t["num_layers"])
        aux = resolve_aux_layers(t["num_layers"], ids, conv)
        aux_width, last_width, dtype = self._shapes()
        check_widths(aux_width=aux_width, last_width=last_width, hidden=t["hidden_size"],
                     n_aux=len(aux.capture_points), where=str(self.files[0][1]),
                     tool=self.TOOL)
        aux_rec = aux.to_dict()
        aux_rec["source"] = ("given when the set was opened" if given else
                             f"assumed: {self.TOOL}'s default ids (the files do not record "
                             f"them)")
        m = {"format": SIDECAR_FORMAT, "version": SIDECAR_VERSION, "tool": self.TOOL,
             "tool_format": self.FORMAT, "format_source": self.SOURCE,
             "eagle3lab": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
             "target": t, "target_source": "given when the set was opened (not recorded "
             f"by {self.TOOL})", "aux_layers": aux_rec, "dtype": dtype,
             "final_state": self.FINAL_STATE,
             "final_state_meaning": FINAL_STATES[self.FINAL_STATE],
             "samples": len(self.files),
             "files": {"count": len(self.files),
                       "bytes": [os.stat(f).st_size for _, f in self.files]},
             "tokens": None, "loss_tokens": None, "lengths": None,
             "unknown": ["sha256 of the files (neither tool records one: verify checks "
                         "sizes)", "the conversations the samples came from",
                         "how the text was rendered (chat template, system prompt)"],
             "rendering": self.rendering}
        self._save(m)
        return m

    @property
    def rendering(self) -> dict[str, Any]:
        """Unknown: neither tool records the chat template or system prompt its text was
        rendered with (also for a manifest synthesised before this was noted)."""
        reader = f"eagle3lab.data.foreign.{type(self).__module__.rsplit('.', 1)[-1]}"
        return unknown(f"a {self.TOOL} set (read by {reader}): {self.TOOL} records no chat "
                       f"template or system prompt")

    def _save(self, m: dict[str, Any]) -> None:
        try:
            atomic_write_json(self.path / SIDECAR, m)
        except OSError as e:
            raise UserError(f"Cannot write {self.path / SIDECAR} ({e}): eagle3lab keeps what "
                            f"it learns about a {self.TOOL} set beside it. Make the directory "
                            f"writable.") from None

    def record(self, key: str, value: Any) -> None:
        """Set one manifest field (e.g. the vocab map entry) and save the manifest."""
        self.manifest[key] = value
        self._save(self.manifest)

    # --- facts -----------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return sum(self.lengths())

    def lengths(self) -> list[int]:
        """Tokens per sample; read once (ids only), then kept in the manifest."""
        if self.manifest.get("lengths") is None:
            self._scan()
        return list(self.manifest["lengths"])

    def _scan(self) -> None:
        lengths, loss = [], 0
        for ids, mask in self.ids_and_masks():
            lengths.append(int(ids.numel()))
            loss += int(mask.sum())
        self.manifest.update(lengths=lengths, tokens=sum(lengths), loss_tokens=loss)
        self._save(self.manifest)

    # --- checks ----------------------------------------------------------------------
    def verify(self, *, cache: bool = True) -> dict[str, int]:
        """Every listed file still exists with the size recorded when the set was opened
        (neither tool records checksums, so this is what can be checked)."""
        sizes = self.manifest["files"]["bytes"]
        for (_, f), size in zip(self.files, sizes):
            try:
                got = os.stat(f).st_size
            except FileNotFoundError:
                raise UserError(f"{f} ({self.TOOL} sample) is missing since {self.path} was "
                                f"opened. Restore it, or delete {self.path / SIDECAR}.") from None
            if got != size:
                raise UserError(f"{f} ({self.TOOL} sample) is {got} bytes, {size} when "
                                f"{self.path} was opened: it changed or was truncated. "
                                f"Restore it, or delete {self.path / SIDECAR}.")
        return {"shards": len(self.files), "hashed": 0, "cached": 0}

    # --- samples ---------------------------------------------------------------------
    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        if not 0 <= i < self.num_samples:
            raise IndexError(i)
        aux, last, ids, mask = self._read(i)
        n = int(ids.shape[0])
        where = self.files[i][1]
        if aux.shape[0] != n or last.shape[0] != n or mask.shape[0] != n:
            raise UserError(f"{where} ({self.TOOL}): {n} token ids but {aux.shape[0]} aux "
                            f"states, {last.shape[0]} final states and {mask.shape[0]} "
                            f"loss-mask entries; the sample is damaged. Delete it (and "
                            f"{self.path / SIDECAR}) or re-capture it.")
        h = self.hidden_size
        check_widths(aux_width=int(aux.shape[-1]), last_width=int(last.shape[-1]), hidden=h,
                     n_aux=len(self.aux.capture_points), where=str(where), tool=self.TOOL)
        return {"hidden_states": aux, "input_ids": ids.to(torch.long),
                "verifier_last_hidden_states": last, "loss_mask": mask.to(torch.bool)}

    def ids_and_masks(self) -> Iterator[tuple[Any, Any]]:
        """(input_ids, loss_mask as bool) of every sample, without the hidden states
        where the format allows."""
        for i in range(self.num_samples):
            s = self[i]
            yield s["input_ids"], s["loss_mask"]

    # --- to implement ----------------------------------------------------------------
    def _list(self) -> list[tuple[int, str]]:
        raise NotImplementedError

    def _read(self, i: int):
        raise NotImplementedError

    def _shapes(self) -> tuple[int, int, str]:
        raise NotImplementedError

    def _default_aux_ids(self, num_layers: int) -> list[int]:
        raise NotImplementedError

    def recorded_counts(self):
        """Loss-masked token counts the tool itself recorded (int64 [vocab]), or None."""
        return None
