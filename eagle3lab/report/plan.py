"""The batch report's plan: pipeline order, dependencies and wiring, as data.

Prevents two failures of a batch run: one failing notebook taking down the whole run
(each step names what it needs, so a failure skips only its dependents), and notebooks that
silently compute on their own demo data instead of the pipeline's (the wiring table hands
every notebook the work-dir paths of the stages it shows; a wired parameter a notebook does
not declare is reported, never dropped silently).

A step is either a library stage (eagle3lab.report.pipeline.STAGES; reused when complete) or a
notebook in notebooks/. `locked` parameters are derived from the pipeline (work dir, target,
the report's own directory) and may not be overridden in a parameters file; `soft` ones are
defaults that `common:` or a notebook's section may override. Placeholders
(`wiring_context`): {work} (the pipeline's work dir) and each path of its layout by its
`eagle3lab.workdir.WorkDir` name ({shards_train}, {train_run}, {final}, {sglang_copy},
{studies}, ...), {target}, {device}, {out} (this report's directory), {scratch} (a
temporary directory removed when the report ends: for measurements that must be fresh),
{default_drafter} (`eagle3lab.workdir.default_drafter`: the drafter shipped in
data/drafters/TARGET, else the one the pipeline trains).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from eagle3lab.config import repo_root
from eagle3lab.errors import UserError
from eagle3lab.workdir import WorkDir, default_drafter


@dataclasses.dataclass(frozen=True)
class Step:
    name: str  # stage name (pipeline.STAGES) or notebook file stem
    kind: Literal["stage", "notebook"]
    deps: tuple[str, ...] = ()  # steps that must have succeeded first
    locked: dict[str, Any] = dataclasses.field(default_factory=dict)  # derived, not overridable
    soft: dict[str, Any] = dataclasses.field(default_factory=dict)  # derived defaults
    about: str = ""  # one line for the index


#: The pipeline in order. Notebooks not yet present in notebooks/ are reported as missing.
PLAN: list[Step] = [
    Step("target", "stage", about="prepare (convert + verify) the target once"),
    Step("data", "stage", ("target",),
         about="regenerate train/eval responses, extract shards, build the draft vocab map"),
    Step("01_extract", "notebook", ("target",),
         locked={"out_dir": "{scratch}/01_extract", "target": "{target}"},
         about="regenerate + extract at small size, measured afresh: tokens/s, bytes/token"),
    Step("train", "stage", ("data",), about="train the drafter on the train shards"),
    Step("02_training_curves", "notebook", ("train",),
         locked={"run_dirs": ["{train_run}"]}, soft={"names": ["pipeline drafter"],
         # beside it, the shipped drafter's own (H200) curve: a real plateau and gap
         "reference_runs": ["{default_drafter}"],
         "reference_names": ["shipped default drafter, own eval split"]},
         about="plateau and train/eval gap beside the shipped drafter's run; loss and "
               "accuracy per TTT position"),
    Step("convert", "stage", ("train",), about="convert the drafter to SGLang's format"),
    Step("03_inspect_checkpoint", "notebook", ("convert",),
         locked={"checkpoint": "{sglang_copy}", "target": "{target}"},
         soft={"engine": "sglang", "second_checkpoint": "{final}",
               "token_counts": "{shards_train}"},
         about="checkpoint doctor on the converted drafter, diff against the original"),
    Step("05_acceptance", "notebook", ("train",),
         locked={"target": "{target}", "drafts": ["{default_drafter}", "{final}"]},
         about="offline acceptance: tau, per-position acceptance, speedup"),
    Step("04_live_server", "notebook", ("train",),
         locked={"target": "{target}", "draft": "{default_drafter}",
                 "run_dir": "{out}/04_live_server"},
         soft={"engine": "reference", "device": "{device}"},
         about="reference server with and without speculation"),
    Step("06_grokking_vs_data", "notebook", ("data",),
         locked={"train_data": "{shards_train}", "eval_data": "{shards_eval}",
                 "study_dir": "{studies}/grokking-vs-data"},
         soft={"device": "{device}", "demo": False},
         about="grokking vs more data at equal compute"),
]


def wiring_context(*, work: WorkDir, target: str, device: str, out: Path,
                   scratch: Path) -> dict[str, str]:
    """The placeholders' values for one report (see the module docstring)."""
    ctx = {name: str(path) for name, path in work.as_dict().items() if name != "root"}
    ctx.update(work=str(work.root), target=target, device=device, out=str(out),
               scratch=str(scratch),
               default_drafter=default_drafter(target, work=work) or str(work.final))
    return ctx


