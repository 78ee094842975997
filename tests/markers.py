"""Test markers that say the truth, checked rather than trusted (a pytest plugin that
tests/conftest.py loads).

Prevents `pytest -m "not real"` quietly converting the default target (a minute, and the
weights of a real model) and `-m "not slow"` quietly running notebooks:
- at collection, a test that uses the real default target (`default_target_dir`, also
  through its fixtures) and is not marked `real`, or that runs a notebook (papermill's
  `execute_notebook` or the report's `run_report`, in the test, its fixtures or the module
  helpers they call) and is not marked `slow`, stops the run naming it;
- while a test that is not marked `real` runs, the data root (EAGLE3LAB_DATA) is an empty
  directory and converting the default target fails the test, so one that reaches for the
  real model by its preset name fails instead of converting (or silently using) it.

Also prevents a test left out of `make test` (`-m "not full"`) that `-m "not slow"` still
runs: a test marked `full` (only in `make test-all` and CI) and not `slow` stops the run.
"""

from __future__ import annotations

import inspect

import pytest

#: Calls that execute notebooks.
NOTEBOOK_CALLS = ("execute_notebook(", "run_report(")


def _source(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _runs_notebooks(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    funcs = [item.function] + [d.func for defs in (info.name2fixturedefs.values() if info
                                                   else ()) for d in defs]
    for func in funcs:
        src = _source(func)
        module = inspect.getmodule(func)
        helpers = [obj for name, obj in vars(module).items() if inspect.isfunction(obj)
                   and obj is not func and obj.__module__ == module.__name__
                   and f"{name}(" in src] if module else []
        if any(call in s for s in [src] + [_source(h) for h in helpers]
               for call in NOTEBOOK_CALLS):
            return True
    return False


def marker_problems(items) -> list[str]:
    """One line per collected test whose markers do not say what it does."""
    problems = []
    for item in items:
        if not hasattr(item, "function"):
            continue
        if "default_target_dir" in item.fixturenames and not item.get_closest_marker("real"):
            problems.append(f"{item.nodeid}: uses the real default target "
                            f"(default_target_dir) but is not marked `real`")
        if _runs_notebooks(item) and not item.get_closest_marker("slow"):
            problems.append(f"{item.nodeid}: runs a notebook but is not marked `slow`")
        if item.get_closest_marker("full") and not item.get_closest_marker("slow"):
            problems.append(f"{item.nodeid}: marked `full` (too slow for `make test`) but "
                            f"not `slow`")
    return problems


def pytest_collection_modifyitems(config, items):
    problems = marker_problems(items)
    if problems:
        raise pytest.UsageError("Test markers that do not say the truth (tests/markers.py):\n"
                                + "\n".join(problems))


@pytest.fixture(autouse=True)
def real_target_only_when_marked(request, monkeypatch, tmp_path_factory):
    """Outside `real` tests: an empty data root, and no conversion of the default target."""
    if request.node.get_closest_marker("real"):
        return
    import eagle3lab.targets.default as default

    def refuse(*args, **kwargs):
        pytest.fail(f"{request.node.nodeid} is not marked `real` but converts or loads the "
                    f"real default target (prepare_target); mark it `real` or give it a tiny "
                    f"target.", pytrace=False)

    monkeypatch.setenv("EAGLE3LAB_DATA", str(tmp_path_factory.mktemp("empty-data-root")))
    monkeypatch.setattr(default, "prepare_target", refuse)
