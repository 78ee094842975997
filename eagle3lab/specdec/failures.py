"""Checkpoints shaped like the seed failures, built from a healthy one, so that offline
acceptance can show what a server would do with them.

`sglang_config_speculators_keys`: an SGLang config (architectures LlamaForCausalLMEagle3)
over speculators' `layers.0.*` decoder keys — what a half-done export looks like. SGLang's
loader (the midlayer versions) drops every key it does not know without a word, so the
decoder layer is served at its fresh initialisation and acceptance collapses to ~1.0.
"""

from __future__ import annotations

import os
from pathlib import Path

from eagle3lab.formats.reader import Checkpoint
from eagle3lab.fsutil import atomic_dir
from eagle3lab.specdec.load import check_draft


def sglang_config_speculators_keys(healthy: str | os.PathLike, dst: str | os.PathLike, *,
                                   target: str | os.PathLike | None = None) -> Path:
    """Convert `healthy` (either format) to SGLang's format, then rename its `midlayer.*`
    keys back to `layers.0.*`. Returns `dst`. The weights are read through the checkpoint
    reader, so a sharded (`model-0000k-of-0000n` + index) or `pytorch_model.bin` drafter
    works as well as a single `model.safetensors`."""
    import tempfile

    from safetensors.torch import save_file

    # lazy: a test patches eagle3lab.formats.convert.convert_checkpoint
    from eagle3lab.formats.convert import convert_checkpoint

    healthy, dst = Path(healthy), Path(dst)
    check_draft(healthy)
    with tempfile.TemporaryDirectory() as tmp:
        src = healthy
        if _format(healthy) != "eagle3":
            src = Path(tmp) / "sglang"
            convert_checkpoint(healthy, src, to="sglang", target=target)
        check_draft(src)
        ck = Checkpoint(src)
        try:
            tensors = ck.state_dict()
        finally:
            ck.close()
        renamed = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k):
                   v.contiguous() for k, v in tensors.items()}
        with atomic_dir(dst) as out:
            save_file(renamed, str(out / "model.safetensors"), metadata={"format": "pt"})
            (out / "config.json").write_text((src / "config.json").read_text())
    return dst


def _format(path: Path) -> str:
    ck = Checkpoint(path)  # headers only
    try:
        return ck.format
    finally:
        ck.close()
