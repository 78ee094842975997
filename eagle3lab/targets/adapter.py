"""The target model adapter: load a target, know its shape, capture the aux hidden states.

Prevents two failures of feature extraction: capturing other target layers than the ones
recorded (every selection is an `eagle3lab.targets.auxlayers.AuxLayers`, whose capture points
are exactly the layers hooked here, and which every artifact records), and materialising
every layer's states. Capture uses forward hooks on exactly those layers (plus the input of
the final norm, which speculators' trainer needs as `verifier_last_hidden_states`), never
`output_hidden_states=True`, which would materialise every layer's states. A target larger
than one GPU loads with accelerate's device maps (`load_target(device_map=...)`); the
hooks capture each state on its layer's GPU and `features` gathers them on one.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

from eagle3lab.config import DEFAULT_TARGET, TARGET_PRESETS, preset_dir
from eagle3lab.errors import UserError
from eagle3lab.fsutil import sha256_bytes
from eagle3lab.targets.auxlayers import AuxLayers, resolve_aux_layers


def resolve_dtype(dtype: str):
    import torch

    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise UserError(f"Unknown dtype {dtype!r}; use one of float32, bfloat16, float16.")
    return table[dtype]


def resolve_device(device: str = "auto") -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"Device {device!r} was asked for, but torch sees no CUDA device.")
    return device


def resolve_target_path(target: str | os.PathLike) -> str:
    """A preset name -> its prepared dir (prepared on first use); a dir -> itself;
    anything else is passed to transformers as a hub id."""
    t = str(target)
    if t in TARGET_PRESETS:
        # lazy: a test patches eagle3lab.targets.default.prepare_target
        from eagle3lab.targets.default import STAMP_NAME, prepare_target

        if (preset_dir(t) / STAMP_NAME).exists():
            return str(preset_dir(t))
        return str(prepare_target(name=t))  # first use: convert once (prints progress)
    p = Path(t).expanduser()
    if p.exists():
        if not p.is_dir() or not (p / "config.json").is_file():
            raise UserError(
                f"Target {t!r} exists but is not a Hugging Face model directory (no "
                f"config.json inside). Pass a directory made by save_pretrained, a hub id, "
                f"or the preset {DEFAULT_TARGET!r}."
            )
        return str(p.resolve())
    if t.startswith((".", "/", "~")) or t.count("/") != 1:
        raise UserError(
            f"Target {t!r} does not exist. Pass a Hugging Face model directory, a hub id "
            f"(org/name, on machines that can reach a hub), or the preset {DEFAULT_TARGET!r}."
        )
    return t


def config_sha256(config_dict: dict[str, Any]) -> str:
    """Hash of a target config, ignoring fields that do not change the computation."""
    volatile = {"_name_or_path", "name_or_path", "transformers_version", "dtype", "torch_dtype",
                "architectures", "_commit_hash", "use_cache", "output_hidden_states"}
    clean = {k: v for k, v in config_dict.items() if k not in volatile}
    return sha256_bytes(json.dumps(clean, sort_keys=True, default=str).encode())


#: SDPA kernels the target's attention may use when `Target.features` computes states on
#: CUDA: every one but cuDNN's. Its host cost per call (0.64 ms on an H100, torch 2.11: one
#: call per layer per forward, 30 for the default target) left online training host-bound
#: at ~110k tokens/s with the GPU a third busy; without it ~150k (docs/study.md, session
#: 21; bench/target_sdpa.py: the target's forwards x3.5 faster). The states differ from
#: cuDNN's as two bf16 kernels' do (1.7 % relative L1 there). CPU: unchanged.
FEATURE_SDPA = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


class Target:
    """A loaded target model with its tokenizer and shape facts."""

    def __init__(self, model, tokenizer, path: str, name: str):
        self.model = model
        self.tokenizer = tokenizer
        self.path = path
        self.name = name
        cfg = model.config
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        self.num_layers: int = int(text_cfg.num_hidden_layers)
        self.hidden_size: int = int(text_cfg.hidden_size)
        self.vocab_size: int = int(text_cfg.vocab_size)
        self.max_position_embeddings: int | None = getattr(
            text_cfg, "max_position_embeddings", None)
        self.chat_template: str | None = getattr(tokenizer, "chat_template", None)
        self.config_sha256 = config_sha256(cfg.to_dict())
        self._layers, self._final_norm = _find_layers(model)
        #: the SDPA kernels `features` lets the target's attention use on CUDA (None:
        #: torch's own choice); see `FEATURE_SDPA`
        self.sdpa_backends: list[str] | None = list(FEATURE_SDPA)
        self._compiled: dict[str, Any] | None = None  # see `compile`
        #: False: `features` runs eager even where compiled (bench/target_sdpa.py alternates)
        self.use_compiled = True

    @property
    def device(self):
        return next(self.model.parameters()).device

    @property
    def dtype(self):
        return next(self.model.parameters()).dtype

    def aux_layers(self, ids=None, convention: str = "sglang") -> AuxLayers:
        return resolve_aux_layers(self.num_layers, ids, convention)

    def describe(self) -> dict[str, Any]:
        """What every artifact records about the target."""
        return {
            "name": self.name,
            "path": self.path,
            "config_sha256": self.config_sha256,
            "architecture": (self.model.config.architectures or [type(self.model).__name__])[0],
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
        }

    @contextlib.contextmanager
    def capture(self, aux: AuxLayers, *, last: bool = True) -> Iterator[dict[str, Any]]:
        """Hooks that record the inputs of the aux layers (and of the final norm).

        Yields a dict that, after each forward, holds "aux": [tensor per capture point]
        and "last": the final norm's input. Hooks are removed on exit.
        """
        if aux.num_layers != self.num_layers:
            raise UserError(
                f"Aux layers were resolved for a {aux.num_layers}-layer model, but the target "
                f"{self.name} has {self.num_layers} layers.")
        store: dict[str, Any] = {"aux": [None] * len(aux.capture_points), "last": None}
        handles = []

        def make_hook(j: int):
            def hook(module, args, kwargs):
                store["aux"][j] = args[0] if args else kwargs["hidden_states"]
            return hook

        try:
            for j, point in enumerate(aux.capture_points):
                handles.append(self._layers[point].register_forward_pre_hook(
                    make_hook(j), with_kwargs=True))
            if last:
                def last_hook(module, args):
                    store["last"] = args[0]
                handles.append(self._final_norm.register_forward_pre_hook(last_hook))
            yield store
        finally:
            for h in handles:
                h.remove()

    def compile(self, aux: AuxLayers, *, backend: str = "inductor") -> None:
        """From now on `features` with `aux` runs the base model compiled (torch.compile,
        dynamic shapes: one graph for every batch shape): fused kernels instead of a dozen
        small ones a layer, where launching them, not the GPU, set online training's pace
        (docs/study.md, session 21's profile). The capture hooks are registered here, once,
        for `aux` (their stack is kept for the target's life) and stay: `features`
        registering its own on every call would change the hooks dynamo guards on. The
        states differ from the eager forward's by rounding; `attention` records the
        backend. backend: torch.compile's ("eager": dynamo's capture only)."""
        import torch

        if self._compiled is not None:
            raise UserError(f"The target {self.name} is already compiled (for capture points "
                            f"{list(self._compiled['points'])}).")
        known = torch._dynamo.list_backends(exclude_tags=())
        if backend not in known:
            raise UserError(f"torch.compile has no backend {backend!r}; use inductor (or one "
                            f"of {', '.join(known)}).")
        stack = contextlib.ExitStack()
        store = stack.enter_context(self.capture(aux))
        self._compiled = {"points": tuple(aux.capture_points), "store": store, "stack": stack,
                          "backend": backend,
                          "forward": torch.compile(self._base(), dynamic=True, backend=backend)}

    def features(self, input_ids, attention_mask=None, aux: AuxLayers | None = None):
        """One forward of the base model (no LM head): returns (fused [B,T,len(aux)*H],
        last [B,T,H]) where last is the input of the final norm. Compiled for the aux
        layers `compile` was given, else eager."""
        import torch

        aux = aux or self.aux_layers()
        c = self._compiled
        compiled = (c is not None and self.use_compiled
                    and tuple(aux.capture_points) == c["points"])
        forward = c["forward"] if compiled else self._base()
        with torch.inference_mode(), (contextlib.nullcontext(c["store"]) if compiled
                                      else self.capture(aux)) as store, \
                self._sdpa(input_ids.device.type == "cuda"):
            forward(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
            # a device-mapped target leaves each state on its layer's GPU: gather them on
            # the inputs' device (a no-op on one device)
            fused = torch.cat([a.to(input_ids.device) for a in store["aux"]], dim=-1)
            last = store["last"].to(input_ids.device)
        return fused, last

    def attention(self) -> dict[str, Any]:
        """What computes the target's attention in `features` (shard sets and online runs
        record it: the states depend on the kernel by rounding)."""
        return {"implementation": getattr(self.model.config, "_attn_implementation", None),
                "sdpa_backends_on_cuda": (list(self.sdpa_backends)
                                          if self.sdpa_backends is not None else None),
                # only when compiled: what uncompiled runs recorded stays the same
                **({"compiled": self._compiled["backend"]} if self._compiled else {})}

    def _sdpa(self, cuda: bool):
        """The attention kernels `features` allows (`sdpa_backends`), on CUDA only."""
        if not cuda or self.sdpa_backends is None:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([getattr(SDPBackend, b) for b in self.sdpa_backends])

    def _base(self):
        """The base model (no LM head): what `features` runs, eager or compiled."""
        return getattr(self.model, "model", None) or self.model.base_model

    def _base_forward(self, input_ids, attention_mask=None):
        return self._base()(input_ids=input_ids, attention_mask=attention_mask,
                            use_cache=False)


def _find_layers(model):
    base = getattr(model, "model", None) or getattr(model, "base_model", None)
    layers = getattr(base, "layers", None)
    norm = getattr(base, "norm", None)
    if layers is None or norm is None:
        raise UserError(
            f"{type(model).__name__} has no `model.layers`/`model.norm`; eagle3lab's aux-state "
            f"capture supports Llama-style decoder models (Llama, Qwen, Mistral, ...).")
    return layers, norm


#: accelerate's device maps (`from_pretrained(device_map=...)`): the layers of a target
#: larger than one GPU spread over the visible GPUs of one process.
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def load_target(
    target: str | os.PathLike = DEFAULT_TARGET, *, device: str = "auto",
    dtype: str = "float32", attn_implementation: str | None = "sdpa",
    device_map: str | None = None, max_memory: dict | None = None,
) -> Target:
    """Load a target (preset name, HF directory or hub id) with its tokenizer.

    device_map: one of DEVICE_MAPS to spread the layers over the visible GPUs (instead of
    `device`); max_memory: accelerate's per-device limit (e.g. to confine it to a few)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_target_path(target)
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype)}
    if device_map is not None:
        if device_map not in DEVICE_MAPS:
            raise UserError(f"Unknown device map {device_map!r}; use one of "
                            f"{', '.join(DEVICE_MAPS)} (accelerate's).")
        if device != "auto":
            raise UserError(f"--device {device} and --device-map {device_map} both place the "
                            f"target; give one of them.")
        kwargs["device_map"] = device_map
        if max_memory:
            kwargs["max_memory"] = max_memory
    else:
        dev = resolve_device(device)
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except Exception as e:  # OSError, ValueError, SafetensorError, ...: all mean bad input
        raise UserError(
            f"Could not load the target {str(target)!r} from {path!r}: {type(e).__name__}: "
            f"{(str(e) or '?').splitlines()[0]} "
            f"Check that it is a complete Hugging Face model directory (config.json, weights, "
            f"tokenizer files) or a reachable hub id.") from None
    if device_map is None:
        model.to(dev)
    model.eval()
    name = str(target) if str(target) in TARGET_PRESETS else Path(path).name
    return Target(model, tok, path, name)