def fill(value: Any, ctx: dict[str, str]) -> Any:
    """Replace the {placeholders} in strings (recursively in lists)."""
    if isinstance(value, str):
        return value.format(**ctx)
    if isinstance(value, list):
        return [fill(v, ctx) for v in value]
    return value


def resolve_names(plan: list[Step], only: list[str] | None) -> list[str] | None:
    """Full step names for `only` entries (a unique prefix such as "02" is enough)."""
    if only is None:
        return None
    names = [s.name for s in plan]
    out = []
    for want in only:
        hits = [n for n in names if n == want] or [n for n in names if n.startswith(want)]
        if len(hits) != 1:
            raise UserError(f"--only {want!r} matches {len(hits)} steps "
                            f"({', '.join(hits) or 'none'}); steps: {', '.join(names)}.")
        out.append(hits[0])
    return out


def selected_steps(plan: list[Step], only: list[str] | None) -> set[str]:
    """Steps to run: all, or the named ones plus every stage they need (stages are cheap
    to re-check; notebooks not named are not run)."""
    names = resolve_names(plan, only)
    if names is None:
        return {s.name for s in plan}
    by_name = {s.name: s for s in plan}
    chosen, todo = set(), list(names)
    while todo:
        n = todo.pop()
        if n in chosen:
            continue
        chosen.add(n)
        todo += [d for d in by_name[n].deps if by_name[d].kind == "stage"]
    return chosen


def check_plan(plan: list[Step]) -> None:
    """Names unique; every dependency is an earlier step."""
    seen: set[str] = set()
    for s in plan:
        if s.name in seen:
            raise ValueError(f"plan: step {s.name!r} appears twice")
        bad = [d for d in s.deps if d not in seen]
        if bad:
            raise ValueError(f"plan: {s.name} depends on {bad}, which are not earlier steps")
        seen.add(s.name)


def notebook_path(notebooks_dir: Path, name: str) -> Path:
    return Path(notebooks_dir) / f"{name}.ipynb"


def checkout_inputs(command: str, *, notebooks_dir: str | Path | None = None,
                    default_params: str | Path | None = None) -> Path:
    """The notebooks directory a report runs: `notebooks_dir`, else the checkout's
    notebooks/. The notebooks, the parameters files (params/) and the shipped prompts
    (data/prompts/) live in the repository checkout, not in the installed package, so an
    installed `eagle3lab report` or `demo` run outside a checkout gets one UserError line
    saying so (instead of a report in which every notebook is "missing"); so does a
    --notebooks directory that does not exist. default_params: the parameters file used when
    none is named (demo's params/cpu-demo.yaml), checked the same way."""
    if notebooks_dir is not None and not Path(notebooks_dir).is_dir():
        raise UserError(f"--notebooks {notebooks_dir}: no such directory (it holds the "
                        f"NN_name.ipynb notebooks the report runs).")
    nb = Path(notebooks_dir) if notebooks_dir is not None else repo_root() / "notebooks"
    missing = [str(p) for p in (nb, default_params) if p is not None and not Path(p).exists()]
    if missing:
        names = "--notebooks DIR" + (" and --params FILE" if default_params else "")
        raise UserError(f"eagle3lab {command} needs the repository checkout: "
                        f"{' and '.join(missing)} not found (the notebooks, params/*.yaml "
                        f"and data/prompts/ are not part of the installed package); run it "
                        f"from the root of an eagle3lab checkout, or pass {names}.")
    return nb
