"""The grokking-vs-more-data study at GPU scale: arms by unique answer tokens, weight decay,
regeneration kind and recipe, every run trained online on the same number of tokens, and
every arm's drafters measured LIVE by the static engine.

Prevents three misreadings of such a study:
- arms that differ in more than the one thing compared: every run processes the same
  number of tokens (`tokens_per_run`), evaluates on the same held-out conversations at the
  same points, and reads its data as a prefix of ONE shuffled pool, so a smaller arm's data
  is a subset of every larger arm's (`build_pool`, `plan_arms`);
- a verdict read off teacher-forced curves alone: each arm's checkpoints along the way and
  its final drafter are decoded by the static engine on the held-out prompts at several
  draft shapes (`live_tau`), and the raw counts are kept beside the curves, so the study
  says how far the curves predict serving;
- results that cannot be re-read: the study directory holds the plan (`study.json`, with
  the pool's sha256s), each run's `run.json` and `metrics.jsonl`, and `live.json` (raw
  accept histograms per checkpoint and shape); `collect` copies exactly those, small, for
  committing under data/studies/.

The device side (data generation, running arms several at a time on one GPU, limits of a
call) is bench/study_gpu.py; the notebooks read what `collect` wrote.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

from pydantic import Field

from eagle3lab.config import StrictConfig, repo_root
from eagle3lab.data.regenerate import meta_path
from eagle3lab.errors import UserError
from eagle3lab.fsutil import atomic_path, atomic_write_json, read_json_object, sha256_file
from eagle3lab.specdec.stats import AcceptStats, decode_accept_length
from eagle3lab.study.runs import list_checkpoints
from eagle3lab.train.config import check_train_overrides

STUDY_FORMAT = "eagle3lab-study-atscale"

#: The draft shape the verdict, the planners and `collect`'s winner="auto" read when the
#: study measured it (else another: atscale_read.measured_setting, the first live shape).
MAIN_SETTING = "5,1,6"


#: Our recipe: that of the SGLang-servable shipped drafter (the default until the study's winner
#: replaced it; data/drafters/smollm2-135m-instruct-sglang/README.md).
OUR_RECIPE: dict[str, Any] = {
    "ttt_steps": 5, "ttt_step_loss_decay": 1.0, "train_lm_head": True, "lr": 8e-4,
    "schedule": "cosine", "warmup_steps": 50, "grad_clip": 1.0,
    "max_tokens_per_batch": 16384, "serve_engine": "sglang",
}

#: TrainConfig fields each run gets from the study itself.
_SET_BY_STUDY = {"data", "eval_data", "out", "data_fraction", "weight_decay", "seed", "epochs",
                 "max_tokens", "max_steps", "eval_at_tokens", "resume", "online",
                 "conversations", "eval_conversations", "target", "eval_every",
                 "checkpoint_every", "keep_checkpoints", "states_cache"}


class LongArms(StrictConfig):
    """Runs far past the plateau: small data arms trained on many more tokens than the
    equal-compute runs, at a CONSTANT learning rate after warmup. An equal-compute run's
    cosine schedule ends at a learning rate near zero, so its last stretch flattens whatever
    the data; a late drop in eval loss (grokking) can only be told from that on a run whose
    rate does not decay."""

    WHERE: ClassVar[str] = "at-scale study config, long"

    data_tokens: list[int] = Field(min_length=1, description="unique answer tokens of each "
                                   "long arm (prefixes of the same pool as the data arms)")
    tokens_per_run: int = Field(gt=0, description="tokens each long run processes")
    schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="learning-rate schedule after warmup")
    weight_decays: list[float] = Field(default_factory=lambda: [0.01, 0.1], min_length=1)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    recipe: str = Field("eagle3lab", description="the recipe the long runs train with: "
                        "eagle3lab (ours) or a name in `recipes`; other than ours, it is named "
                        "in the runs' names (long-RECIPE-...)")


class WeakArms(StrictConfig):
    """The weak-spots experiment (issue 29) as arms of the study: a base prefix of the pool
    plus `n` conversations picked from the `candidates` right after it, either the ones a
    drafter (`ranker`) accepts least on (`rank_weak`) or `n` drawn at random; both at the
    study's equal compute, `seeds` each."""

    WHERE: ClassVar[str] = "at-scale study config, weak"

    ranker: str = Field(description="the drafter whose per-prompt tau ranks the candidates "
                        "(a directory; relative: from here, else from the checkout)")
    base_tokens: int = Field(1_600_000, gt=0, description="unique answer tokens of the base "
                             "prefix (the data of arm data-<base>)")
    candidates: int = Field(3000, ge=1, description="pool conversations right after the base "
                            "prefix that are ranked")
    n: int = Field(1000, ge=1, description="conversations added to the base in each arm")
    seeds: list[int] = Field(default_factory=lambda: [0, 1], min_length=1)
    setting: str = Field("3,1,4", description="draft shape S,K,D the ranker decodes at")
    max_new_tokens: int = Field(64, ge=1, description="new tokens per candidate when ranking")
    selection_seed: int = Field(0, description="the random pick's seed")

    def check(self, where: str) -> None:
        parse_setting(self.setting, where=f"{where}: weak.setting")
        if self.n > self.candidates:
            raise UserError(f"{where}: weak.n {self.n} is more than weak.candidates "
                            f"{self.candidates}: the arms pick n of the candidates.")


