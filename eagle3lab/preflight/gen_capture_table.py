"""Generate the engines' aux-capture support tables from their own source.

Prevents the failure that motivated preflight: a target whose model class in the serving
engine build never captures aux hidden states. SGLang 0.5.23 refuses to start then
(`configure_aux_hidden_state_capture` in
srt/model_executor/model_runner_components/attention_backend_setup.py raises "does not
implement set_eagle3_layers_to_capture"), and so does vLLM 0.25.1
(vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:18-19 and
vllm/v1/worker/gpu_model_runner.py:5387-5391 raise RuntimeError "Model does not support
EAGLE3 interface"); SGLang builds without that check served the last layer's state alone,
so the drafter's fc was bypassed and accept length stayed at 1.00. Which classes capture is
read here, never hand-copied; every module is parsed with `ast` (nothing is imported, so
this runs on a CPU machine where those modules do not import):

- SGLang (`sglang/srt/models/*.py`): a class captures when it defines
  `set_eagle3_layers_to_capture` or inherits it (bases are resolved across modules through
  each file's imports); a definition whose body only raises does not count; one that calls
  `self.<attr>.set_eagle3_layers_to_capture` is a wrapper that forwards it (multimodal
  wrappers over their language model). Architectures are the names SGLang's registry
  serves: the classes in each file's `EntryClass` (srt/models/registry.py registers them
  under `cls.__name__`).
- vLLM (`vllm/model_executor/models/**.py` and `vllm/models/**.py`): a class captures when
  `SupportsEagle3` (vllm/model_executor/models/interfaces.py, a runtime-checkable protocol
  that `supports_eagle3` tests with isinstance) is among its bases or its bases' bases,
  resolved across modules and packages (a package's `__init__.py` that picks a platform's
  implementation in an if/elif/else is read for CUDA, the H200's platform: the branch
  whose condition is not a ROCm/XPU/CPU/TPU test). Architectures are the keys of
  vllm/model_executor/models/registry.py's `_VLLM_MODELS` (the dicts it merges, in its
  order, without `_SPECULATIVE_DECODING_MODELS`, which lists drafters, not targets),
  each mapped to its (module, class) as the registry maps it.

`python -m eagle3lab.preflight.gen_capture_table` rewrites capture_tables/sglang-VERSION.json
from the installed sglang; `... --engine vllm --source DIR/vllm` writes
capture_tables/vllm-VERSION.json from a vLLM source tree (a wheel's files unpacked: vLLM
does not install on this CPU machine). tests/preflight/test_capture_tables.py regenerates
the SGLang table from the installed sglang, and the vLLM table where a vLLM source tree is
found, and fails on drift.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from eagle3lab.errors import UserError
from eagle3lab.fsutil import atomic_write_json

METHOD = "set_eagle3_layers_to_capture"
VLLM_PROTOCOL = "SupportsEagle3"
TABLE_DIR = Path(__file__).with_name("capture_tables")
#: The registry dicts of vLLM that list drafters, not targets.
VLLM_SKIPPED_REGISTRIES = ("_SPECULATIVE_DECODING_MODELS",)


def sglang_models_dir() -> Path:
    """The installed sglang's srt/models directory (UserError when sglang is absent)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("sglang is not installed: the SGLang capture table is generated from "
                        "its source (pip install sglang==0.5.23 --no-deps).")
    return Path(list(spec.submodule_search_locations)[0]) / "srt" / "models"


