"""The pipeline's reusable stages over one work directory: target -> responses -> shards ->
vocab map -> trained drafter -> SGLang-format copy.

Prevents recomputing finished work and silently mixing two configurations in one work
dir: each stage is skipped when its output is complete (regeneration and extraction resume
themselves; training returns a finished run and refuses other settings; the conversion is
redone only when the trained drafter changed), and each stage writes a record
(WORK/stages/NAME.json: parameters, when and how long it was computed, its key numbers),
so a re-run reports "reused" with the original timings.

The work directory's layout (where each stage writes and the next reads) is
`eagle3lab.workdir.WorkDir`; the stages take one and never spell a path themselves.
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

from pydantic import Field

from eagle3lab import __version__
from eagle3lab.config import DEFAULT_TARGET, TARGET_PRESETS, StrictConfig, preset_dir, runs_dir
from eagle3lab.data.extract import extract
from eagle3lab.data.regenerate import RegenerateConfig, made_with_engine, regenerate
from eagle3lab.data.shards import MANIFEST, read_manifest
from eagle3lab.data.vocab import build_shard_vocab
from eagle3lab.errors import UserError
from eagle3lab.fsutil import atomic_write_json, sha256_file
from eagle3lab.targets.adapter import resolve_target_path
from eagle3lab.targets.auxlayers import AUX_IDS_SYNTAX, AuxIds
from eagle3lab.train import is_finished, read_run, train
from eagle3lab.train.config import check_train_overrides
from eagle3lab.workdir import WorkDir

#: TrainConfig fields the pipeline sets itself (the work dir decides them).
_TRAIN_SET_BY_PIPELINE = ("data", "eval_data", "out", "resume", "progress", "stop_after_steps")


class PipelineConfig(StrictConfig):
    WHERE: ClassVar[str] = "pipeline"

    work_dir: str = Field("default", description="stage work dir; a bare name is taken "
                          "under data/runs/")
    target: str = Field(DEFAULT_TARGET, description="preset name, HF model directory or "
                        "hub id")
    device: str = Field("auto", description="device of the target (regenerate, extract) and "
                        "of training")
    model_dtype: str = Field("float32", description="target weights dtype for "
                             "regenerate/extract (bfloat16 on GPU)")
    train_prompts: int = Field(96, ge=1, description="shipped train prompts the target "
                               "answers")
    eval_prompts: int = Field(24, ge=1, description="held-out prompts the target answers "
                              "(eval shards)")
    max_new_tokens: int = Field(160, ge=1, description="answer length cap of regeneration")
    batch_size: int = Field(16, ge=1, description="generation batch size")
    regen_engine: Literal["auto", "static", "hf"] = Field(
        "auto", description="regeneration's engine (regenerate's --engine): static, "
        "eagle3lab's batched decoder (1.30x transformers' generate on a 2-core CPU, "
        "identical greedy records in fp32: bench/regen_static.py), hf, or auto: static where "
        "it runs the target, else hf; responses already in the work dir are resumed with "
        "the engine that made them")
    draft_vocab_size: int = Field(8192, ge=1, description="draft vocabulary of the map and "
                                  "the drafter")
    aux_ids: AuxIds | None = Field(None, description="aux layer ids the shards capture "
                                   f"(extract's --aux-ids, SGLang's convention), "
                                   f"{AUX_IDS_SYNTAX} or a list; None: the target's default")
    train: dict = Field(default_factory=dict, description="TrainConfig fields for the drafter")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, where: str = "pipeline") -> "PipelineConfig":
        return super().from_dict({} if d is None else d, where)

    def check(self, where: str) -> None:
        check_train_overrides(self.train, where, reserved=set(_TRAIN_SET_BY_PIPELINE),
                              set_by="the pipeline from work_dir")

    def work_path(self) -> Path:
        p = Path(self.work_dir).expanduser()
        return p if (p.is_absolute() or len(p.parts) > 1) else runs_dir() / p


def run_demo(
    *, run_dir: str | Path | None = None, target: str = DEFAULT_TARGET,
    train_prompts: int = 96, eval_prompts: int = 24, max_new_tokens: int = 160,
    batch_size: int = 16, draft_vocab_size: int = 8192, device: str = "auto",
    dtype: str = "float32", progress: bool = True, aux_ids: list[int] | str | None = None,
    regen_engine: str = "auto",
) -> dict[str, Any]:
    """Prepare the target, regenerate train/eval responses, extract shards, build the map.
    aux_ids: extract's (None: the target's default); the vocab map reads them from the
    shards' manifest. regen_engine: regenerate's engine for new responses files ("auto":
    `choose_engine`); one that exists is resumed with the engine its meta records
    (`made_with_engine`)."""
    # lazy: a test patches eagle3lab.targets.adapter.load_target
    from eagle3lab.targets.adapter import load_target
    # lazy: a test patches eagle3lab.targets.default.prepare_target
    from eagle3lab.targets.default import prepare_target

    wd = WorkDir(run_dir) if run_dir else WorkDir.default()
    t0 = time.time()
    stages: dict[str, Any] = {}
    print(f"[1/4] target: {target}")
    if target in TARGET_PRESETS:
        prepare_target(name=target)
    tgt = load_target(target, device=device, dtype=dtype)
    for split, n in (("train", train_prompts), ("eval", eval_prompts)):
        engine = made_with_engine(wd.responses(split)) or choose_engine(
            tgt, regen_engine, max_new_tokens=max_new_tokens)
        print(f"[2/4] regenerate {split}: {n} prompts, up to {max_new_tokens} new tokens each "
              f"(engine {engine})")
        stages[f"regenerate_{split}"] = regenerate(
            target=tgt, prompts=split, out=wd.responses(split), limit=n,
            max_new_tokens=max_new_tokens, batch_size=batch_size, progress=progress,
            engine=engine, engine_class=_engine_class(engine))
        stages[f"regenerate_{split}"]["engine"] = engine
    for split in ("train", "eval"):
        print(f"[3/4] extract {split}")
        stages[f"extract_{split}"] = extract(
            conversations=wd.responses(split), out=wd.shards(split),
            target=tgt, model_dtype=dtype, progress=progress, aux_ids=aux_ids)
    print(f"[4/4] draft vocab map ({draft_vocab_size} tokens) from the train shards")
    stages["vocab"] = build_shard_vocab(data=wd.shards_train,
                                        draft_vocab_size=draft_vocab_size)
    stages["seconds"] = time.time() - t0
    stages["paths"] = {k: str(v) for k, v in wd.as_dict().items()}
    return stages


def choose_engine(target: Any, requested: str, *, max_new_tokens: int) -> str:
    """"auto": the static engine where it runs this target at these lengths (longest prompt
    regenerate takes + the answer cap), else transformers' generate; another choice as is."""
    if requested != "auto":
        return requested
    # lazy: the engine's model checks are torch-heavy and needed for "auto" only
    from eagle3lab.specdec.batched import refusal

    max_len = RegenerateConfig.model_fields["max_prompt_tokens"].default + max_new_tokens
    return "hf" if refusal(target, max_len) else "static"


