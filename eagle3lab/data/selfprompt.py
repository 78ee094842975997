"""Synthesise user prompts with the target itself (Magpie-style self-prompting).

Prevents a drafter that is starved of data: a few hundred hand-written prompts give a few
hundred greedy answers, and sampling many answers per prompt teaches sampled text while the
drafter is judged on greedy text. Fed its chat template up to the start of a user turn, an
instruction-tuned target writes the user's message itself, from its own distribution of
requests; tens of thousands of distinct prompts cost little GPU time and no download.

Every prompt that is kept finished its turn (the first special token it wrote is the
template's end-of-turn token: a sample that ran out of tokens or opened another turn is
dropped), is long enough, is new (normalised duplicates dropped), and neither equals nor
shares an 8-word run with a held-out eval prompt (`exclude`), so acceptance measured on
those stays held out. Raw counts of every reason a sample was dropped are recorded in
`<out>.meta.json` (`classify` is the filter).

The user-turn prefix is rendered by the stage's `rendering.Renderer` (`--chat-template`,
`--system-prompt`, `--template-kwargs`) and recorded as the meta's "rendering"
(`add_generation_prompt` false: the chat is rendered up to a user turn).

Resumable: accepted prompts are appended a batch at a time (fsynced; a torn last line
from a crash is cut off); a re-run with the same parameters continues at the next batch
and never repeats an id or a batch seed; different parameters are refused.

Under torchrun each rank samples its own batches of a round and every rank filters the
gathered samples in batch order, so the file is the one a single process writes.

The settings are `SelfPromptConfig`; the run is `eagle3lab.data.stage.Stage`'s order (a
unit is one round: world-size batches, one per rank).

With `server=URL` a running serving engine samples instead (`eagle3lab.data.remote`: the
same chat-template prefix as token ids, the same stop tokens, row r of batch b seeded
(seed + b) * batch_size + r; the server's model is checked against the target first). Its
sampler is not torch's, so a file is either sampled here or through a server (`sampler`
in the parameters), never both.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator

from eagle3lab import __version__
from eagle3lab.config import PathStr, cli_group
from eagle3lab.data.prompts import load_prompts, prompts_fingerprint
from eagle3lab.errors import UserError
from eagle3lab.fsutil import atomic_write_json, check_writable_dir, read_appended_jsonl
from eagle3lab.data.regenerate import (meta_path, read_meta,  # one <out>.meta.json convention
                                       rendering_defaults)
from eagle3lab.data.rendering import Renderer
from eagle3lab.data.stage import GenerationConfig, GenerationStage

_SENTINEL = "\u2063EAGLE3LAB_USER_TURN\u2063"
_IDENTITY_KEYS = ("target_config_sha256", "temperature", "top_p", "seed", "max_new_tokens",
                  "batch_size", "system_prompt", "min_words", "exclude_sha256", "sampler",
                  "chat_template_sha256", "template_kwargs", "seed_prompts_sha256",
                  "seed_examples")
SHINGLE = 8  # words in a run that, shared with an eval prompt, excludes a prompt


def normalise(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def shingles(text: str, n: int = SHINGLE) -> set[str]:
    words = normalise(text).split()
    return {" ".join(words[i:i + n]) for i in range(max(len(words) - n + 1, 0))}


#: Why a sample was dropped (keys of the meta file's "counts", beside "sampled" and "kept").
DROP_REASONS = ("unfinished", "too_short", "duplicate", "eval_overlap")


def classify(text: str, stop_found: bool, seen: set[str], held_norm: set[str],
             held_shingles: set[str], min_words: int) -> str | None:
    """Why a sampled user turn is dropped (one of DROP_REASONS), or None to keep it.

    stop_found: the turn ended with the end-of-turn token (else it ran out of tokens or
    started another turn); seen: normalised prompts already kept; held_norm / held_shingles:
    normalised eval prompts and their SHINGLE-word runs."""
    if not stop_found:
        return "unfinished"
    key = normalise(text)
    if len(key.split()) < min_words:
        return "too_short"
    if key in seen:
        return "duplicate"
    if key in held_norm or shingles(text) & held_shingles:
        return "eval_overlap"
    return None


def user_turn_prefix(tokenizer, system_prompt: str | None = None, *,
                     renderer: Renderer | None = None) -> tuple[list[int], int]:
    """(ids of the chat up to where the user's words start, the end-of-turn token id),
    rendered by `renderer` (its template, system prompt and kwargs; without one: the
    tokenizer's template with `system_prompt`, None sending no system message)."""
    if renderer is None:
        renderer = Renderer(tokenizer, system_prompt=system_prompt, add_generation_prompt=False)
    if not renderer.has_template:
        raise UserError("Self-prompting needs a chat template (an instruction-tuned target); "
                        "this tokenizer has none. Use a prompts file instead, or give one "
                        "with --chat-template FILE.")
    text = renderer.render_text(renderer.messages(_SENTINEL), add_generation_prompt=False)
    at = text.find(_SENTINEL)
    if at < 0:
        raise UserError("The chat template dropped the user's message; cannot self-prompt.")
    prefix = tokenizer(text[:at], add_special_tokens=False).input_ids
    after = tokenizer(text[at + len(_SENTINEL):], add_special_tokens=False).input_ids
    if not after:
        raise UserError("The chat template puts nothing after the user's message, so a "
                        "finished user turn cannot be recognised.")
    return [int(i) for i in prefix], int(after[0])


def seeded_system(system_prompt: str | None, examples: list[str]) -> str:
    """The system message that shows `examples` (seed prompts) before the user turn, after
    the configured system prompt if any. Only the prompts are sampled with it: their
    answers (regenerate) are rendered as configured, without the examples."""
    shown = "\n".join(f"- {' '.join(e.split())}" for e in examples)
    head = f"{system_prompt}\n\n" if system_prompt else ""
    return f"{head}Users of this assistant write messages like these:\n{shown}"


def seeding_params(seed_prompts: Any, seed_examples: int) -> dict[str, Any]:
    """The parameters recorded (and resume-checked) for seeded self-prompting; None for
    both without seed prompts (so files from before seeding resume)."""
    if not seed_prompts:
        return {"seed_prompts_sha256": None, "seed_examples": None}
    return {"seed_prompts_sha256": prompts_fingerprint(seed_prompts)["sha256"],
            "seed_examples": seed_examples}


class SelfPromptConfig(GenerationConfig):
    """`synthesize_prompts`' settings (`eagle3lab self-prompt`'s options)."""

    WHERE: ClassVar[str] = "self-prompt"

    out: PathStr = Field(description="output prompts JSONL (appended to on resume)",
                         json_schema_extra=cli_group("data"))
    n: int = Field(1000, ge=1, description="prompts to keep in --out in all (under torchrun "
                   "write --num-prompts: torchrun takes --n for an abbreviation of its own "
                   "options)", json_schema_extra=cli_group("data", flags=["--n", "--num-prompts"]))
    temperature: float = Field(1.0, description="sampling temperature (> 0)",
                               json_schema_extra=cli_group("generation"))
    top_p: float = Field(0.95, description="nucleus sampling",
                         json_schema_extra=cli_group("generation"))
    max_new_tokens: int = Field(96, ge=4, description="length cap of a prompt (longer samples "
                                "are dropped as unfinished)",
                                json_schema_extra=cli_group("generation"))
    batch_size: int = Field(64, ge=1, description="prompts sampled together",
                            json_schema_extra=cli_group("generation"))
    seed: int = Field(0, description="sampling seed (batch b: seed + b)",
                      json_schema_extra=cli_group("generation"))
    min_words: int = Field(4, description="shorter prompts are dropped",
                           json_schema_extra=cli_group("filter"))
    exclude: PathStr | None = Field("eval", description="held-out prompts no kept prompt may "
                                    "overlap: 'eval', 'train', a prompts JSONL, or 'none'",
                                    json_schema_extra=cli_group("filter"))
    max_batches: int | None = Field(None, ge=0, description="stop after this many batches in "
                                    "all, counting earlier runs (None: enough for --n at a 25% "
                                    "keep rate)", json_schema_extra=cli_group("generation"))
    seed_prompts: PathStr | None = Field(None, description="a prompts JSONL (e.g. `eagle3lab "
                                         "weak-spots --export`) to write more prompts like: a "
                                         "few of them are shown as examples before the user "
                                         "turn (see --seed-examples)",
                                         json_schema_extra=cli_group("data"))
    seed_examples: int = Field(3, ge=1, description="seed prompts shown per batch (drawn "
                               "with the batch's seed)", json_schema_extra=cli_group("data"))

    @field_validator("exclude", mode="before")
    @classmethod
    def _none_word(cls, v: Any) -> Any:
        return None if isinstance(v, str) and v.lower() == "none" else v

    def check(self, where: str) -> None:
        if self.temperature <= 0:
            raise UserError("Self-prompting samples (temperature > 0); greedy would write one "
                            "prompt over and over.")


def synthesize_prompts(config: SelfPromptConfig | dict[str, Any] | None = None, /, *,
                       target: Any = None, progress: bool = True,
                       **options: Any) -> dict[str, Any]:
    """Have the target write `n` distinct user prompts; append them to `out` (JSONL).

    config / options: `SelfPromptConfig` (or its fields as keyword arguments, which
    override a config's). target: a preset name, an HF directory / hub id, or an already
    loaded `Target`. Batch b is sampled with seed + b. Stops once `out` holds n prompts, or
    once `max_batches` batches were sampled in all (counting those of earlier runs;
    default: enough for n at a 25% keep rate), whichever comes first. exclude: held-out
    prompts ('eval', a prompts file, or None) that no kept prompt may repeat or share an
    8-word run with. Returns a summary with the raw counts and the keep rate.
    device_map: accelerate's device map for a target larger than one GPU.
    Under torchrun rank r samples batches b + r of each round of world-size batches; the
    samples are gathered and every rank filters them in batch order (the filter is
    sequential: duplicates, the n-th prompt), so rank 0 writes what one process writes.
    server / api / concurrency / server_model / retries: a running server samples instead
    (as `regenerate`'s; one process).
    """
    return SelfPromptStage.call(config, target=target, progress=progress, options=options)


class SelfPromptStage(GenerationStage[SelfPromptConfig]):
    """plan: exclusions, the target (or the server), the user-turn prefix, the parameters;
    resume: the parameter check and what `out` holds; a unit: one round of batches, each
    rank sampling one, all filtering them in batch order (rank 0 appends the kept ones);
    merge: nothing to merge (rank 0 wrote the file), the summary."""

    CONFIG = SelfPromptConfig

    def plan(self) -> None:
        cfg = self.config
        self.out = out = Path(cfg.out)
        check_writable_dir(out.parent)
        self.old_meta = old_meta = read_meta(out, "eagle3lab-prompts")
        if old_meta is not None and not isinstance(old_meta.get("counts"), dict):
            raise UserError(f"The meta file {meta_path(out)} has no 'counts' object; delete "
                            f"both {out} and {meta_path(out)} to start over, or choose a new "
                            f"--out.")
        self.held_shingles: set[str] = set()
        self.held_norm: set[str] = set()
        self.exclude_fp = None
        if cfg.exclude is not None:
            self.exclude_fp = prompts_fingerprint(cfg.exclude)
            for p in load_prompts(cfg.exclude):
                self.held_shingles |= shingles(p.prompt)
                self.held_norm.add(normalise(p.prompt))
        self.tgt, self.gen, _ = self.load_target()
        eos = (self.tgt.eos_ids if self.gen is not None
               else self.tgt.model.generation_config.eos_token_id)
        tok = self.tok = self.tgt.tokenizer
        # the prefix is rendered here also through a server (token ids go out)
        self.renderer = cfg.renderer(tok, add_generation_prompt=False)
        self.rendering = self.renderer.record()
        self.prefix, end_id = user_turn_prefix(tok, renderer=self.renderer)
        self.stop_ids = ({end_id} | set(eos if isinstance(eos, list) else [eos])) - {None}
        # a turn is finished when the first special token it writes is a stop token
        self.special = self.stop_ids | set(tok.all_special_ids)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else end_id
        self.params = {
            "target_config_sha256": self.tgt.config_sha256,
            "temperature": float(cfg.temperature), "top_p": float(cfg.top_p),
            "seed": cfg.seed, "max_new_tokens": cfg.max_new_tokens,
            "batch_size": cfg.batch_size, "system_prompt": cfg.system_prompt,
            "min_words": cfg.min_words,
            "exclude_sha256": self.exclude_fp["sha256"] if self.exclude_fp else None,
            "sampler": "server" if self.gen is not None else None,
            "chat_template_sha256": self.rendering["chat_template"]["sha256"],
            "template_kwargs": self.rendering["template_kwargs"]}
        self.seeds = load_prompts(cfg.seed_prompts) if cfg.seed_prompts else []
        self.params.update(seeding_params(cfg.seed_prompts, cfg.seed_examples))
        self.mpath = meta_path(out)

    def resume(self) -> dict[str, Any]:
        """Rank 0 (or the one process): parameter check, what is done, the next batch."""
        out, mpath, old_meta, params = self.out, self.mpath, self.old_meta, self.params
        if old_meta:
            old = {**rendering_defaults(self.tok), **old_meta.get("params", {})}  # older files
            diff = [k for k in _IDENTITY_KEYS if old.get(k) != params[k]]
            if diff:
                raise UserError(
                    f"{out} was made with different parameters ("
                    + ", ".join(f"{k}={old.get(k)!r} now {params[k]!r}" for k in diff)
                    + f"); continuing would mix two kinds of prompts. Choose a new --out or "
                    f"delete {out} and {mpath}.")
        done = read_appended_jsonl(
            out, lambda r: isinstance(r.get("prompt"), str) and "id" in r, "prompt record")
        if old_meta:
            meta = old_meta
            meta["params"] = params  # a file made before rendering was recorded: its keys
            meta["rendering"] = self.rendering
        elif done:
            raise UserError(f"{out} exists without {mpath.name}; it was not written by "
                            f"synthesize_prompts. Choose a new --out.")
        else:
            meta = {"kind": "eagle3lab-prompts", "method": "self-prompt (Magpie)",
                    "eagle3lab": __version__, "target": self.tgt.describe(),
                    "params": params, "rendering": self.rendering,
                    "exclude": self.exclude_fp, "batches_done": 0,
                    "counts": {"sampled": 0, "kept": 0, **{r: 0 for r in DROP_REASONS}}}
        counts = meta["counts"]
        # The file is the truth: batches it holds prompts of are done even if the meta file
        # missed them (a crash between the two writes). The meta count also covers batches
        # that kept nothing, so it is used while it agrees with the file on the prompts kept.
        from_file = max((int(r.get("batch", -1)) + 1 for r in done), default=0)
        b = max(from_file, meta.get("batches_done", 0)) if counts.get("kept") == len(done) \
            else from_file
        meta["batches_done"] = b
        counts["kept"] = len(done)
        atomic_write_json(mpath, meta)
        return {"done": done, "meta": meta}

    def start(self, state: dict[str, Any]) -> None:
        cfg = self.config
        self.done, self.meta = state["done"], state["meta"]
        self.counts, self.b = self.meta["counts"], self.meta["batches_done"]
        # a copy of a seed prompt is a duplicate, never a new prompt
        self.seen = {normalise(r["prompt"]) for r in self.done} | {
            normalise(p.prompt) for p in self.seeds}
        self.max_batches = cfg.max_batches or max(4, -(-4 * cfg.n // cfg.batch_size))
        self.make_bar(total=cfg.n, initial=min(len(self.done), cfg.n), desc="self-prompt",
                      unit="prompt")
        self.f = open(self.out, "a", encoding="utf-8") if self.ranks.main else None

    def units(self):
        """Rounds: rank r samples batch b + r; all are filtered in batch order."""
        while len(self.done) < self.config.n and self.b < self.max_batches:
            yield self.b

    def compute(self, b: int) -> list[list[tuple[str, bool]] | None]:
        mine = b + self.ranks.rank
        return self.ranks.gather(self.sample(mine) if mine < self.max_batches else None)

    def write(self, b: int, gathered: list[list[tuple[str, bool]] | None]) -> None:
        cfg, done, counts = self.config, self.done, self.counts
        for rows in gathered:
            if rows is None or len(done) >= cfg.n:
                break
            new = []
            for text, finished in rows:
                if len(done) + len(new) >= cfg.n:
                    break  # the rest of the batch is neither kept nor counted
                counts["sampled"] += 1
                reason = classify(text, finished, self.seen, self.held_norm,
                                  self.held_shingles, cfg.min_words)
                if reason:
                    counts[reason] += 1
                    continue
                self.seen.add(normalise(text))
                new.append({"id": f"self-{len(done) + len(new):06d}", "prompt": text,
                            "category": "self", "batch": self.b, "seed": cfg.seed + self.b})
            done.extend(new)
            self.b += 1
            self.meta["batches_done"] = self.b
            counts["kept"] = len(done)
            if self.f is not None:
                for rec in new:
                    self.f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                self.f.flush()
                os.fsync(self.f.fileno())
                atomic_write_json(self.mpath, self.meta)
            self.bar.update(len(new))

    def close(self) -> None:
        if self.f is not None:
            self.f.close()

    def merge(self) -> dict[str, Any]:
        cfg, ranks, done, counts, b = self.config, self.ranks, self.done, self.counts, self.b
        elapsed = time.time() - self.t0
        if len(done) < cfg.n and ranks.main:
            print(f"warning: only {len(done)} of {cfg.n} prompts kept after {b} batches "
                  f"({counts}); raise max_batches or temperature.")
        self.meta["last_run"] = {"seconds": round(elapsed, 2)}
        if ranks.main:
            atomic_write_json(self.mpath, self.meta)
        return {"out": str(self.out), "prompts": len(done), "batches": b,
                "counts": dict(counts), "seconds": elapsed,
                "keep_rate": (counts["kept"] / counts["sampled"] if counts["sampled"]
                              else None)}

    def generate_rows(self, batch: int) -> list[list[int]]:
        """Batch `batch`'s sampled ids after the prefix, one list per row."""
        import torch

        cfg, prefix = self.config, self.prefix_for(batch)
        if self.gen is not None:
            rows: list[list[int]] = [[] for _ in range(cfg.batch_size)]
            sp = {"max_new_tokens": cfg.max_new_tokens, "temperature": float(cfg.temperature),
                  "top_p": float(cfg.top_p), "stop_token_ids": sorted(self.stop_ids)}
            self.gen.generate_ordered(
                [(f"batch {batch} row {r}", prefix,
                  {**sp, "seed": (cfg.seed + batch) * cfg.batch_size + r})
                 for r in range(cfg.batch_size)],
                lambda i, ids, finish: rows.__setitem__(i, ids))
            return rows
        tgt = self.tgt
        start = torch.tensor([prefix], dtype=torch.long, device=tgt.device).repeat(
            cfg.batch_size, 1)
        torch.manual_seed(cfg.seed + batch)
        with torch.inference_mode():
            out = tgt.model.generate(
                input_ids=start, attention_mask=torch.ones_like(start), do_sample=True,
                temperature=cfg.temperature, top_p=cfg.top_p, top_k=0,
                max_new_tokens=cfg.max_new_tokens, eos_token_id=sorted(self.stop_ids),
                pad_token_id=self.pad_id)
        return out[:, len(prefix):].tolist()

    def prefix_for(self, batch: int) -> list[int]:
        """The chat up to the user's words for batch `batch`: the one prefix, or with seed
        prompts the system message extended by `seed_examples` of them (`seeded_system`),
        drawn with the batch's seed, so that the target writes more prompts like them."""
        if not self.seeds:
            return self.prefix
        import copy
        import random

        k = min(self.config.seed_examples, len(self.seeds))
        shown = random.Random(self.config.seed + batch).sample(self.seeds, k)
        r = copy.copy(self.renderer)
        r.system_prompt = seeded_system(self.renderer.system_prompt, [p.prompt for p in shown])
        return user_turn_prefix(self.tok, renderer=r)[0]

    def sample(self, batch: int) -> list[tuple[str, bool]]:
        """Batch `batch`'s user turns: (text, finished) per row."""
        rows = []
        for row in self.generate_rows(batch):
            stop = next((k for k, t in enumerate(row) if t in self.special), None)
            finished = stop is not None and row[stop] in self.stop_ids
            rows.append((self.tok.decode(row[:stop], skip_special_tokens=True).strip()
                         if finished else "", finished))
        return rows
