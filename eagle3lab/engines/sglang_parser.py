"""An SGLang command line checked by SGLang's own parser before a GPU is spent.

Prevents a launch refused (or silently meaning something else) after minutes of start-up on
a GPU node: a misspelt flag, a flag the installed SGLang renamed, a value of the wrong type.
`check_argv_with_sglang` runs `sglang_check.py` (stdlib only) in the interpreter that will
run SGLang, where `prepare_server_args` parses the arguments exactly as
`python -m sglang.launch_server` will; where sglang does not import, the answer says
"unavailable" (not an error). The launcher and preflight both ask through here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def check_argv_with_sglang(argv: list[str], *, python: str | None = None,
                           timeout_s: float = 120.0) -> dict[str, Any]:
    """Run SGLang's `prepare_server_args` on the arguments of an SGLang command line.

    Returns {"status": "ok"|"invalid"|"unavailable", "reason", "parsed", "stubbed",
    "messages"}; "unavailable" (sglang or one of its imports missing) is not an error.
    """
    if "sglang.launch_server" in argv:
        argv = argv[argv.index("sglang.launch_server") + 1:]
    script = Path(__file__).with_name("sglang_check.py")
    # run_path, not `python script.py`: that would put this package's directory first on
    # sys.path, where a module of ours could shadow one sglang or torch imports.
    runner = f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"
    try:
        r = subprocess.run([python or sys.executable, "-c", runner, *argv], capture_output=True,
                           text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "unavailable", "reason": f"the check took over {timeout_s:.0f} s",
                "parsed": None, "stubbed": [], "messages": []}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        return {"status": "unavailable", "reason": "the check printed no result: "
                + " | ".join(tail), "parsed": None, "stubbed": [], "messages": tail}
    return json.loads(lines[-1])