def _engine_class(engine: str) -> Any:
    """regenerate's engine_class for `engine` (the data layer cannot import specdec)."""
    if engine != "static":
        return None
    from eagle3lab.specdec.batched import BatchedEngine  # lazy: torch-heavy, static only

    return BatchedEngine


# ---------------------------------------------------------------------------------------
# Stages: each returns {"reused": bool, "numbers": {...}}; run_stage keeps the record.
# ---------------------------------------------------------------------------------------
def stage_target(cfg: PipelineConfig, wd: WorkDir, progress: bool) -> dict[str, Any]:
    """Convert and verify the preset once (idempotent); a directory or hub id is checked."""
    # lazy: a test patches eagle3lab.targets.default.prepare_target
    from eagle3lab.targets.default import prepare_target

    if cfg.target in TARGET_PRESETS:
        reused = (preset_dir(cfg.target) / "eagle3lab_target.json").exists()
        path = prepare_target(name=cfg.target, verbose=progress)
    else:
        reused, path = True, resolve_target_path(cfg.target)
    return {"reused": reused, "numbers": {"target": cfg.target, "path": str(path)}}


def stage_data(cfg: PipelineConfig, wd: WorkDir, progress: bool) -> dict[str, Any]:
    """Regenerate train/eval responses, extract both shard sets, build the vocab map."""
    def vocab_entry():
        m = wd.shards_train / MANIFEST
        return read_manifest(wd.shards_train).get("vocab_map") if m.exists() else None

    before = vocab_entry()
    try:
        s = run_demo(run_dir=wd.root, target=cfg.target,
                     train_prompts=cfg.train_prompts, eval_prompts=cfg.eval_prompts,
                     max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size,
                     draft_vocab_size=cfg.draft_vocab_size, device=cfg.device,
                     dtype=cfg.model_dtype, progress=progress, aux_ids=cfg.aux_ids,
                     regen_engine=cfg.regen_engine)
    except UserError as e:
        raise UserError(f"{e} (In a report these settings come from the parameters file's "
                        f"pipeline section; for other settings use another "
                        f"pipeline.work_dir than {wd.root}.)") from None
    for split in ("train", "eval"):
        if not s[f"extract_{split}"]["complete"]:
            raise UserError(f"extract {split}: the shards in {wd.shards(split)} are "
                            f"incomplete after the run; re-run to resume.")
    new = sum(s[f"regenerate_{x}"]["new_records"] for x in ("train", "eval")) + sum(
        s[f"extract_{x}"]["new_shards"] for x in ("train", "eval"))
    reused = new == 0 and before == s["vocab"]
    rt, et = s["regenerate_train"], s["extract_train"]
    return {"reused": reused, "numbers": {
        "train_conversations": et["samples"], "train_tokens": et["tokens"],
        "eval_conversations": s["extract_eval"]["samples"],
        "eval_tokens": s["extract_eval"]["tokens"],
        "regenerate_tokens_per_s": rt["tokens_per_s"] if rt["new_tokens"] else None,
        "regenerate_engine": rt["engine"],
        "extract_tokens_per_s": et["tokens_per_s"],
        "bytes_per_token": et["bytes_per_token"],
        "draft_vocab_size": s["vocab"]["draft_vocab_size"],
        "vocab_coverage": s["vocab"]["coverage"]}}


