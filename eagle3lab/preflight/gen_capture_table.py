"""Generate SGLang's aux-capture support table from the installed sglang's own source.

Prevents the failure that motivated preflight: a target whose model class in the serving
SGLang build never captures aux hidden states. SGLang 0.5.23 refuses to start then
(`configure_aux_hidden_state_capture` in
srt/model_executor/model_runner_components/attention_backend_setup.py raises "does not
implement set_eagle3_layers_to_capture"); builds without that check served the last layer's
state alone, so the drafter's fc was bypassed and accept length stayed at 1.00. Which
classes capture is read here, never hand-copied:

- every module of `sglang/srt/models/` is parsed with `ast` (nothing is imported, so this
  runs on a CPU machine where those modules do not import);
- a class captures when it defines `set_eagle3_layers_to_capture` or inherits it (bases are
  resolved across modules through each file's imports); a definition whose body only
  raises does not count; one that calls `self.<attr>.set_eagle3_layers_to_capture` is a
  wrapper that forwards it (multimodal wrappers over their language model);
- architectures are the names SGLang's registry serves: the classes in each file's
  `EntryClass` (srt/models/registry.py registers them under `cls.__name__`).

Run `python -m eagle3lab.preflight.gen_capture_table` to rewrite the committed table
(capture_tables/sglang-VERSION.json); tests/preflight/test_capture_tables.py regenerates it
from the installed sglang and fails on drift.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
from importlib import metadata
from pathlib import Path
from typing import Any

METHOD = "set_eagle3_layers_to_capture"
TABLE_DIR = Path(__file__).with_name("capture_tables")


def sglang_models_dir() -> Path:
    """The installed sglang's srt/models directory (UserError when sglang is absent)."""
    from eagle3lab.errors import UserError

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("sglang is not installed: the SGLang capture table is generated from "
                        "its source (pip install sglang==0.5.23 --no-deps).")
    return Path(list(spec.submodule_search_locations)[0]) / "srt" / "models"


class _Module:
    """One parsed model file: its classes (bases, capture method kind), imports, EntryClass."""

    def __init__(self, name: str, tree: ast.Module):
        self.name = name
        self.classes: dict[str, dict[str, Any]] = {}
        self.imports: dict[str, tuple[str, str]] = {}  # local name -> (module, name)
        self.aliases: dict[str, str] = {}  # module-level `A = B`
        self.entry: list[str] = []
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                mod = _absolute(name, node.module, node.level)
                for a in node.names:
                    self.imports[a.asname or a.name] = (mod, a.name)
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = {"bases": [_base_name(b) for b in node.bases],
                                           "method": _method_kind(node)}
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                    isinstance(node.targets[0], ast.Name):
                target = node.targets[0].id
                if target == "EntryClass":
                    self.entry = _names(node.value)
                elif isinstance(node.value, ast.Name):
                    self.aliases[target] = node.value.id


def _absolute(module: str, name: str | None, level: int) -> str:
    if not level:
        return name or ""
    parts = module.split(".")[:-level]
    return ".".join(parts + ([name] if name else []))


def _base_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):  # Generic[...] and the like
        return _base_name(node.value)
    return None