class _Module:
    """One parsed model file: its classes (bases, capture method kind), imports, aliases,
    EntryClass, and its top-level dict literals (vLLM's registry). Statements under a
    top-level try are read, and under a top-level if the branch a CUDA machine runs
    (`_cuda_branch`); later bindings win."""

    def __init__(self, name: str, tree: ast.Module, *, package: bool = False):
        self.name = name
        self.package = package  # an __init__.py: relative imports start at the package
        self.classes: dict[str, dict[str, Any]] = {}
        self.imports: dict[str, tuple[str, str]] = {}  # local name -> (module, name)
        self.aliases: dict[str, str] = {}  # module-level `A = B`
        self.entry: list[str] = []
        self.dicts: dict[str, ast.expr] = {}  # module-level `NAME = {...}`
        self._read(tree.body)

    def _read(self, body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.ImportFrom):
                mod = _absolute(self.name, node.module, node.level, self.package)
                for a in node.names:
                    self.imports[a.asname or a.name] = (mod, a.name)
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = {"bases": [_base_name(b) for b in node.bases],
                                           "method": _method_kind(node)}
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                self._assign(node)
            elif isinstance(node, ast.If):
                branch = _cuda_branch(node.test)
                if branch != "orelse":
                    self._read(node.body)
                if branch != "body":
                    self._read(node.orelse)
            elif isinstance(node, ast.Try):
                self._read(node.body)

    def _assign(self, node: ast.Assign | ast.AnnAssign) -> None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if len(targets) != 1 or not isinstance(targets[0], ast.Name) or node.value is None:
            return
        target = targets[0].id
        if target == "EntryClass":
            self.entry = _names(node.value)
        elif isinstance(node.value, ast.Name):
            self.aliases[target] = node.value.id
        elif isinstance(node.value, ast.Dict):
            self.dicts[target] = node.value


#: Platform tests of vLLM's hardware-isolated packages (vllm/models/deepseek_v4/__init__.py,
#: vllm/models/minimax_m3/__init__.py) that are false on a CUDA GPU.
_OTHER_PLATFORMS = ("is_rocm", "is_xpu", "is_cpu", "is_tpu")


def _cuda_branch(test: ast.expr) -> str:
    """Which branch of a module-level `if` runs on a CUDA GPU: "body", "orelse", or "both"
    (not a platform test: both are read in source order)."""
    src = ast.unparse(test)
    if "is_cuda" in src:
        return "orelse" if "not " in src else "body"
    if any(p in src for p in _OTHER_PLATFORMS):
        return "body" if "not " in src else "orelse"
    return "both"


def _absolute(module: str, name: str | None, level: int, package: bool = False) -> str:
    if not level:
        return name or ""
    parts = module.split(".")
    parts = parts[:len(parts) - level + (1 if package else 0)]
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


#: hit(module name, class name, class record) -> what made the class capture, or None.
Hit = Callable[[str, str, dict[str, Any]], "dict[str, Any] | None"]


class _Source:
    """The parsed modules of a source tree; names resolved across imports and aliases."""

    def __init__(self, modules: dict[str, _Module]):
        self.modules = modules

    def find(self, mod: str, name: str, hit: Hit, seen: frozenset = frozenset()
             ) -> dict[str, Any] | None:
        """What `hit` says for `name` (as seen from module `mod`) or the first of its bases
        (depth first, in base order) it says something for; None: nothing (bases outside
        the tree count as nothing)."""
        key = (mod, name)
        if key in seen or mod not in self.modules:
            return None
        m = self.modules[mod]
        if name in m.aliases:
            return self.find(mod, m.aliases[name], hit, seen | {key})
        if name in m.imports:
            return self.find(*m.imports[name], hit, seen | {key})
        cls = m.classes.get(name)
        if cls is None:
            return None
        got = hit(mod, name, cls)
        if got is not None:
            return got
        for base in cls["bases"]:
            if base:
                got = self.find(mod, base, hit, seen | {key})
                if got is not None:
                    return got
        return None

    def defining(self, mod: str, name: str, depth: int = 0) -> tuple[str, str]:
        """(module, class name) where `name` is defined: the registries serve
        `cls.__name__`, so an alias or an imported class is listed under its own name."""
        m = self.modules.get(mod)
        if m is None or depth > 20 or name in m.classes:
            return mod, name
        if name in m.aliases:
            return self.defining(mod, m.aliases[name], depth + 1)
        if name in m.imports:
            return self.defining(*m.imports[name], depth + 1)
        return mod, name


