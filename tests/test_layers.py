"""The package's import graph: no circles, no arrow up, own-module imports at the top.

Prevents the tangle issue 27 found: the launcher and preflight importing each other (a
circle hidden inside functions), preflight importing the CLI to parse a command (an arrow
up), and a file whose links are only visible by reading every function.
Every module under eagle3lab/ is parsed with `ast`, imports inside functions counted like
the others (`import eagle3lab.x`, `from eagle3lab.x import y`, relative imports,
`if TYPE_CHECKING:` blocks), and
1. no module imports itself back through others (each circle is named with its path),
2. no module imports a module of a higher layer (`LAYERS`, lowest first),
3. an own-module import inside a function needs a reason: the module it imports is heavy
   (loads torch, transformers, ... when imported, directly or through the modules it
   imports at its top), the line says `# lazy: <reason>`, or its package is in `LAZY_OK`.
4. the modules run as stand-alone scripts in another interpreter import the standard
   library only.

`python tests/test_layers.py [ROOT]` prints the layers and the reasonless function-level
imports per module. docs/ARCHITECTURE.md's layer list is written from `LAYERS`.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: The layers, lowest first. An entry names a module, or a package and everything under it;
#: a module belongs to the layer of its longest entry (the root package `eagle3lab` only to
#: its own entry). A module may import modules of its own layer and of lower ones.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("cross-cutting", ("eagle3lab", "eagle3lab.errors", "eagle3lab.config",
                       "eagle3lab.fsutil", "eagle3lab.distributed", "eagle3lab.asyncutil")),
    ("targets", ("eagle3lab.targets",)),
    ("data", ("eagle3lab.data",)),
    # the work-directory layout knows the shard format's file names (data.shards)
    ("workdir", ("eagle3lab.workdir",)),
    ("formats", ("eagle3lab.formats",)),
    ("train", ("eagle3lab.train",)),
    ("specdec", ("eagle3lab.specdec",)),
    # how each serving engine is started and which release: preflight and the launcher
    ("engines", ("eagle3lab.engines",)),
    # log reading (both engines' formats, the catalogue of known messages)
    ("serverlogs", ("eagle3lab.serverlogs",)),
    ("preflight", ("eagle3lab.preflight",)),
    # launching and watching
    ("serving", ("eagle3lab.serving",)),
    # benchmarking and measuring a running server
    ("measure", ("eagle3lab.measure",)),
    # the reference server (the offline engine over the engines' HTTP APIs)
    ("refserver", ("eagle3lab.refserver",)),
    ("study", ("eagle3lab.study",)),
    ("report", ("eagle3lab.report",)),
    ("cli", ("eagle3lab.cli", "eagle3lab.__main__")),
]

#: Third-party packages whose import is heavy (seconds, or GPU/driver state): a module that
#: imports one at its top is heavy, and so is every module that imports a heavy one at its top.
HEAVY_LIBS = ("torch", "transformers", "speculators", "sglang", "vllm", "matplotlib",
              "pandas", "papermill")

#: Modules run as scripts in another interpreter (maybe without eagle3lab): stdlib only.
STANDALONE = ("eagle3lab.engines.sglang_check",)

#: Packages whose modules may import own modules inside functions without a `# lazy:` line
#: each (package -> the reason), e.g. a command line that should not load every command's
#: library to print its help. Empty: every such import says why.
LAZY_OK: dict[str, str] = {
    "eagle3lab.cli": "the CLI imports only the command it runs, so `eagle3lab --help` and "
                     "each command start fast",
}

LAZY_COMMENT = re.compile(r"#\s*lazy\s*:(.*)$")


@dataclasses.dataclass(frozen=True)
class Edge:
    src: str  # the importing module
    dst: str  # the imported module (the package, for names defined in its __init__)
    path: Path
    lineno: int
    kind: str  # "top" (runs at import), "function" (inside a function), "typing"
    lazy: str | None = None  # the `# lazy:` reason on the statement ("" when empty)
    stmt: ast.stmt | None = dataclasses.field(default=None, compare=False, repr=False)

    def where(self, root: Path) -> str:
        return f"{self.path.relative_to(root)}:{self.lineno}"


@dataclasses.dataclass
class Graph:
    root: Path
    modules: dict[str, Path]  # dotted name -> file
    packages: set[str]  # dotted names that are packages (__init__.py)
    edges: list[Edge]
    libs: dict[str, list[tuple[str, int, str]]]  # module -> (third-party top name, line, kind)

    def out(self, kinds=("top", "function", "typing")) -> dict[str, set[str]]:
        g: dict[str, set[str]] = defaultdict(set)
        for e in self.edges:
            if e.kind in kinds:
                g[e.src].add(e.dst)
        return g


def module_names(root: Path) -> tuple[dict[str, Path], set[str]]:
    modules, packages = {}, set()
    for p in sorted((root / "eagle3lab").rglob("*.py")):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
            packages.add(".".join(parts))
        modules[".".join(parts)] = p
    return modules, packages


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _kind(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str:
    kind = "top"
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return "function"
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            kind = "typing"
    return kind


def _lazy_reason(lines: list[str], node: ast.stmt) -> str | None:
    """The `# lazy:` reason on the statement's lines, or on the line right above it."""
    for ln in range(node.lineno - 1, (node.end_lineno or node.lineno) + 1):
        if 1 <= ln <= len(lines):
            m = LAZY_COMMENT.search(lines[ln - 1])
            if m and (ln >= node.lineno or lines[ln - 1].lstrip().startswith("#")):
                return m.group(1).strip()
    return None


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def scan(root: Path = REPO) -> Graph:
    """Every import statement of every module under ROOT/eagle3lab."""
    root = Path(root)
    modules, packages = module_names(root)
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    edges: list[Edge] = []
    libs: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
    for mod, path in modules.items():
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        lines = text.splitlines()
        parents = _parents(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if mod in packages else mod.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    base_name = ".".join(base + ([node.module] if node.module else []))
                else:
                    base_name = node.module or ""
                targets = [(base_name, a.name) for a in node.names]
            else:
                continue
            kind = _kind(node, parents)
            seen: set[str] = set()
            for name, attr in targets:
                top = name.split(".")[0]
                if top != "eagle3lab":
                    if top not in stdlib:
                        libs[mod].append((top, node.lineno, kind))
                    continue
                full = f"{name}.{attr}" if attr else name
                dst = full if full in modules else _resolve(name, modules)
                if dst is None:
                    raise AssertionError(f"{path.relative_to(root)}:{node.lineno}: imports "
                                         f"{full}, which is not a module under eagle3lab/")
                if dst not in seen:  # one edge per statement and imported module
                    seen.add(dst)
                    edges.append(Edge(mod, dst, path, node.lineno, kind,
                                      _lazy_reason(lines, node), node))
    return Graph(root, modules, packages, edges, dict(libs))


def components(graph: Graph) -> list[list[str]]:
    """The strongly connected components with a circle (modules that import each other)."""
    g = graph.out()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []
    counter = [0]

    def connect(v: str) -> None:  # Tarjan, iterative
        work = [(v, iter(sorted(g.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g.get(w, ())))))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1 or node in g.get(node, ()):
                        comps.append(sorted(comp))

    for v in sorted(graph.modules):
        if v not in index:
            connect(v)
    return comps


def cycles(graph: Graph) -> list[list[str]]:
    """One circle (a path ending where it starts) per component: the shortest through the
    component's first module."""
    g = graph.out()
    out = []
    for comp in components(graph):
        start, members = comp[0], set(comp)
        prev: dict[str, str] = {}
        frontier = [start]
        found = None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for w in sorted(g.get(v, ())):
                    if w == start:
                        found = v
                        break
                    if w in members and w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            frontier = nxt
        path = [start]
        v = found
        while v is not None and v != start:
            path.append(v)
            v = prev.get(v)
        out.append([start] + path[1:][::-1] + [start])
    return out


def entry_of(module: str, layers=LAYERS) -> tuple[int, str] | None:
    """(layer index, entry) of the longest entry naming the module or a package above it."""
    best = None
    for i, (_, entries) in enumerate(layers):
        for e in entries:
            hit = module == e or (e != "eagle3lab" and module.startswith(e + "."))
            if hit and (best is None or len(e) > len(best[1])):
                best = (i, e)
    return best


def layer_of(module: str, layers=LAYERS) -> int | None:
    found = entry_of(module, layers)
    return found[0] if found else None


def layer_violations(graph: Graph, layers=LAYERS) -> list[str]:
    out = []
    for e in graph.edges:
        a, b = layer_of(e.src, layers), layer_of(e.dst, layers)
        if a is not None and b is not None and b > a:
            out.append(f"{e.where(graph.root)}: {e.src} (layer {layers[a][0]}) imports "
                       f"{e.dst} (layer {layers[b][0]}, higher){' in a function' if e.kind == 'function' else ''}")
    return out


def heavy_modules(graph: Graph, heavy_libs=HEAVY_LIBS) -> dict[str, str]:
    """Module -> why it is heavy: it imports a heavy library at its top, or a heavy module."""
    why = {m: f"imports {lib} at line {ln}" for m, found in graph.libs.items()
           for lib, ln, kind in found if kind == "top" and lib in heavy_libs}
    top = graph.out(kinds=("top",))
    changed = True
    while changed:
        changed = False
        for m in graph.modules:
            if m not in why:
                hit = next((d for d in sorted(top.get(m, ())) if d in why), None)
                if hit:
                    why[m] = f"imports {hit} ({why[hit]})"
                    changed = True
    return why


def lazy_imports(graph: Graph, heavy: dict[str, str] | None = None, lazy_ok=LAZY_OK
                 ) -> tuple[list[Edge], list[Edge]]:
    """(function-level own-module imports with a reason, those without)."""
    heavy = heavy_modules(graph) if heavy is None else heavy
    ok, bad = [], []
    for e in graph.edges:
        if e.kind == "function":
            excused = any(e.src == p or e.src.startswith(p + ".") for p in lazy_ok)
            (ok if e.lazy or e.dst in heavy or excused else bad).append(e)
    return ok, bad


# ---- the tree ---------------------------------------------------------------------------

def test_every_module_has_a_layer_and_every_entry_a_module():
    graph = scan()
    missing = [m for m in graph.modules if layer_of(m) is None]
    assert not missing, f"modules in no layer of LAYERS (tests/test_layers.py): {missing}"
    stale = [e for _, entries in LAYERS for e in entries if e not in graph.modules]
    assert not stale, f"LAYERS names modules that do not exist: {stale}"


def _circles_text(graph: Graph) -> str:
    return "\n".join(f"{' -> '.join(c)}" + (f"  (and {len(comp) - len(c) + 1} more modules "
                                            f"in the tangle: {', '.join(comp)})"
                                            if len(comp) > len(c) - 1 else "")
                     for c, comp in zip(cycles(graph), components(graph)))


def test_no_import_circles():
    graph = scan()
    found = components(graph)
    assert not found, ("import circles (imports inside functions count):\n"
                       + _circles_text(graph))


def test_no_package_circles():
    """Circles between the units LAYERS names (packages, or modules of a package split)."""
    graph = scan()
    unit = {m: (entry_of(m) or (0, m))[1] for m in graph.modules}
    g = Graph(graph.root, {u: graph.root for u in unit.values()}, set(),
              [dataclasses.replace(e, src=unit[e.src], dst=unit[e.dst]) for e in graph.edges
               if unit[e.src] != unit[e.dst]], {})
    found = components(g)
    assert not found, "package circles:\n" + _circles_text(g)


def test_no_import_from_a_higher_layer():
    bad = layer_violations(scan())
    assert not bad, "imports from a higher layer:\n" + "\n".join(bad)


def test_function_level_imports_have_a_reason():
    graph = scan()
    empty = [e.where(graph.root) for e in graph.edges if e.lazy == ""]
    assert not empty, f"`# lazy:` without a reason: {empty}"
    stray = [e.where(graph.root) for e in graph.edges if e.lazy is not None and
             e.kind != "function"]
    assert not stray, f"`# lazy:` on an import that is not inside a function: {stray}"
    _, bad = lazy_imports(graph)
    report = "\n".join(f"  {e.where(graph.root)}: {e.dst}" for e in bad)
    assert not bad, (f"{len(bad)} own-module import(s) inside functions without a reason "
                     f"(import it at the top, or say `# lazy: why`):\n{report}")


def test_standalone_scripts_import_the_standard_library_only():
    graph = scan()
    for mod in STANDALONE:
        assert mod in graph.modules, f"STANDALONE names a missing module: {mod}"
        own = [e.where(graph.root) for e in graph.edges if e.src == mod]
        libs = [f"{lib} (line {ln})" for lib, ln, kind in graph.libs.get(mod, ())
                if kind == "top"]
        assert not own and not libs, f"{mod} imports {own + libs} at its top"


# ---- the analysis itself, on small trees ------------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / "eagle3lab" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_a_circle_through_a_function_is_found_with_its_path(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "from eagle3lab.high.b import x\n",
        "high/__init__.py": "",
        "high/b.py": "def f():\n    from ..low import a\n",
        "high/c.py": "import eagle3lab.high.b\n",
    })
    graph = scan(root)
    assert cycles(graph) == [["eagle3lab.high.b", "eagle3lab.low.a", "eagle3lab.high.b"]]
    layers = [("low", ("eagle3lab.low",)), ("high", ("eagle3lab.high",))]
    bad = layer_violations(graph, layers)
    assert len(bad) == 1 and bad[0].startswith("eagle3lab/low/a.py:1: eagle3lab.low.a")
    assert layer_of("eagle3lab.high.c", layers) == 1 and layer_of("eagle3lab", layers) is None