def stage_train(cfg: PipelineConfig, wd: WorkDir, progress: bool) -> dict[str, Any]:
    """Train the drafter on the train shards (held-out eval shards); a finished run with the
    same settings is returned as is, an interrupted one resumed."""
    reused = is_finished(wd.train_run)
    kwargs = {"device": cfg.device, **cfg.train, "data": str(wd.shards_train),
              "eval_data": str(wd.shards_eval), "out": str(wd.train_run),
              "resume": True, "progress": progress}
    try:
        summary = train(**kwargs)
    except UserError as e:
        raise UserError(f"{e} (The pipeline's train settings come from the parameters "
                        f"file's pipeline.train; to train with other settings use another "
                        f"pipeline.work_dir, or delete {wd.train_run}.)") from None
    if summary.get("status") != "done":
        raise UserError(f"training in {wd.train_run} stopped at step {summary.get('step')}; "
                        f"re-run to resume it.")
    run = read_run(wd.train_run)
    return {"reused": reused, "numbers": {
        "steps": summary["steps"], "tokens": summary["tokens"],
        "wall_s": summary["wall_s"], "tokens_per_s": summary["tokens_per_s"],
        "final": summary["final"], "device": run["drafter"]["device"]}}


def _fingerprint(directory: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(directory.iterdir())
            if p.is_file() and p.suffix in (".json", ".safetensors")}


def stage_convert(cfg: PipelineConfig, wd: WorkDir, progress: bool) -> dict[str, Any]:
    """Convert the trained drafter to SGLang's format (redone only when it changed)."""
    # lazy: a test patches eagle3lab.formats.convert.convert_checkpoint
    from eagle3lab.formats.convert import convert_checkpoint

    src, dst = wd.final, wd.sglang_copy
    record = read_stage_record(wd, "convert")
    fp = _fingerprint(src)
    if (record and record.get("numbers", {}).get("source_fingerprint") == fp
            and (dst / "config.json").exists()):
        return {"reused": True, "numbers": record["numbers"]}
    res = convert_checkpoint(src, dst, to="sglang", target=cfg.target, force=True)
    return {"reused": False, "numbers": {
        "path": str(dst), "tensors": len(res.renamed), "dropped": len(res.dropped),
        "aux_ids": res.aux.get("ids"), "warnings": len(res.report.findings),
        "source_fingerprint": fp}}


#: Stage name -> function(cfg, work dir, progress) -> {"reused", "numbers"}.
STAGES: dict[str, Callable[[PipelineConfig, WorkDir, bool], dict[str, Any]]] = {
    "target": stage_target, "data": stage_data, "train": stage_train, "convert": stage_convert,
}


def read_stage_record(wd: WorkDir, name: str) -> dict[str, Any] | None:
    import json

    p = wd.stage_record(name)
    return json.loads(p.read_text()) if p.exists() else None


def run_stage(name: str, cfg: PipelineConfig, *, progress: bool = True) -> dict[str, Any]:
    """Run (or reuse) one stage and update its record; returns the record."""
    wd = WorkDir(cfg.work_path())
    wd.stages.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    res = STAGES[name](cfg, wd, progress)
    now = datetime.datetime.now().isoformat(timespec="seconds")
    old = read_stage_record(wd, name) or {}
    record = {"stage": name, "eagle3lab": __version__, "work_dir": str(wd.root),
              "params": cfg.model_dump(), "reused": res["reused"],
              "checked_at": now, "check_s": round(time.time() - t0, 2),
              "numbers": res["numbers"]}
    if res["reused"]:  # keep when and how long it was computed (unknown: made by hand)
        record.update(computed_at=old.get("computed_at"), computed_s=old.get("computed_s"),
                      numbers={**old.get("numbers", {}), **{
                          k: v for k, v in res["numbers"].items() if v is not None}})
    else:
        record.update(computed_at=now, computed_s=record["check_s"])
    atomic_write_json(wd.stage_record(name), record)
    return record