def _parse_tree(root: Path, package: str, *, recursive: bool) -> dict[str, _Module]:
    """Every parseable .py under root as `package.dotted.path` (an __init__.py is its
    package)."""
    modules: dict[str, _Module] = {}
    for f in sorted(root.rglob("*.py") if recursive else root.glob("*.py")):
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"), filename=str(f))
        except (SyntaxError, UnicodeDecodeError):
            continue
        rel = f.relative_to(root).with_suffix("").parts
        is_init = rel[-1] == "__init__"
        name = ".".join((package,) + (rel[:-1] if is_init else rel))
        modules[name] = _Module(name, tree, package=is_init)
    return modules


def _sglang_hit(mod: str, name: str, cls: dict[str, Any]) -> dict[str, Any] | None:
    return {"class": name, "module": mod, **cls["method"]} if cls["method"] else None


def scan(models_dir: str | Path, *, package: str = "sglang.srt.models") -> dict[str, Any]:
    """SGLang: {architecture: entry} for every EntryClass of every module under models_dir."""
    src = _Source(_parse_tree(Path(models_dir), package, recursive=False))
    out: dict[str, Any] = {}
    for mod_entry, m in src.modules.items():
        for name in m.entry:
            mod, arch = src.defining(mod_entry, name)
            got = src.find(mod, arch, _sglang_hit)
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
    """The full SGLang table document (version, method, sizes, architectures)."""
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


# --- vLLM -----------------------------------------------------------------------------

def _vllm_file(module: str) -> str:
    """vllm.a.b -> vllm/a/b.py, or vllm/a/b/__init__.py for a package (as parsed)."""
    return module.replace(".", "/")


def _vllm_hit(mod: str, name: str, cls: dict[str, Any]) -> dict[str, Any] | None:
    return {"class": name, "module": mod} if VLLM_PROTOCOL in cls["bases"] else None


def vllm_registry(src: _Source) -> dict[str, tuple[str, str, str]]:
    """{architecture: (module, class, registry dict)} as `_VLLM_MODELS` merges them."""
    reg = src.modules.get("vllm.model_executor.models.registry")
    if reg is None or "_VLLM_MODELS" not in reg.dicts:
        raise ValueError("vllm/model_executor/models/registry.py has no _VLLM_MODELS dict")
    out: dict[str, tuple[str, str, str]] = {}
    for key, value in zip(reg.dicts["_VLLM_MODELS"].keys, reg.dicts["_VLLM_MODELS"].values):
        if key is not None or not isinstance(value, ast.Name) or \
                value.id in VLLM_SKIPPED_REGISTRIES or value.id not in reg.dicts:
            continue
        part = reg.dicts[value.id]
        for k, v in zip(part.keys, part.values):
            if isinstance(k, ast.Constant) and isinstance(v, ast.Tuple) and \
                    len(v.elts) == 2 and all(isinstance(e, ast.Constant) for e in v.elts):
                mod, cls = (e.value for e in v.elts)
                mod = mod if mod.startswith("vllm.") else f"vllm.model_executor.models.{mod}"
                out[k.value] = (mod, cls, value.id)
    return out


def _vllm_module_file(src: _Source, module: str) -> str:
    m = src.modules.get(module)
    return _vllm_file(module) + ("/__init__.py" if m is not None and m.package else ".py")


def scan_vllm(vllm_dir: str | Path) -> dict[str, Any]:
    """vLLM: {architecture: entry} for every target architecture of the registry."""
    vllm_dir = Path(vllm_dir)
    modules: dict[str, _Module] = {}
    for sub in ("model_executor/models", "models"):
        if (vllm_dir / sub).is_dir():
            modules.update(_parse_tree(vllm_dir / sub, "vllm." + sub.replace("/", "."),
                                       recursive=True))
    src = _Source(modules)
    out: dict[str, Any] = {}
    for arch, (mod, cls, group) in vllm_registry(src).items():
        dmod, dcls = src.defining(mod, cls)
        got = src.find(dmod, dcls, _vllm_hit)
        entry: dict[str, Any] = {"capture": got is not None,
                                 "source": _vllm_module_file(src, dmod), "class": dcls,
                                 "registry": group}
        if dmod not in modules:
            entry["note"] = "module not found in the source tree read"
        if got is not None:
            entry["via"] = (f"{VLLM_PROTOCOL} in the bases of {got['class']} "
                            f"({_vllm_module_file(src, got['module'])})")
        out[arch] = entry
    return dict(sorted(out.items()))


