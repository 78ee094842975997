"""Which test plants the fault of each finding code: `@plants("code")` on the test, and
`planted_problems(module, codes)` for the meta-tests that check every code has one.

Prevents a meta-test that passes because the code's name appears somewhere in the file (a
comment, a docstring, another code's test) while no test plants that fault: each code must
be claimed by a test of the module (a collected `test_*` function), and that test's own body
must check a finding with that code, i.e. the code's string is in an `assert`, in an
unpacking (`[f] = by_code(r, "code")`) or a `next(...)` (both fail when the finding is
absent), or in a value that an `assert` then reads.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Iterable
from types import ModuleType


def plants(*codes: str):
    """Mark a test as the planted-fault test of `codes`."""
    def mark(fn):
        fn.plants = tuple(getattr(fn, "plants", ())) + codes
        return fn
    return mark


def _mentions(node: ast.AST, code: str, names: set[str]) -> bool:
    return any((isinstance(n, ast.Constant) and n.value == code)
               or (isinstance(n, ast.Name) and n.id in names) for n in ast.walk(node))


def checks_code(fn, code: str) -> bool:
    """True when the body of `fn` (not its decorators, docstring or comments) fails
    without a finding `code`: see the module docstring."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    stmts = [n for s in body for n in ast.walk(s)]
    names: set[str] = set()  # names holding a value computed from the code's findings
    for _ in range(3):  # values that flow through a few assignments
        for n in stmts:
            if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None and \
                    _mentions(n.value, code, names):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                if any(isinstance(t, (ast.List, ast.Tuple)) for t in targets):
                    return True  # unpacking: fails unless exactly those findings exist
                names |= {x.id for t in targets for x in ast.walk(t) if isinstance(x, ast.Name)}
    for n in stmts:
        if isinstance(n, ast.Assert) and _mentions(n.test, code, names):
            return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "next" \
                and _mentions(n, code, set()):
            return True
    return False


def planted_problems(module: ModuleType, codes: Iterable[str]) -> list[str]:
    """One line per code without a test of `module` that plants it and checks it, and per
    test that claims a code not in `codes`."""
    codes = list(codes)
    tests = {name: fn for name, fn in vars(module).items()
             if name.startswith("test_") and inspect.isfunction(fn)}
    problems = []
    for code in codes:
        claimed = [name for name, fn in tests.items() if code in getattr(fn, "plants", ())]
        if not claimed:
            problems.append(f"{code}: no test of {module.__name__} is marked "
                            f"@plants({code!r})")
        problems += [f"{code}: {name} is marked @plants({code!r}) but does not check a "
                     f"finding with that code" for name in claimed
                     if not checks_code(tests[name], code)]
    problems += [f"{name}: @plants({code!r}) names no code of this check"
                 for name, fn in tests.items() for code in getattr(fn, "plants", ())
                 if code not in codes]
    return problems