def _names(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [n for e in node.elts for n in _names(e)]
    if isinstance(node, ast.BinOp):  # EntryClass = [A] + [B]
        return _names(node.left) + _names(node.right)
    return []


def _method_kind(cls: ast.ClassDef) -> dict[str, Any] | None:
    """None: not defined here; else {"kind": "implements"|"forwards"|"raises", "to"}."""
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == METHOD:
            body = [n for n in node.body if not (isinstance(n, ast.Expr) and isinstance(
                getattr(n, "value", None), ast.Constant))]
            if body and all(isinstance(n, ast.Raise) for n in body):
                return {"kind": "raises", "to": None}
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and \
                        sub.func.attr == METHOD:
                    return {"kind": "forwards", "to": ast.unparse(sub.func.value)}
            return {"kind": "implements", "to": None}
    return None


def scan(models_dir: str | Path, *, package: str = "sglang.srt.models") -> dict[str, Any]:
    """{architecture: entry} for every EntryClass of every module under models_dir."""
    models_dir = Path(models_dir)
    modules: dict[str, _Module] = {}
    for f in sorted(models_dir.glob("*.py")):
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"), filename=str(f))
        except SyntaxError:
            continue
        modules[f"{package}.{f.stem}"] = _Module(f"{package}.{f.stem}", tree)

    def resolve(mod: str, name: str, seen: frozenset = frozenset()) -> dict[str, Any] | None:
        """Where `name` (as seen from module `mod`) gets the method: {"class", "module",
        "kind", "to"} or None (no capture); unknown bases (outside srt/models) -> None."""
        key = (mod, name)
        if key in seen or mod not in modules:
            return None
        m = modules[mod]
        if name in m.aliases:
            return resolve(mod, m.aliases[name], seen | {key})
        if name in m.imports:
            src_mod, src_name = m.imports[name]
            return resolve(src_mod, src_name, seen | {key})
        cls = m.classes.get(name)
        if cls is None:
            return None
        if cls["method"] is not None:
            return {"class": name, "module": mod, **cls["method"]}
        for base in cls["bases"]:
            if base:
                got = resolve(mod, base, seen | {key})
                if got is not None:
                    return got
        return None

    def defining(mod: str, name: str, depth: int = 0) -> tuple[str, str]:
        """(module, class name) where `name` is defined: the registry serves
        `cls.__name__`, so an alias or an imported class is listed under its own name."""
        m = modules.get(mod)
        if m is None or depth > 20 or name in m.classes:
            return mod, name
        if name in m.aliases:
            return defining(mod, m.aliases[name], depth + 1)
        if name in m.imports:
            return defining(*m.imports[name], depth + 1)
        return mod, name

    out: dict[str, Any] = {}
    for mod_entry, m in modules.items():
        for name in m.entry:
            mod, arch = defining(mod_entry, name)
            got = resolve(mod, arch)
            capture = got is not None and got["kind"] != "raises"
            file = "sglang/srt/models/" + mod_entry.rsplit(".", 1)[1] + ".py"
            entry: dict[str, Any] = {"capture": capture, "source": file}
            if got is not None:
                where = "sglang/srt/models/" + got["module"].rsplit(".", 1)[1] + ".py"
                entry["via"] = (f"{got['kind']} in {got['class']} ({where})"
                                + (f", to {got['to']}" if got["to"] else ""))
            out[arch] = entry
    return dict(sorted(out.items()))


def build_table(models_dir: str | Path | None = None, *, version: str | None = None
                ) -> dict[str, Any]:
    """The full table document (version, method, sizes, architectures)."""
    models_dir = Path(models_dir) if models_dir else sglang_models_dir()
    version = version or metadata.version("sglang")
    archs = scan(models_dir)
    n_yes = sum(e["capture"] for e in archs.values())
    return {
        "engine": "sglang", "version": version,
        "generated_by": "python -m eagle3lab.preflight.gen_capture_table",
        "method": METHOD, "source_root": "sglang/srt/models",
        "absent_behaviour": "SGLang refuses to start: ValueError 'Model ... does not "
                            "implement set_eagle3_layers_to_capture' (srt/model_executor/"
                            "model_runner_components/attention_backend_setup.py, "
                            "configure_aux_hidden_state_capture)",
        "counts": {"with_capture": n_yes, "without_capture": len(archs) - n_yes},
        "architectures": archs,
    }


def table_path(version: str) -> Path:
    return TABLE_DIR / f"sglang-{version}.json"


def main(argv: list[str] | None = None) -> int:
    from eagle3lab.fsutil import atomic_write_json

    p = argparse.ArgumentParser(prog="python -m eagle3lab.preflight.gen_capture_table",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--models-dir", default=None, help="default: the installed sglang's")
    p.add_argument("--version", default=None, help="default: the installed sglang's")
    p.add_argument("--out", default=None, help="default: capture_tables/sglang-VERSION.json")
    args = p.parse_args(argv)
    table = build_table(args.models_dir, version=args.version)
    out = Path(args.out) if args.out else table_path(table["version"])
    atomic_write_json(out, table)
    print(f"{out}: {table['counts']['with_capture']} architectures with capture, "
          f"{table['counts']['without_capture']} without (sglang {table['version']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