def vllm_source_version(vllm_dir: Path) -> str:
    """The version of a vLLM source tree: its _version.py, else the installed vllm's."""
    f = vllm_dir / "_version.py"
    if f.is_file():
        m = re.search(r"^__version__\s*=\s*version\s*=\s*['\"]([^'\"]+)['\"]|"
                      r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read_text(), re.M)
        if m:
            return m.group(1) or m.group(2)
    return metadata.version("vllm")


def build_vllm_table(vllm_dir: str | Path, *, version: str | None = None) -> dict[str, Any]:
    """The full vLLM table document, read from a vLLM source tree (the package directory)."""
    vllm_dir = Path(vllm_dir)
    version = version or vllm_source_version(vllm_dir)
    archs = scan_vllm(vllm_dir)
    n_yes = sum(e["capture"] for e in archs.values())
    return {
        "engine": "vllm", "version": version,
        "generated_by": "python -m eagle3lab.preflight.gen_capture_table --engine vllm "
                        "--source DIR/vllm",
        "method": f"{VLLM_PROTOCOL} (vllm/model_executor/models/interfaces.py: "
                  "supports_eagle3, set_aux_hidden_state_layers, "
                  "get_eagle3_default_aux_hidden_state_layers)",
        "source_root": "vllm/model_executor/models, vllm/models; architectures from "
                       "vllm/model_executor/models/registry.py _VLLM_MODELS (without "
                       "_SPECULATIVE_DECODING_MODELS)",
        "absent_behaviour": "vLLM refuses to start: RuntimeError 'Model does not support "
                            "EAGLE3 interface' (vllm/v1/worker/gpu/spec_decode/eagle/"
                            "eagle3_utils.py set_eagle3_aux_hidden_state_layers, the V2 "
                            "model runner; vllm/v1/worker/gpu_model_runner.py "
                            "_setup_eagle3_aux_hidden_state_outputs, the V1 runner)",
        "aux_ids": "explicit ids: the draft config's top-level "
                   "eagle_aux_hidden_state_layer_ids, not shifted (id k = the input of "
                   "decoder layer k, k = N the last layer's output: "
                   "vllm/model_executor/models/llama.py LlamaModel.forward, "
                   "interfaces.py EagleModelMixin._maybe_add_hidden_state); the V1 runner "
                   "(vllm/v1/worker/gpu_model_runner.py _get_eagle3_aux_layers_from_config) "
                   "also falls back to eagle_config.eagle_aux_hidden_state_layer_ids, the V2 "
                   "runner (eagle3_utils.get_eagle3_aux_layers_from_config) does not; "
                   "without ids the target's get_eagle3_default_aux_hidden_state_layers(): "
                   "(2, N//2, N-3)",
        "counts": {"with_capture": n_yes, "without_capture": len(archs) - n_yes},
        "architectures": archs,
    }


def table_path(version: str, engine: str = "sglang") -> Path:
    return TABLE_DIR / f"{engine}-{version}.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eagle3lab.preflight.gen_capture_table",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=("sglang", "vllm"), default="sglang")
    p.add_argument("--models-dir", default=None,
                   help="SGLang: default: the installed sglang's srt/models")
    p.add_argument("--source", default=None,
                   help="vLLM: the vllm package directory of a source tree or unpacked "
                   "wheel (required for --engine vllm)")
    p.add_argument("--version", default=None, help="default: read from the source")
    p.add_argument("--out", default=None, help="default: capture_tables/ENGINE-VERSION.json")
    args = p.parse_args(argv)
    if args.engine == "vllm":
        if not args.source:
            p.error("--engine vllm needs --source DIR/vllm")
        table = build_vllm_table(args.source, version=args.version)
    else:
        table = build_table(args.models_dir, version=args.version)
    out = Path(args.out) if args.out else table_path(table["version"], table["engine"])
    atomic_write_json(out, table)
    print(f"{out}: {table['counts']['with_capture']} architectures with capture, "
          f"{table['counts']['without_capture']} without ({table['engine']} "
          f"{table['version']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