def test_heavy_modules_and_lazy_reasons(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "",
        "model.py": "import torch\n",
        "uses.py": "from eagle3lab import model\n",
        "light.py": "def f():\n    import torch\n",
        "caller.py": ("def f():\n    from eagle3lab.uses import model\n"
                      "    from eagle3lab.light import f\n"
                      "    from eagle3lab import light  # lazy: keeps --help fast\n"),
    })
    graph = scan(root)
    assert set(heavy_modules(graph)) == {"eagle3lab.model", "eagle3lab.uses"}
    ok, bad = lazy_imports(graph, lazy_ok={})
    assert [(e.dst, e.lazy) for e in ok] == [("eagle3lab.uses", None),
                                             ("eagle3lab.light", "keeps --help fast")]
    assert [(e.dst, e.lineno) for e in bad] == [("eagle3lab.light", 3)]
    assert len(lazy_imports(graph, lazy_ok={"eagle3lab.caller": "why"})[0]) == 3


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else REPO
    graph = scan(root)
    print("layers, lowest first:")
    for i, (name, entries) in enumerate(LAYERS):
        print(f"  {i:2d} {name:14s} {', '.join(entries)}")
    if components(graph):
        print("CIRCLES:\n" + _circles_text(graph))
    for v in layer_violations(graph):
        print("UP:", v)
    heavy = heavy_modules(graph)
    ok, bad = lazy_imports(graph, heavy)
    print(f"heavy modules: {len(heavy)}; function-level own imports: {len(ok) + len(bad)} "
          f"({len(ok)} with a reason, {len(bad)} without)")
    per: dict[str, int] = defaultdict(int)
    for e in bad:
        per[e.src] += 1
    for m, n in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"  {n:3d} {m}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
