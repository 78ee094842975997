"""Parameters files of the batch report (params/*.yaml): load, check, resolve per notebook.

Prevents a typo in a parameters file from being ignored while a long batch run computes the
wrong thing: an unknown section, a parameter a notebook does not declare (papermill's own
`inspect_notebook`, what `papermill --help-notebook` lists), a value of the wrong type, or
an override of a parameter the report derives from the pipeline is refused before anything
runs, naming the section, the key and what is allowed.

File layout:
  report:   {description: str, timeout_s: number}   optional
  pipeline: PipelineConfig fields (work_dir, target, sizes, train: {TrainConfig fields})
  common:   {param: value}  passed to every notebook that declares `param`
  NOTEBOOK: {param: value}  one section per notebook name (e.g. 05_acceptance)
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from eagle3lab.config import StrictConfig
from eagle3lab.errors import UserError
from eagle3lab.report.pipeline import PipelineConfig
from eagle3lab.report.plan import Step, fill

#: The type names papermill's `inspect_notebook` gives for annotated parameters that are
#: checked; any other name (e.g. "None": not annotated) is not checked.
_DECLARED_TYPES: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool,
                                    "list": list, "dict": dict}


class ReportSection(StrictConfig):
    """The parameters file's `report:` section."""

    WHERE: ClassVar[str] = "report"

    description: str = Field("", description="shown at the top of index.html")
    timeout_s: float | None = Field(None, description="execution timeout per notebook cell, "
                                    "in seconds (--timeout overrides it)")


@dataclasses.dataclass
class ReportParams:
    source: str  # the file it came from ("" for a dict)
    raw: dict[str, Any]  # the file's content, as read
    pipeline: PipelineConfig
    common: dict[str, Any]
    sections: dict[str, dict[str, Any]]  # notebook name -> its parameters
    description: str = ""
    timeout_s: float | None = None


def load_params(params: str | Path | dict | None) -> tuple[dict[str, Any], str]:
    """The raw mapping of a parameters file (or a dict given directly) and its source."""
    if params is None:
        return {}, ""
    if isinstance(params, dict):
        return params, ""
    import yaml

    path = Path(params)
    if not path.is_file():
        raise UserError(f"Parameters file {str(path)!r} does not exist (see params/*.yaml).")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a mapping of sections, found {type(raw).__name__}.")
    return raw, str(path)


@functools.cache
def _declared_type(type_name: str) -> TypeAdapter | None:
    """A strict validator of one declared parameter type (as `StrictConfig` checks fields:
    "8" is not an int, True is not a number, 1 is a float); None for a name not checked."""
    tp = _DECLARED_TYPES.get(type_name)
    return None if tp is None else TypeAdapter(tp, config=ConfigDict(strict=True))


def parse_params(params: str | Path | dict | None, plan: list[Step],
                 declared: dict[str, dict[str, dict] | None]) -> ReportParams:
    """Check a parameters file against the plan and each notebook's declared parameters
    (`declared[name]` is papermill.inspect_notebook's answer, None for a missing notebook).
    All problems are reported together."""
    raw, source = load_params(params)
    where = source or "parameters"
    notebooks = [s for s in plan if s.kind == "notebook"]
    nb_names = [s.name for s in notebooks]
    errors: list[str] = []
    for key in raw:
        if key not in ("report", "pipeline", "common") and key not in nb_names:
            errors.append(f"unknown section {key!r}; sections are report, pipeline, common "
                          f"and the notebooks {', '.join(nb_names)}")
    sections: dict[str, dict[str, Any]] = {}
    for key in ["report", "common", *nb_names]:
        val = raw.get(key)
        if val is not None and not isinstance(val, dict):
            errors.append(f"section {key!r} must be a mapping of parameters, found "
                          f"{type(val).__name__}")
        sections[key] = dict(val) if isinstance(val, dict) else {}
    report = ReportSection()
    try:
        report = ReportSection.from_dict(sections.pop("report"))
    except UserError as e:
        errors.append(str(e).rstrip("."))
    pipeline = None
    try:
        pipeline = PipelineConfig.from_dict(raw.get("pipeline"), "pipeline")
    except UserError as e:
        errors.append(str(e).rstrip("."))
    common = sections.pop("common")
    for k, v in common.items():
        users = [s.name for s in notebooks if declared.get(s.name) and k in declared[s.name]]
        locked = [s.name for s in notebooks if s.name in users and k in s.locked]
        if not users:
            present = [n for n in nb_names if declared.get(n) is not None]
            errors.append(f"common.{k}: no notebook declares this parameter (checked "
                          f"{', '.join(present) or 'none present'}); put it in a notebook's "
                          f"section or fix the name")
        elif locked:
            errors.append(f"common.{k}: the report sets {k} for {', '.join(locked)} from the "
                          f"pipeline section ({_origin(k, plan)}); set it there instead")
        else:
            for n in users:
                _check_type(errors, f"common.{k}", v, declared[n][k], n)
    for step in notebooks:
        decl = declared.get(step.name)
        for k, v in sections[step.name].items():
            if decl is None:
                continue  # a notebook that is not there yet: reported as missing
            if k not in decl:
                errors.append(f"{step.name}.{k}: not a parameter of {step.name}.ipynb (its "
                              f"parameters: {', '.join(decl) or 'none'})")
            elif k in step.locked:
                errors.append(f"{step.name}.{k}: set by the report from the pipeline section "
                              f"({_origin(k, plan)}); it cannot be overridden here")
            else:
                _check_type(errors, f"{step.name}.{k}", v, decl[k], step.name)
    if errors:
        raise UserError(f"{where}: " + "; ".join(errors) + ". `papermill --help-notebook "
                        "notebooks/NAME.ipynb` lists a notebook's parameters.")
    assert pipeline is not None
    return ReportParams(source=source, raw=raw, pipeline=pipeline, common=common,
                        sections={n: sections[n] for n in nb_names},
                        description=report.description, timeout_s=report.timeout_s)


def _origin(key: str, plan: list[Step]) -> str:
    vals = {str(s.locked[key]) for s in plan if key in s.locked}
    return "derived as " + " / ".join(sorted(vals)) + " from pipeline.work_dir/target"


def _check_type(errors: list[str], where: str, value: Any, decl: dict, nb: str) -> None:
    t = decl.get("inferred_type_name") or ""
    adapter = _declared_type(t)
    if adapter is None:
        return
    try:
        adapter.validate_python(value)
    except ValidationError:
        errors.append(f"{where}: {value!r} ({type(value).__name__}) but {nb} declares "
                      f"{decl['name']}: {t}")


def notebook_parameters(step: Step, rp: ReportParams, decl: dict[str, dict],
                        ctx: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """The parameters papermill passes to one notebook (only ones it declares), and notes
    about wired parameters it does not declare. Order: soft wiring < common < section <
    locked wiring."""
    params: dict[str, Any] = {}
    notes: list[str] = []
    for k, v in step.soft.items():
        if k in decl:
            params[k] = fill(v, ctx)
    params.update({k: v for k, v in rp.common.items() if k in decl})
    params.update(rp.sections.get(step.name, {}))
    for k, v in step.locked.items():
        if k in decl:
            params[k] = fill(v, ctx)
        else:
            notes.append(f"{step.name} does not declare the parameter {k!r}, so the pipeline's "
                         f"{fill(v, ctx)!r} was not passed; it ran with its own default")
    return params, notes
