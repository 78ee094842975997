"""Write an eagle3lab shard set in the layouts of the at-scale tools: SpecForge's offline
hidden-state files and speculators' prepared dataset + hs_{i}.safetensors, so the same
states can be read back through eagle3lab.data.foreign (notebooks 01 and 06 with
`source="specforge"|"speculators"` and no data of that tool at hand; the readers' tests) or
handed to those tools' trainers.

Prevents a demo or test of the foreign readers that runs on files shaped by hand: speculators'
part is written by its own functions (build_speculator_training_dataset,
save_token_frequency_distribution, datasets' save_to_disk; the hs files with safetensors'
save_file as vLLM's connector does); SpecForge's byte for byte as its
scripts/prepare_hidden_states.py (0.2.0) does (`torch.save` of the dict, gzip.open(...,
"wb", compresslevel=6) with --compress), since specforge does not import without its GPU
stack. SpecForge's final state is normed by the target's own final norm, as SGLang hands
it to the logits processor.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from eagle3lab.data.foreign import detect_data_format
from eagle3lab.data.shards import ShardSet
from eagle3lab.errors import UserError
from eagle3lab.targets.adapter import resolve_target_path


def final_norm(target_dir):
    """The target's own final norm module (fp32), to make SGLang's normed final state."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32)
    return model.model.norm.eval()


def to_specforge(shards_dir, out, target_dir, *, compress: bool = False,
                 group: int = 2000, vocab_map: bool = True) -> Path:
    """SpecForge's offline layout of the samples in `shards_dir` (states stored in fp32; the
    final state normed by the target's final norm, as SGLang hands it to the logits
    processor)."""
    import torch

    s = ShardSet(shards_dir)
    norm = final_norm(target_dir)
    out = Path(out)
    for i in range(len(s)):
        x = s[i]
        with torch.no_grad():
            normed = norm(x["verifier_last_hidden_states"].float())
        record = {"input_ids": x["input_ids"].long(), "loss_mask": x["loss_mask"].long(),
                  "aux_hidden_state": x["hidden_states"].float().unsqueeze(0),
                  "hidden_state": normed.unsqueeze(0)}
        g = (i // group) * group
        d = out / f"rows_{g}-{g + group}"
        d.mkdir(parents=True, exist_ok=True)
        if compress:
            with gzip.open(d / f"data_{i}.ckpt.gz", "wb", compresslevel=6) as f:
                torch.save(record, f)
        else:
            torch.save(record, d / f"data_{i}.ckpt")
    if vocab_map and s.manifest.get("vocab_map"):
        d2t, t2d = s.vocab_map()
        (out / "vocab_mapping").mkdir(exist_ok=True)
        torch.save({"d2t": d2t, "t2d": t2d}, out / "vocab_mapping" / "vocab_mapping.pt")
    return out


def to_speculators(shards_dir, out, target_dir) -> Path:
    """speculators' offline layout: the prepared dataset and token_freq.pt written by its
    own functions, hidden_states/hs_{i}.safetensors = token_ids + [S, 3 aux + final, H]."""
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file
    from speculators.data_generation.preprocessing import build_speculator_training_dataset
    from speculators.train.vocab_mapping import save_token_frequency_distribution
    from transformers import AutoTokenizer

    s = ShardSet(shards_dir)
    out = Path(out)
    rows = [s[i] for i in range(len(s))]
    raw = Dataset.from_dict({"input_ids": [r["input_ids"].tolist() for r in rows],
                             "loss_mask": [r["loss_mask"].long().tolist() for r in rows]})
    environ = os.environ
    try:
        ds = build_speculator_training_dataset(
            raw, AutoTokenizer.from_pretrained(str(target_dir)), max_length=4096, num_proc=1)
    finally:
        # datasets' map with num_proc >= 1 swaps os.environ for a copy (arrow_dataset.py,
        # datasets 5.1.0): put the process's own back, or later changes to it are lost
        os.environ = environ
    assert len(ds) == len(rows)  # every row has loss tokens: none filtered
    ds.save_to_disk(str(out))
    save_token_frequency_distribution(ds, out / "token_freq.pt")
    hs = out / "hidden_states"
    hs.mkdir()
    h = s.hidden_size
    for i, r in enumerate(rows):
        aux = r["hidden_states"].reshape(-1, r["hidden_states"].shape[-1] // h, h)
        stacked = torch.cat([aux, r["verifier_last_hidden_states"].unsqueeze(1)], dim=1)
        save_file({"token_ids": r["input_ids"].long(), "hidden_states": stacked.contiguous()},
                  str(hs / f"hs_{i}.safetensors"))
    return out


WRITERS = {"specforge": to_specforge, "speculators": to_speculators}


def write_as(tool: str, *, shards: str | os.PathLike, out: str | os.PathLike,
             target: str | os.PathLike) -> Path:
    """`shards` (an eagle3lab shard set made from `target`) written in `tool`'s layout under
    `out` (reused when it already holds that tool's set)."""
    if tool not in WRITERS:
        raise UserError(f"Cannot write a {tool!r} set; use one of {', '.join(WRITERS)}.")
    out = Path(out)
    if out.is_dir() and any(out.iterdir()):
        try:
            if detect_data_format(out) == tool:
                return out
        except UserError:
            pass
        raise UserError(f"{out} exists and is not a {tool} set; choose another directory.")
    return WRITERS[tool](shards, out, resolve_target_path(str(target)))
