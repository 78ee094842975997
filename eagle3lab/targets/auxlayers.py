"""Aux layer ids as one value: which target hidden states a drafter reads, in both conventions.

Prevents the classic silent failure of EAGLE-3: the same explicit id list means different
target layers in SGLang (id k captures the input of layer k+1, i.e. the output of layer k)
and in vLLM/speculators (id k captures the input of layer k), and SGLang reads ids only from
`eagle_config.eagle_aux_hidden_state_layer_ids`, so ids written at the top level are ignored
and the engine quietly captures its defaults. Everything is expressed as *capture points*:
capture p = the input of target decoder layer p = HF `hidden_states[p]`. `AuxLayers`
carries the points together with the convention and ids they were asked for; its
`to_dict()` is the `aux_layers` record of every shard manifest and drafter checkpoint.

The lowest layer (no torch, no model loading): the target adapter hooks these points, the
shards record them, the trainer writes them into the drafter config, and the checkpoint
doctor (eagle3lab.formats) compares an engine's reading of a config with them.

Explicit ids are typed and read ONE way wherever they enter (`extract --aux-ids`, `vocab
--aux-ids`, `preflight --trained-aux-layers`, a config's `aux_ids` field, a keyword
argument): `parse_aux_ids` (the syntax `AUX_IDS_SYNTAX`, or a list of ints), as the
config field type `AuxIds`; a bad list is one sentence naming the option or field, never
a different answer per entry point.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Annotated, Any

from pydantic import BeforeValidator

from eagle3lab.errors import UserError

CONVENTIONS = ("sglang", "vllm")
#: What a capture point is, as every record states it.
CAPTURE_SEMANTICS = "input of decoder layer i (HF hidden_states[i])"
#: Where a draft config can hold explicit ids, and the convention an id found there is
#: written in (SGLang reads eagle_config's; vLLM and speculators read the top-level list).
PLACES = {"eagle_config": "sglang", "top-level": "vllm"}


#: The one command-line syntax of explicit aux layer ids (every option that takes them).
AUX_IDS_SYNTAX = "comma-separated integers, e.g. 1,14,26"


def parse_aux_ids(value: Any) -> list[int]:
    """Explicit aux layer ids, as every entry point reads them: a string in the CLI syntax
    (`AUX_IDS_SYNTAX`; spaces separate too, so "1 14 26" is read alike) or a sequence of
    integers. Raises ValueError (one sentence) unless they are at least one distinct
    non-negative integer. Whether they fit a target is `resolve_aux_layers`'s check."""
    if isinstance(value, str):
        tokens = value.replace(",", " ").split()
        try:
            ids = [int(t) for t in tokens]
        except ValueError:
            raise ValueError(f"aux layer ids are {AUX_IDS_SYNTAX}; got {value!r}") from None
    elif isinstance(value, (list, tuple)):
        try:
            if any(isinstance(x, bool) for x in value):
                raise TypeError
            ids = [operator.index(x) for x in value]
        except TypeError:
            raise ValueError(f"aux layer ids must be integers ({AUX_IDS_SYNTAX}); got "
                             f"{list(value)!r}") from None
    else:
        raise ValueError(f"aux layer ids are {AUX_IDS_SYNTAX}, or a list of integers; got "
                         f"{type(value).__name__} {value!r}")
    if not ids:
        raise ValueError(f"no aux layer ids given ({AUX_IDS_SYNTAX}); leave them unset for "
                         f"the target's default")
    if neg := [i for i in ids if i < 0]:
        raise ValueError(f"aux layer ids must be >= 0; got {ids} (negative: {neg})")
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"aux layer ids must be distinct; got {ids} ({dup} repeated)")
    return ids


def check_aux_ids(value: Any, name: str) -> list[int] | None:
    """`parse_aux_ids` for a keyword argument or an option called `name`: None stays None
    (the target's default); a bad value is one UserError naming `name`."""
    if value is None:
        return None
    try:
        return parse_aux_ids(value)
    except ValueError as e:
        raise UserError(f"{name}: {e}.") from None


#: The config field type of explicit aux layer ids (`AuxIds | None`: None = the default):
#: accepts what `parse_aux_ids` accepts, the CLI string included, and holds a list of ints.
AuxIds = Annotated[list[int], BeforeValidator(parse_aux_ids)]