class AtScaleConfig(StrictConfig):
    """The study's settings (`study.json` records them)."""

    WHERE: ClassVar[str] = "at-scale study config"

    out: str = Field(description="study directory")
    target: str = Field(description="the target (a directory or preset name)")
    greedy: list[str] = Field(min_length=1, description="conversation JSONL files of greedy "
                              "answers (the pool; one record per prompt)")
    sampled: list[str] = Field(default_factory=list, description="conversation JSONL files of "
                               "sampled answers to some of the same prompts (same ids)")
    eval_conversations: str = Field(description="greedy answers to the held-out prompts "
                                    "(teacher-forced evaluation of every run)")
    shuffle_seed: int = Field(0, description="the pool's order: arms are its prefixes")
    data_tokens: list[int] = Field(
        default_factory=lambda: [100_000, 400_000, 1_600_000, 6_000_000, 0],
        description="one data arm per count of unique answer tokens (0: the whole pool)")
    weight_decays: list[float] = Field(default_factory=lambda: [0.01, 0.1])
    seeds: list[int] = Field(default_factory=lambda: [0, 1], min_length=1)
    tokens_per_run: int = Field(16_000_000, gt=0, description="equal compute: tokens every "
                                "run processes")
    regen_tokens: int | None = Field(1_600_000, description="greedy vs sampled vs both "
                                     "arms at this many unique answer tokens (None: none)")
    recipes: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="recipe name -> TrainConfig overrides on top of "
        "`train` (e.g. speculators' eagle3 defaults)")
    recipe_tokens: list[int] = Field(default_factory=lambda: [1_600_000],
                                     description="data sizes the recipe arms run at")
    recipe_tokens_by: dict[str, list[int]] = Field(
        default_factory=dict, description="recipe name -> its own data sizes, in place of "
        "recipe_tokens (e.g. the sizes a planner fits one recipe's curve over)")
    long: list[LongArms] = Field(default_factory=list, description="arms trained on their own "
                                 "token count: small data far past its plateau at a constant "
                                 "rate, or an arm at more compute (each block its runs)")
    weak: WeakArms | None = Field(None, description="weak-spots vs random arms on a base "
                                  "prefix (None: none; `rank_weak` picks their data)")
    cache_max_tokens: int = Field(2_000_000, ge=0, description="arms with at most this many "
                                  "answer tokens keep their states on the GPU after the first "
                                  "epoch (TrainConfig.states_cache; ~4.6 KB a token in bf16)")
    evals_per_run: int = Field(32, ge=4, description="evaluations along each run")
    live_points: list[float] = Field(default_factory=lambda: [0.125, 0.25, 0.5, 1.0],
                                     description="fractions of tokens_per_run whose "
                                     "checkpoints are decoded live (1.0: the final drafter)")
    live_settings: list[str] = Field(default_factory=lambda: ["3,1,4", "5,1,6", "4,4,12"],
                                     description="draft shapes S,K,D decoded live")
    live_prompts: str = Field("eval", description="prompts decoded live")
    live_limit: int | None = Field(None, description="first N live prompts (None: all)")
    live_max_new_tokens: int = Field(256, ge=1)
    live_dtype: str = Field("bfloat16")
    live_batch_size: int = Field(128, ge=1, description="prompts in flight (static engine)")
    train: dict[str, Any] = Field(default_factory=dict, description="TrainConfig overrides "
                                  "for every run, on top of OUR_RECIPE")

    def check(self, where: str) -> None:
        # every run trains online (train_kwargs): online-only fields are valid overrides
        check_train_overrides(self.train, where, reserved=_SET_BY_STUDY,
                              set_by="the study itself", online=True)
        for name, over in self.recipes.items():
            check_train_overrides({**self.train, **over}, f"{where}.recipes.{name}",
                                  reserved=_SET_BY_STUDY, set_by="the study itself",
                                  online=True)
        if bad := [n for n in self.recipe_tokens_by if n not in self.recipes]:
            raise UserError(f"{where}.recipe_tokens_by: {', '.join(map(repr, bad))} "
                            f"{'is not a recipe' if len(bad) == 1 else 'are not recipes'} "
                            f"of this config (known: {', '.join(self.recipes) or 'none'}).")
        for i, block in enumerate(self.long):
            if block.recipe != "eagle3lab" and block.recipe not in self.recipes:
                known = ", ".join(["eagle3lab", *self.recipes])
                raise UserError(f"{where}.long[{i}].recipe: {block.recipe!r} is not a recipe "
                                f"of this config (known: {known}).")
        for s in self.live_settings:
            parse_setting(s, where=f"{where}.live_settings")
        if bad := [p for p in self.live_points if not 0 < p <= 1]:
            raise UserError(f"{where}.live_points: {bad} are not fractions in (0, 1].")


def parse_setting(text: str, *, where: str = "setting") -> tuple[int, int, int]:
    """'S,K,D' (draft steps, top-k, draft tokens verified) -> (S, K, D)."""
    try:
        s, k, d = (int(x) for x in str(text).split(","))
    except ValueError:
        raise UserError(f"{where}: {text!r} is not a draft shape S,K,D such as 5,1,6 "
                        f"(steps, top-k, tokens verified).") from None
    if min(s, k, d) < 1:
        raise UserError(f"{where}: {text!r}: S, K and D must be at least 1.")
    return s, k, d


# --- the pool ----------------------------------------------------------------------------
def _records(path: str | os.PathLike):
    """(raw line, parsed record) of a conversations JSONL; errors name file and line."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"conversations file {p} does not exist.")
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                rec["response_tokens"], rec["id"], rec["prompt"]
            except (ValueError, KeyError, TypeError):
                raise UserError(f"{p}:{n}: not a conversation record (regenerate's JSONL "
                                f"with id, prompt, response_tokens).") from None
            yield line if line.endswith("\n") else line + "\n", rec


def build_pool(*, greedy: list[str], sampled: list[str] = (), out: str | os.PathLike,
               shuffle_seed: int = 0) -> dict[str, Any]:
    """Write OUT/pool/{greedy,sampled}.jsonl: the greedy records (a prompt text seen again
    in a later record is dropped: one answer per prompt) in one seeded shuffled order, and
    the sampled records of the same prompts in the same order; returns (and writes as
    OUT/pool/pool.json) their counts and sha256s. Reused when pool.json matches the
    inputs."""
    import numpy as np

    d = Path(out) / "pool"
    if missing := [str(p) for p in [*greedy, *sampled] if not Path(p).is_file()]:
        raise UserError(f"conversations file(s) {', '.join(missing)} do not exist (on the "
                        f"device: `bench/study_gpu.py unpack` rebuilds them from the packs).")
    inputs = {"greedy": [{"path": str(p), "sha256": sha256_file(p)} for p in greedy],
              "sampled": [{"path": str(p), "sha256": sha256_file(p)} for p in sampled],
              "shuffle_seed": shuffle_seed}
    rec_path = d / "pool.json"
    if rec_path.is_file():
        old = json.loads(rec_path.read_text())
        if old.get("inputs") == inputs:
            return old
    d.mkdir(parents=True, exist_ok=True)
    lines, tokens, ids, seen, dropped = [], [], [], set(), 0
    for path in greedy:
        for line, rec in _records(path):
            key = rec["prompt"].strip()
            if key in seen:
                dropped += 1
                continue
            seen.add(key)
            lines.append(line)
            tokens.append(int(rec["response_tokens"]))
            ids.append(str(rec["id"]))
    if len(set(ids)) != len(ids):
        raise UserError("the greedy files repeat record ids; each prompt must have one id "
                        "across the files (split one prompts file, do not self-prompt twice).")
    order = np.random.default_rng(shuffle_seed).permutation(len(lines))
    rank = {ids[i]: r for r, i in enumerate(order)}
    with atomic_path(d / "greedy.jsonl") as tmp, open(tmp, "w", encoding="utf-8") as f:
        for i in order:
            f.write(lines[i])
    samp = []
    for path in sampled:
        for line, rec in _records(path):
            base = str(rec["id"]).split("#")[0]
            if base in rank:
                samp.append((rank[base], line, int(rec["response_tokens"])))
    samp.sort(key=lambda x: x[0])
    with atomic_path(d / "sampled.jsonl") as tmp, open(tmp, "w", encoding="utf-8") as f:
        for _, line, _ in samp:
            f.write(line)
    copy_meta(Path(greedy[0]), d / "greedy.jsonl")
    if sampled:
        copy_meta(Path(sampled[0]), d / "sampled.jsonl")
    rec = {"inputs": inputs, "greedy": {"records": len(lines), "tokens": int(sum(tokens)),
                                        "duplicates_dropped": dropped,
                                        "sha256": sha256_file(d / "greedy.jsonl")},
           "sampled": {"records": len(samp), "tokens": int(sum(t for *_, t in samp)),
                       "sha256": sha256_file(d / "sampled.jsonl")}}
    atomic_write_json(rec_path, rec)
    return rec


#: How an arm's records are taken from its pool file (`write_prefix`'s `pair`).
PAIRINGS = (None, "both", "same-prompts")


def write_prefix(src: Path, dst: Path, tokens: int, *, pair: str | None = None,
                 sampled: Path | None = None) -> dict[str, Any]:
    """The first records of `src` whose answers hold `tokens` unique answer tokens (0: all)
    -> dst. pair "both": only prompts that `sampled` also answers, each with its sampled
    answer first (greedy and sampled answers to the same prompts, together `tokens`);
    "same-prompts": only the greedy answers to the prompts `sampled` answers (the greedy
    side of the sampled arm, on the same prompts in the same order)."""
    if pair not in PAIRINGS:
        raise UserError(f"pair {pair!r}: expected one of {PAIRINGS}.")
    other: dict[str, str] = {}
    if pair is not None:
        if sampled is None:
            raise UserError(f"pair {pair!r} needs the sampled answers (sampled=...).")
        for line, rec in _records(sampled):
            other.setdefault(str(rec["id"]).split("#")[0], line)
    n = total = 0
    with atomic_path(dst) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for line, rec in _records(src):
            if tokens and total >= tokens:
                break
            base = str(rec["id"]).split("#")[0]
            if pair is not None and base not in other:
                continue
            if pair == "both":
                mate = json.loads(other[base])
                f.write(other[base])
                total += int(mate["response_tokens"])
                n += 1
            f.write(line)
            total += int(rec["response_tokens"])
            n += 1
    if tokens and total < tokens:
        raise UserError(f"{src} holds only {total:,} answer tokens"
                        + (f" ({pair}: with {sampled})" if pair else "")
                        + f"; an arm asks for {tokens:,}.")
    copy_meta(src, dst)
    return {"path": str(dst), "records": n, "tokens": total, "sha256": sha256_file(dst)}


def copy_meta(src: Path, dst: Path) -> None:
    """dst's `.meta.json`: src's (which names the target that wrote the answers, so that
    online training refuses them for another target), marked as derived."""
    m = meta_path(Path(src))
    if m.is_file():
        meta = json.loads(m.read_text())
        meta["derived_from"] = {"path": str(src), "sha256": sha256_file(src)}
        atomic_write_json(meta_path(Path(dst)), meta)


# --- the plan ------------------------------------------------------------------------------
def _tok(n: int) -> str:
    return "all" if not n else (f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k")


def plan_arms(cfg: AtScaleConfig) -> list[dict[str, Any]]:
    """One entry per run, in the order they should run (the core comparison first: every
    data size at the first weight decay and seed; then the regeneration and recipe arms;
    then the weak-spots arms of every seed; then the other seeds; then the other weight
    decays). Each: name, kind, the data spec (pool file, unique tokens, pairing; a weak
    arm's `selection` and `added` conversations) and the TrainConfig overrides."""
    wd0, seed0 = cfg.weight_decays[0], cfg.seeds[0]
    runs: list[dict[str, Any]] = []

    def add(name, kind, source, tokens, wd, seed, recipe=None, pair=None):
        runs.append({"name": name, "kind": kind, "source": source, "unique_tokens": tokens,
                     "pair": pair, "weight_decay": wd, "seed": seed,
                     "recipe": recipe or "eagle3lab"})

    for seed in cfg.seeds:
        for wd in cfg.weight_decays:
            for t in cfg.data_tokens:
                add(f"data-{_tok(t)}-wd{wd:g}-s{seed}", "data", "greedy", t, wd, seed)
            if wd != wd0:
                continue
            if cfg.regen_tokens:
                t = cfg.regen_tokens
                add(f"regen-greedy-{_tok(t)}-s{seed}", "regen", "greedy", t, wd, seed,
                    pair="same-prompts")
                add(f"regen-sampled-{_tok(t)}-s{seed}", "regen", "sampled", t, wd, seed)
                add(f"regen-both-{_tok(t)}-s{seed}", "regen", "greedy", t, wd, seed,
                    pair="both")
            for rname in cfg.recipes:
                for t in cfg.recipe_tokens_by.get(rname, cfg.recipe_tokens):
                    add(f"recipe-{rname}-{_tok(t)}-s{seed}", "recipe", "greedy", t, wd, seed,
                        recipe=rname)

    for block in cfg.long:
        rtag = "" if block.recipe == "eagle3lab" else f"{block.recipe}-"
        for seed in block.seeds:
            for wd in block.weight_decays:
                for t in block.data_tokens:
                    add(f"long-{rtag}{_tok(t)}-{_tok(block.tokens_per_run)}-wd{wd:g}-s{seed}",
                        "long", "greedy", t, wd, seed, recipe=block.recipe)
                    runs[-1].update(tokens_per_run=block.tokens_per_run,
                                    overrides={"schedule": block.schedule})
    if len(names := [r["name"] for r in runs]) != len(set(names)):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise UserError(f"at-scale study config: the long blocks plan {', '.join(dup)} more "
                        f"than once (same data, tokens, weight decay and seed).")

    if cfg.weak:  # base prefix + n picked conversations (prepare_study: the selection's)
        for seed in cfg.weak.seeds:
            for pick in WEAK_PICKS:
                add(f"{pick}-{_tok(cfg.weak.base_tokens)}+{cfg.weak.n}-s{seed}", "weak",
                    "greedy", cfg.weak.base_tokens, wd0, seed)
                runs[-1].update(selection=pick, added=cfg.weak.n)

    def priority(r):
        if r["kind"] == "long":  # the longest runs: first
            return (False, False, -1)
        if r["kind"] == "weak":  # every seed: after the seed-0 core, before the other seeds
            return (False, False, 3)
        return (r["weight_decay"] != wd0, r["seed"] != seed0,
                {"data": 0, "regen": 1, "recipe": 2}[r["kind"]])
    runs.sort(key=priority)  # stable: sizes stay in order within a group
    return runs


def recipe_settings(cfg: AtScaleConfig, recipe: str = "eagle3lab") -> dict[str, Any]:
    """A run's TrainConfig overrides before the study's own: OUR_RECIPE, the study's
    `train`, then the named recipe's."""
    return {**OUR_RECIPE, **cfg.train, **cfg.recipes.get(recipe, {})}


def run_tokens(cfg: AtScaleConfig, arm: dict[str, Any] | None = None) -> int:
    """Tokens a run processes: the study's equal compute, or a long arm's own."""
    return (arm or {}).get("tokens_per_run") or cfg.tokens_per_run


def steps_per_run(cfg: AtScaleConfig, recipe: str = "eagle3lab",
                  tokens: int | None = None) -> int:
    """Optimizer steps of a run of `recipe` over `tokens` (default: the equal compute),
    estimated from full batches."""
    tpb = recipe_settings(cfg, recipe).get("max_tokens_per_batch", 2048)
    return max(1, -(-(tokens or cfg.tokens_per_run) // tpb))


def train_kwargs(cfg: AtScaleConfig, arm: dict[str, Any], data_file: str) -> dict[str, Any]:
    """The run's TrainConfig fields: online on its data file, the study's equal compute
    (`max_tokens`), `evals_per_run` evaluations, and a checkpoint every 1/`CHECKPOINT_SLOTS`
    of the run (all kept: the live points pick the nearest by tokens)."""
    tokens = run_tokens(cfg, arm)
    steps = steps_per_run(cfg, arm["recipe"], tokens)
    return {**recipe_settings(cfg, arm["recipe"]), **arm.get("overrides", {}),
            "online": True, "conversations": data_file,
            "eval_conversations": cfg.eval_conversations, "target": cfg.target,
            "out": str(Path(cfg.out) / "runs" / arm["name"]), "weight_decay": arm["weight_decay"],
            "seed": arm["seed"], "epochs": 100_000, "max_tokens": tokens,
            "eval_every": max(1, steps // cfg.evals_per_run),
            "checkpoint_every": max(1, steps // CHECKPOINT_SLOTS),
            # kept until the live points are decoded (then bench/study_gpu.py deletes them);
            # room for twice the estimate, should packing leave batches half full
            "keep_checkpoints": 2 * CHECKPOINT_SLOTS + 2, "progress": False,
            "states_cache": arm["data"]["tokens"] <= cfg.cache_max_tokens}


#: Checkpoints along each run (every 1/8 of its steps): the live points' candidates.
CHECKPOINT_SLOTS = 8


def prepare_study(cfg: AtScaleConfig) -> dict[str, Any]:
    """The pool, each arm's data file (OUT/data/NAME.jsonl; shared by arms of equal data)
    and study.json. Returns study.json's content."""
    out = Path(cfg.out)
    if cfg.weak and not (out / WEAK_SELECTION).is_file():
        raise UserError(f"The study config has a `weak` block but {out / WEAK_SELECTION} does "
                        f"not exist: run `bench/study_gpu.py weak` (atscale.rank_weak) first; "
                        f"it ranks the candidates and writes it.")
    pool = build_pool(greedy=cfg.greedy, sampled=cfg.sampled, out=out,
                      shuffle_seed=cfg.shuffle_seed)
    selection = read_selection(cfg, pool) if cfg.weak else None
    arms = plan_arms(cfg)
    data_dir = out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    made: dict[tuple, dict[str, Any]] = {}
    for arm in arms:
        key = (arm["source"], arm["unique_tokens"], arm["pair"], arm.get("selection"))
        if key not in made and arm.get("selection"):  # a weak arm: base + its pick
            made[key] = write_selected(
                out / "pool" / "greedy.jsonl",
                data_dir / f"{arm['selection']}-{_tok(key[1])}+{arm['added']}.jsonl",
                base_records=selection["base"]["records"],
                ids=selection[f"{arm['selection']}_ids"], selection=selection)
        if key not in made:
            src = out / "pool" / f"{arm['source']}.jsonl"
            name = (f"{arm['source']}"
                    + {None: "", "both": "+sampled", "same-prompts": "-sampledprompts"}[
                        arm["pair"]] + f"-{_tok(key[1])}")
            dst = data_dir / f"{name}.jsonl"
            if not key[1] and not arm["pair"]:
                made[key] = {"path": str(src), "records": pool[arm["source"]]["records"],
                             "tokens": pool[arm["source"]]["tokens"],
                             "sha256": pool[arm["source"]]["sha256"]}
            else:
                made[key] = write_prefix(src, dst, key[1], pair=arm["pair"],
                                         sampled=out / "pool" / "sampled.jsonl")
        arm["data"] = made[key]
        arm["train"] = train_kwargs(cfg, arm, made[key]["path"])
    study = {"format": STUDY_FORMAT, "version": 1, "config": cfg.model_dump(), "pool": pool,
             "steps_per_run": steps_per_run(cfg), "arms": arms}
    if selection is not None:
        study["weak_selection"] = {"file": WEAK_SELECTION, "sha256": selection["sha256"]}
    atomic_write_json(out / "study.json", study)
    return study


def read_study(study_dir: str | os.PathLike) -> dict[str, Any]:
    p = Path(study_dir) / "study.json"
    if not p.is_file():
        raise UserError(f"{study_dir} holds no study.json (make it with prepare_study or "
                        f"`bench/study_gpu.py plan`).")
    study = read_json_object(p, what="study record", fix="Copy it again from the study "
                             "directory (atscale.collect), or plan the study again.")
    if study.get("format") != STUDY_FORMAT:
        raise UserError(f"{p} is not an at-scale study ({study.get('format')!r}).")
    return study


# --- the weak-spots arms ---------------------------------------------------------------------
WEAK_FORMAT = "eagle3lab-study-weak-selection"
#: The selection `rank_weak` writes into the study directory (`collect` copies it).
WEAK_SELECTION = "weak-selection.json"
#: The weak arms' two picks: the candidates the ranker accepts least on, and a seeded draw.
WEAK_PICKS = ("weak", "random")


def resolve_ranker(path: str | os.PathLike) -> Path:
    """The ranker's directory: as given, else (relative and not found from here) the
    checkout's (data/drafters/NAME)."""
    p = Path(path)
    if not p.is_absolute() and not p.exists():
        p = repo_root() / p
    if not (p / "config.json").is_file():
        raise UserError(f"weak.ranker {str(path)!r}: no drafter at {p} (no config.json); give "
                        f"a drafter directory such as data/drafters/smollm2-135m-instruct.")
    return p


def ranker_weights(ranker: Path) -> dict[str, str]:
    """sha256 of each weights file of a drafter directory."""
    files = sorted(ranker.glob("*.safetensors")) + sorted(ranker.glob("pytorch_model*.bin"))
    if not files:
        raise UserError(f"weak.ranker {ranker}: no weights (*.safetensors) in it.")
    return {f.name: sha256_file(f) for f in files}


def prefix_size(src: Path, tokens: int) -> tuple[int, int]:
    """(records, answer tokens) of the plain prefix `write_prefix(src, ..., tokens)` writes:
    the first records holding `tokens` unique answer tokens (0: all)."""
    n = total = 0
    for _, rec in _records(src):
        if tokens and total >= tokens:
            break
        total += int(rec["response_tokens"])
        n += 1
    if tokens and total < tokens:
        raise UserError(f"{src} holds only {total:,} answer tokens; the weak arms' base asks "
                        f"for {tokens:,}.")
    return n, total


def _weak_key(cfg: AtScaleConfig, pool: dict[str, Any]) -> dict[str, Any]:
    """What a selection must have been made for: the weak block and the pool's order."""
    return {"weak": cfg.weak.model_dump(), "pool_sha256": pool["greedy"]["sha256"]}


def _made_for(sel: dict[str, Any], cfg: AtScaleConfig, pool: dict[str, Any],
              weights: dict[str, str]) -> bool:
    """Whether a selection was made for this weak block and pool by a ranker with these
    weights. The ranker is known by its weights, not its path: a drafter moved or renamed
    (the previous default drafter's move to `-sglang`) ranks the same, and re-ranking it
    cost study session 9 104 s of device time."""
    want = _weak_key(cfg, pool)

    def block(w: Any) -> dict[str, Any]:
        return {k: v for k, v in (w or {}).items() if k != "ranker"}
    return (sel.get("format") == WEAK_FORMAT and sel.get("pool_sha256") == want["pool_sha256"]
            and block(sel.get("weak")) == block(want["weak"])
            and (sel.get("ranker") or {}).get("weights") == weights)


def per_prompt_counts(*, target: Any, draft: str | os.PathLike, setting: str, prompts: list,
                      max_new_tokens: int, dtype: str = "bfloat16", device: str = "auto",
                      batch_size: int = 128) -> list[dict[str, Any]]:
    """Greedy speculative decoding of `prompts` (loaded `Prompt`s) by the static engine, as
    `live_tau` decodes: one record per prompt with its raw counts, in the form
    `measure.weakspots.rank_prompts` ranks (prompt = the id)."""
    # lazy: the engine and the target load torch and transformers; planning needs neither
    from eagle3lab.specdec.accept import prompt_ids  # lazy: as above
    from eagle3lab.specdec.load import load_engine  # lazy: as above
    from eagle3lab.targets.adapter import Target, load_target  # lazy: as above

    tgt = target if isinstance(target, Target) else load_target(target, device=device,
                                                                   dtype=dtype)
    ctx = tgt.max_position_embeddings or 4096
    plist = prompt_ids(tgt.tokenizer, prompts, None, max(16, ctx - max_new_tokens - 1))
    steps, topk, dt = parse_setting(setting)
    eng = load_engine(target=tgt, draft=str(draft), steps=steps, topk=topk, draft_tokens=dt,
                      engine="static", batch_size=batch_size)
    res = eng.generate_many([i for _, i in plist], max_new_tokens=max_new_tokens,
                            temperature=0.0)
    return [{"prompt": pid, "category": p.category, "prompt_tokens": len(ids),
             "completion_tokens": r.completion_tokens, "verify_ct": r.verify_ct,
             "accept_histogram": list(r.accept_histogram)}
            for (pid, ids), p, r in zip(plist, prompts, res)]


def _group_tau(rows: list[dict[str, Any]]) -> float | None:
    """tau of a group of candidates as a ratio of sums: the decode-phase accept length,
    1 + accepted / verify steps (specdec/stats.py)."""
    steps = sum(r["verify_ct"] for r in rows)
    acc = sum(k * c for r in rows for k, c in enumerate(r["accept_histogram"]))
    return decode_accept_length(acc, steps) if steps else None


def rank_weak(cfg: AtScaleConfig, *, target: Any = None, device: str = "auto",
              progress: bool = False) -> Path:
    """The weak arms' data, picked: the `weak.candidates` pool conversations right after the
    base prefix (disjoint from it, and so from every arm at or below the base size), their
    prompts decoded by `weak.ranker` on the static engine at `weak.setting` (greedy,
    `weak.max_new_tokens` new tokens), ranked by per-prompt tau
    (`measure.weakspots.rank_prompts`); the `n` lowest are the weak pick, `n` drawn from
    all candidates with `selection_seed` the random one (the two may share prompts: a
    random draw that avoided the weak ones would be biased towards easy prompts). Writes
    OUT/weak-selection.json atomically: the ranker (path, sha256 of its weights), the
    setting, every candidate's id, raw counts and tau, both picks. Reused when it exists
    for the same weak block, pool and ranker weights."""
    if cfg.weak is None:
        raise UserError("The study config has no `weak` block: there is nothing to rank "
                        "(data/studies/h200-grok/config.json has one).")
    w, out = cfg.weak, Path(cfg.out)
    pool = build_pool(greedy=cfg.greedy, sampled=cfg.sampled, out=out,
                      shuffle_seed=cfg.shuffle_seed)
    ranker = resolve_ranker(w.ranker)
    weights = ranker_weights(ranker)
    dst = out / WEAK_SELECTION
    if dst.is_file():
        old = read_json_object(dst, what="weak-spots selection")
        if _made_for(old, cfg, pool, weights):
            if progress:
                print(f"weak: {dst} is already made for this config; not ranked again.")
            return dst
    src = out / "pool" / "greedy.jsonl"
    base_n, base_tokens = prefix_size(src, w.base_tokens)
    cands = []
    for i, (_, rec) in enumerate(_records(src)):
        if i >= base_n + w.candidates:
            break
        if i >= base_n:
            cands.append(rec)
    if len(cands) < w.candidates:
        raise UserError(f"The pool holds {len(cands)} conversations after the "
                        f"{_tok(w.base_tokens)} base prefix ({base_n} records); "
                        f"weak.candidates asks for {w.candidates}.")
    import time

    import numpy as np

    from eagle3lab.data.prompts import Prompt  # lazy: only the ranking stage decodes
    from eagle3lab.measure.weakspots import rank_prompts  # lazy: pandas, measure's clients

    t0 = time.perf_counter()
    records = per_prompt_counts(
        target=target if target is not None else cfg.target, draft=ranker,
        setting=w.setting, max_new_tokens=w.max_new_tokens, dtype=cfg.live_dtype,
        device=device, batch_size=cfg.live_batch_size,
        prompts=[Prompt(id=str(r["id"]), prompt=r["prompt"], category=r.get("category"))
                 for r in cands])
    ranking = rank_prompts(records)
    if len(ranking) < w.n:
        raise UserError(f"Only {len(ranking)} of {len(cands)} candidates were verified at "
                        f"least once (weak.n asks for {w.n}); raise weak.max_new_tokens.")
    weak_ids = [str(x) for x in ranking["prompt"].head(w.n)]
    drawn = sorted(np.random.default_rng(w.selection_seed).choice(len(cands), w.n,
                                                                  replace=False))
    random_ids = [str(cands[i]["id"]) for i in drawn]
    tau = dict(zip(ranking["prompt"].astype(str), ranking["tau"].astype(float)))
    rows = [{"id": str(c["id"]), "answer_tokens": int(c["response_tokens"]),
             **{k: r[k] for k in ("category", "prompt_tokens", "completion_tokens",
                                  "verify_ct", "accept_histogram")},
             "tau": tau.get(str(c["id"]))} for c, r in zip(cands, records)]
    by_id = {r["id"]: r for r in rows}
    import torch

    sel = {"format": WEAK_FORMAT, "version": 1, **_weak_key(cfg, pool),
           "ranker": {"path": w.ranker, "weights": weights}, "setting": w.setting,
           "max_new_tokens": w.max_new_tokens, "engine": "static", "dtype": cfg.live_dtype,
           "device": (torch.cuda.get_device_name(0)
                      if torch.cuda.is_available() and device != "cpu" else "cpu"),
           "target": str(getattr(target, "path", None) or target or cfg.target),
           "base": {"records": base_n, "tokens": base_tokens},
           "tau": {"candidates": _group_tau(rows),
                   "weak": _group_tau([by_id[i] for i in weak_ids]),
                   "random": _group_tau([by_id[i] for i in random_ids])},
           "weak_ids": weak_ids, "random_ids": random_ids,
           "seconds": time.perf_counter() - t0, "candidates": rows}
    atomic_write_json(dst, sel)
    if progress:
        t = sel["tau"]
        print(f"weak: {len(cands)} candidates ranked by {w.ranker} at {w.setting} in "
              f"{sel['seconds']:.0f} s: tau {t['candidates']:.3f} over all, "
              f"{t['weak']:.3f} the weakest {w.n}, {t['random']:.3f} the random {w.n}.")
    return dst


def read_selection(cfg: AtScaleConfig, pool: dict[str, Any]) -> dict[str, Any]:
    """OUT/weak-selection.json, checked to be made for this weak block and pool; its sha256
    under "sha256"."""
    p = Path(cfg.out) / WEAK_SELECTION
    sel = read_json_object(p, what="weak-spots selection",
                           fix="Delete it and run `bench/study_gpu.py weak` again.")
    if not _made_for(sel, cfg, pool, ranker_weights(resolve_ranker(cfg.weak.ranker))):
        raise UserError(f"{p} was made for another weak block, pool or ranker than this "
                        f"config's: "
                        f"run `bench/study_gpu.py weak` (atscale.rank_weak) again; it ranks "
                        f"anew.")
    return {**sel, "sha256": sha256_file(p)}


def write_selected(src: Path, dst: Path, *, base_records: int, ids: list[str],
                   selection: dict[str, Any] | None = None) -> dict[str, Any]:
    """The first `base_records` records of `src` (the base prefix) and then the records
    `ids` names (in the pool's order) -> dst, with src's meta file; the counts."""
    want, n, total, added, added_tokens = set(ids), 0, 0, 0, 0
    with atomic_path(dst) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for i, (line, rec) in enumerate(_records(src)):
            if i >= base_records and added == len(want):
                break
            if i < base_records or str(rec["id"]) in want:
                f.write(line)
                n += 1
                total += int(rec["response_tokens"])
                if i >= base_records:
                    added += 1
                    added_tokens += int(rec["response_tokens"])
    if added != len(want):
        raise UserError(f"{src}: {len(want) - added} of the selection's ids are not after "
                        f"the base prefix in the pool; rank again (`bench/study_gpu.py weak`).")
    copy_meta(src, dst)
    out = {"path": str(dst), "records": n, "tokens": total, "sha256": sha256_file(dst),
           "base_records": base_records, "added_records": added,
           "added_tokens": added_tokens}
    if selection is not None:
        out["selection_sha256"] = selection.get("sha256")
    return out


# --- live acceptance --------------------------------------------------------------------------
def live_points(run_dir: str | os.PathLike, *, fractions: list[float],
                tokens_per_run: int, reached_only: bool = False) -> list[dict[str, Any]]:
    """The run's drafters at the live points: for a fraction below 1 the step checkpoint
    whose tokens processed are nearest to fraction x tokens_per_run, for 1 the final
    drafter (final/). reached_only (a run still training): only the fractions below 1
    whose checkpoint is settled, i.e. one at or past fraction x tokens_per_run exists (a
    later checkpoint is farther), and no final drafter."""
    run_dir = Path(run_dir)
    table = list_checkpoints(run_dir, source="eagle3lab")
    steps = table[table["servable"] & table["tokens"].notna()
                  & (table["path"] != str(run_dir / "final"))]
    cks = [{"step": int(r.step), "tokens": int(r.tokens), "path": r.path}
           for r in steps.itertuples()]
    pts = []
    last = max((c["tokens"] for c in cks), default=None)
    for p in sorted(set(fractions)):
        if reached_only and (p >= 1 or last is None or last < p * tokens_per_run):
            continue
        if p >= 1:
            final = run_dir / "final"
            if (final / "config.json").is_file():
                summary = json.loads((run_dir / "run.json").read_text()).get("summary") or {}
                pts.append({"fraction": 1.0, "step": summary.get("steps"),
                            "tokens": summary.get("tokens"), "path": str(final)})
            continue
        if cks:
            c = min(cks, key=lambda c: abs(c["tokens"] - p * tokens_per_run))
            if all(c["path"] != q["path"] for q in pts):
                pts.append({"fraction": p, **c})
    return pts


def live_tau(*, target: Any, drafters: list[dict[str, Any]], settings: list[str],
             prompts: str = "eval", limit: int | None = None, max_new_tokens: int = 256,
             dtype: str = "bfloat16", device: str = "auto", batch_size: int = 128,
             progress: bool = False, skip: frozenset = frozenset(),
             on_row: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Greedy speculative decoding of `prompts` by the static engine with each drafter at
    each shape: one row per (drafter, shape) with the raw counts (accept histogram, verify
    steps, tokens) and tau. No plain run: acceptance needs none. drafters: dicts with a
    `path` (and anything else, kept in the row), decoded in the order given. `skip`:
    (path, shape) pairs already measured (no row). `on_row`: called with each row as soon
    as it is measured (measure_live saves it at once)."""
    import time

    # lazy: the engine and the target load torch and transformers; planning needs neither
    from eagle3lab.specdec.accept import prompt_ids  # lazy: as above
    from eagle3lab.specdec.load import load_drafter, load_engine  # lazy: as above
    from eagle3lab.targets.adapter import Target, load_target  # lazy: as above

    tgt = target if isinstance(target, Target) else load_target(target, device=device,
                                                                   dtype=dtype)
    ctx = tgt.max_position_embeddings or 4096
    plist = prompt_ids(tgt.tokenizer, prompts, limit, max(16, ctx - max_new_tokens - 1))
    ids = [i for _, i in plist]
    rows = {}
    # one engine per shape, each next drafter's weights copied into it (swap_drafter): its
    # caches and captured graphs are reused, not built again per drafter; a drafter of
    # another architecture gets an engine of its own
    engines: dict[str, Any] = {}
    for di, d in enumerate(drafters):
        loaded = None
        for s in settings:
            if (d["path"], s) in skip:
                continue
            steps, topk, dt = parse_setting(s)
            t0 = time.perf_counter()
            eng = engines.get(s)
            if eng is not None:
                loaded = loaded or load_drafter(d["path"], target=tgt)
                if eng.swap_problem(*loaded) is None:
                    eng.swap_drafter(*loaded)
                else:
                    eng = None
            if eng is None:
                eng = engines[s] = load_engine(target=tgt, draft=d["path"], steps=steps,
                                               topk=topk, draft_tokens=dt, engine="static",
                                               batch_size=batch_size)
            res = eng.generate_many(ids, max_new_tokens=max_new_tokens, temperature=0.0)
            st = AcceptStats.from_results(res)
            rows[di, s] = {**d, "setting": s, "tau": st.tau, "requests": st.requests,
                           "completion_tokens": st.completion_tokens,
                           "verify_ct": st.verify_ct, "accept_histogram": list(st.histogram),
                           "acceptance_cumulative": st.cumulative(),
                           "per_prompt_tokens": [r.completion_tokens for r in res],
                           "per_prompt_verify": [r.verify_ct for r in res],
                           "seconds": time.perf_counter() - t0}
            if on_row is not None:
                on_row(rows[di, s])
            if progress:
                print(f"live {Path(d['path']).parent.name}/{Path(d['path']).name} {s}: "
                      f"tau {st.tau:.3f} ({time.perf_counter() - t0:.1f} s)", flush=True)
    del engines
    return [rows[di, s] for di in range(len(drafters)) for s in settings if (di, s) in rows]


def live_complete(run_dir: str | os.PathLike) -> bool:
    """Whether RUN/live.json holds every live point (files written before partial saves
    have no `complete` key and were written whole)."""
    p = Path(run_dir) / "live.json"
    if not p.is_file():
        return False
    try:
        return bool(json.loads(p.read_text()).get("complete", True))
    except (OSError, ValueError, AttributeError):
        return False


def measure_live(study_dir: str | os.PathLike, name: str, *, target: Any = None,
                 device: str = "auto", progress: bool = False, early: bool = False) -> Path:
    """Decode a finished run's live points; RUN/live.json is rewritten (atomically) after
    every measured row, `complete` false until the last, so a decode cut short (the
    deadline, a lost machine) keeps what it measured and `collect` returns it. The final
    drafter is decoded first: the point the study reads most. Resumed: rows already in a
    partial live.json are not measured again; reused whole when it holds every point and
    shape. early: the run is still training; decode the points its checkpoints have
    settled (`live_points`' reached_only) and leave the file incomplete, so a machine lost
    before the run ends still returns those rows, and the decode after it measures only
    the rest."""
    study = read_study(study_dir)
    pts = run_live_points(study_dir, study, name, reached_only=early)
    return _decode_live(Path(study_dir) / "runs" / name / "live.json", {"run": name}, pts,
                        study["config"], target=target, device=device, progress=progress,
                        finish=not early)


def run_live_points(study_dir: str | os.PathLike, study: dict[str, Any], name: str, *,
                    reached_only: bool = False) -> list[dict[str, Any]]:
    """`live_points` of the planned run NAME (`study`: its study.json): the study's
    fractions of the run's own token count (a long arm's, else the study's). A point
    below the end already measured in the run's live.json from a checkpoint this machine
    does not have (a run carried from another machine by bench/run_carry.py, which takes
    only the newest checkpoint and live.json along) stays that measured point, instead
    of the nearest checkpoint here."""
    cfg = study["config"]
    arm = next((a for a in study["arms"] if a["name"] == name), None)
    run_dir = Path(study_dir) / "runs" / name
    gone: dict[float, dict[str, Any]] = {}
    if (run_dir / "live.json").is_file():
        old = read_json_object(run_dir / "live.json", what="live tau file",
                               fix="Delete it: the next call decodes the run again.")
        gone = {r["fraction"]: {k: r[k] for k in ("fraction", "step", "tokens", "path")}
                for r in old.get("rows") or []
                if (r.get("fraction") or 1.0) < 1 and not Path(r["path"]).exists()}
    pts = live_points(run_dir, fractions=[f for f in cfg["live_points"] if f not in gone],
                      tokens_per_run=(arm or {}).get("tokens_per_run")
                      or cfg["tokens_per_run"], reached_only=reached_only)
    return sorted(pts + list(gone.values()), key=lambda p: p["fraction"])


def measure_reference(study_dir: str | os.PathLike, *, drafter: str | os.PathLike,
                      name: str, target: Any = None, device: str = "auto",
                      progress: bool = False) -> Path:
    """Decode a drafter trained elsewhere (the shipped one) exactly as the runs' final
    drafters are decoded (the study's prompts, shapes, engine, dtype, new tokens), into
    STUDY/references/NAME/live.json: the bar a run must clear to replace it, measured the
    same way. Resumes and reuses as measure_live does."""
    study = read_study(study_dir)
    path = str(Path(drafter).resolve())
    return _decode_live(Path(study_dir) / REFERENCES / name / "live.json",
                        {"reference": name}, [{"path": path, "fraction": 1.0}],
                        study["config"], target=target, device=device, progress=progress)


def _decode_live(dst: Path, who: dict[str, Any], pts: list[dict[str, Any]],
                 cfg: dict[str, Any], *, target: Any, device: str, progress: bool,
                 finish: bool = True) -> Path:
    """measure_live's decode of `pts` (dicts with path and fraction) into `dst`; finish
    false: the points are not all there yet (an early decode), the file stays incomplete
    and nothing is loaded when every point given is measured."""
    import torch

    settings = list(cfg["live_settings"])
    want = {(p["path"], s) for p in pts for s in settings}
    rows: list[dict[str, Any]] = []
    if dst.is_file():
        old = read_json_object(dst, what="live tau file",
                               fix="Delete it: the next call decodes the run again.")
        if {(r["path"], r["setting"]) for r in old["rows"]} >= want \
                and old.get("complete", True):
            return dst
        rows = [r for r in old["rows"] if (r["path"], r["setting"]) in want]
    have = frozenset((r["path"], r["setting"]) for r in rows)
    if not finish and want <= have:
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    head = {**who, "engine": "static", "dtype": cfg["live_dtype"],
            "device": torch.cuda.get_device_name(0)
            if torch.cuda.is_available() and device != "cpu" else "cpu",
            "prompts": cfg["live_prompts"], "max_new_tokens": cfg["live_max_new_tokens"]}

    def save(complete: bool, serving: dict | None = None) -> None:
        ordered = sorted(rows, key=lambda r: (r.get("fraction") or 0,
                                              settings.index(r["setting"])))
        atomic_write_json(dst, {**head, "serving": serving, "complete": complete,
                                "rows": ordered})

    def keep(row: dict[str, Any]) -> None:
        rows.append(row)
        save(False)

    live_tau(target=target or cfg["target"],
             drafters=sorted(pts, key=lambda p: -p["fraction"]), settings=settings,
             prompts=cfg["live_prompts"], limit=cfg["live_limit"],
             max_new_tokens=cfg["live_max_new_tokens"], dtype=cfg["live_dtype"],
             device=device, batch_size=cfg["live_batch_size"], progress=progress,
             skip=have, on_row=keep)
    if not finish:
        return dst
    # lazy: the doctor reads the checkpoint (safetensors); planning never needs it
    from eagle3lab.formats.doctor import serving_engines

    final = [p["path"] for p in pts if p["fraction"] >= 1]
    # which engines serve the final drafter as trained (the doctor's verdict, per engine)
    serving = ({e: v.to_dict() for e, v in serving_engines(
        final[0], target=getattr(target, "path", target) or cfg["target"]).items()}
        if final else None)
    save(True, serving)
    return dst


# --- results --------------------------------------------------------------------------------
#: What `collect` copies of each run (small; never checkpoints).
RUN_FILES = ("run.json", "metrics.jsonl", "live.json")
#: STUDY/references/NAME/live.json: drafters trained elsewhere, decoded as the runs are.
REFERENCES = "references"


def copy_references(src: Path, dest: Path, *, overwrite: bool = True) -> list[str]:
    """Copy SRC/references/NAME/live.json to DEST/references/NAME/ (`collect`, and
    `restore` with overwrite False: what is there already stays); the names copied."""
    names = []
    for ref in sorted((src / REFERENCES).glob("*/live.json")):
        dst = dest / REFERENCES / ref.parent.name / "live.json"
        if overwrite or not dst.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ref, dst)
            names.append(ref.parent.name)
    return names


#: What `collect` writes beside a packed winner: which run it is (bench/ship_drafter.py
#: ships it only with this record, so weights and curve come from one run).
WINNER_RECORD = "winner.json"
WINNER_FORMAT = "eagle3lab-winner"


def best_final_here(study_dir: str | os.PathLike) -> tuple[str, str, float] | None:
    """(run, setting, tau) of the best final drafter ON THIS MACHINE: among the runs whose
    `final/` is here (trained in this session: runs restored from earlier sessions have
    only their results), the highest final live tau at MAIN_SETTING (or the study's first
    live shape); None while no such final is decoded. Prevents a session's best
    drafter staying on the device because nobody named it (session 24: the 128M run)."""
    src = Path(study_dir)
    shapes = list(read_study(src)["config"]["live_settings"])
    setting = MAIN_SETTING if MAIN_SETTING in shapes else shapes[0]
    best = None
    for run in sorted((src / "runs").glob("*")):
        if not (run / "final").is_dir() or not (run / "live.json").is_file():
            continue
        try:
            rows = json.loads((run / "live.json").read_text()).get("rows", [])
        except (OSError, ValueError, AttributeError):
            continue  # being rewritten, or not ours: the next poll reads it
        taus = [float(r["tau"]) for r in rows if isinstance(r, dict)
                and r.get("fraction") == 1.0 and r.get("setting") == setting
                and r.get("tau") is not None]
        if taus and (best is None or taus[0] > best[2]):
            best = (run.name, setting, taus[0])
    return best


def collect(study_dir: str | os.PathLike, dest: str | os.PathLike, *,
            winner: str | None = None) -> dict[str, Any]:
    """Copy study.json (the plan, with the pool's counts and sha256s), the weak arms'
    selection when there is one, and each run's RUN_FILES to `dest` (what is committed
    under data/studies/), plus `winner`'s packed drafter if named and finished (a poll
    names it before the run ends: until then the key "winner" is None). winner "auto":
    the best final drafter decoded on this machine (`best_final_here`; "winner_run",
    "winner_setting" and "winner_tau" say which), so a session's best weights come back
    unasked. A packed winner carries WINNER_RECORD: its run, how it was picked, the packed
    weights' sha256."""
    src, dest = Path(study_dir), Path(dest)
    picked = None
    if winner == "auto":
        picked = best_final_here(src)
        winner = picked[0] if picked else None
    (dest / "runs").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "study.json", dest / "study.json")
    if (src / WEAK_SELECTION).is_file():  # the weak arms' pick (a later session reuses it)
        shutil.copyfile(src / WEAK_SELECTION, dest / WEAK_SELECTION)
    copied = []
    for run in sorted((src / "runs").glob("*")):
        files = [f for f in RUN_FILES if (run / f).is_file()]
        if not files:
            continue
        (dest / "runs" / run.name).mkdir(exist_ok=True)
        for f in files:
            shutil.copyfile(run / f, dest / "runs" / run.name / f)
        copied.append(run.name)
    copy_references(src, dest)
    packed = None
    if winner and (src / "runs" / winner / "final").is_dir():
        from eagle3lab.train.checkpoints import pack_drafter  # lazy: loads torch

        facts = pack_drafter(src / "runs" / winner / "final", dest / "winner")
        atomic_write_json(dest / "winner" / WINNER_RECORD, {
            "format": WINNER_FORMAT, "version": 1, "run": winner,
            "picked": "auto" if picked else "named",
            "setting": picked[1] if picked else None, "tau": picked[2] if picked else None,
            "model_sha256": facts["sha256"], "params": facts["params"]})
        packed = str(dest / "winner")
    return {"runs": copied, "dest": str(dest), "winner": packed, "winner_run": winner,
            "winner_setting": picked[1] if picked else None,
            "winner_tau": picked[2] if picked else None}