def default_capture_points(num_layers: int) -> list[int]:
    """SGLang's, vLLM's and speculators' shared default: inputs of layers 2, N//2, N-3."""
    return [2, num_layers // 2, num_layers - 3]


def ids_to_capture(ids, convention: str) -> list[int]:
    """Explicit ids -> capture points (sglang: id + 1; vllm: the id itself)."""
    return [int(i) + 1 for i in ids] if convention == "sglang" else [int(i) for i in ids]


def capture_to_ids(points, convention: str) -> list[int]:
    """Capture points -> the explicit ids that select them in `convention`."""
    return [int(p) - 1 for p in points] if convention == "sglang" else [int(p) for p in points]


@dataclasses.dataclass(frozen=True)
class AuxLayers:
    """A resolved aux-layer selection.

    capture_points[j] = i means: the hidden state captured is the INPUT of decoder layer i
    (= HF `hidden_states[i]` = the output of layer i-1), which is how SGLang captures.
    `sglang_ids` / `vllm_ids` are the explicit ids each engine needs in the draft config
    to capture these same points.
    """

    capture_points: tuple[int, ...]
    convention: str  # "sglang" or "vllm": how `requested_ids` were meant
    requested_ids: tuple[int, ...] | None  # None: the engines' shared default
    num_layers: int

    @classmethod
    def from_capture_points(cls, points, num_layers: int,
                            convention: str = "vllm") -> "AuxLayers":
        """Explicitly chosen capture points, recorded as the ids of `convention`."""
        points = tuple(int(p) for p in points)
        return cls(points, convention, tuple(capture_to_ids(points, convention)),
                   int(num_layers))

    def ids(self, convention: str) -> list[int]:
        """The explicit ids that capture these points in `convention`."""
        return capture_to_ids(self.capture_points, convention)

    @property
    def layer_outputs(self) -> list[int]:
        return [c - 1 for c in self.capture_points]

    @property
    def sglang_ids(self) -> list[int]:
        return self.ids("sglang")

    @property
    def vllm_ids(self) -> list[int]:
        return self.ids("vllm")

    def to_dict(self) -> dict[str, Any]:
        """The `aux_layers` record (manifests, run records, checkpoints): keys and order
        are a file format that shard sets and shipped drafters already hold."""
        return {
            "capture_points": list(self.capture_points),
            "capture_semantics": CAPTURE_SEMANTICS,
            "layer_outputs": self.layer_outputs,
            "convention": self.convention,
            "requested_ids": list(self.requested_ids) if self.requested_ids is not None else None,
            "is_default": self.requested_ids is None,
            "sglang_ids": self.sglang_ids,
            "vllm_ids": self.vllm_ids,
            "num_layers": self.num_layers,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "AuxLayers":
        req = d.get("requested_ids")
        return cls(
            capture_points=tuple(d["capture_points"]),
            convention=d["convention"],
            requested_ids=tuple(req) if req is not None else None,
            num_layers=int(d["num_layers"]),
        )


def resolve_aux_layers(
    num_layers: int, ids: list[int] | tuple[int, ...] | None = None,
    convention: str = "sglang",
) -> AuxLayers:
    """Resolve explicit aux ids (or the default) to capture points.

    convention="sglang": an explicit id k captures the input of layer k+1 (SGLang adds 1).
    convention="vllm":   an explicit id k captures the input of layer k.
    """
    if convention not in CONVENTIONS:
        raise UserError(
            f"Unknown aux layer id convention {convention!r}; use 'sglang' (explicit id k = "
            f"output of layer k) or 'vllm' (explicit id k = input of layer k)."
        )
    if ids is None or len(ids) == 0:
        points = default_capture_points(num_layers)
        requested = None
    else:
        requested = tuple(int(i) for i in ids)
        points = ids_to_capture(requested, convention)
    if len(set(points)) != len(points):
        raise UserError(f"Aux layer ids {list(ids or [])} ({convention}) repeat a layer.")
    bad = [p for p in points if not 1 <= p <= num_layers - 1]
    if bad:
        raise UserError(
            f"Aux layer ids {list(ids or points)} ({convention} convention) resolve to capture "
            f"points {points}, but a {num_layers}-layer target only has capture points "
            f"1..{num_layers - 1} (inputs of layers 1..{num_layers - 1}). Out of range: {bad}."
        )
    return AuxLayers(tuple(points), convention, requested, num_layers)
