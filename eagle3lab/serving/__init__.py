"""Serving: start an engine (SGLang, vLLM, or eagle3lab's reference server) in its own
process group, watch its start to a verdict, and stop all of it.

Prevents the lost hours of live serving: servers outliving the notebook or the run (a
process group stopped and verified, never a kill by name), a hang read as a slow start (the
watchdog says hung within the silence window, with the stacks and the likely cause), and a
launch that a check could have refused started anyway (SGLang's own parser and the launch's
preflight first).

Modules, lowest first (each names the failure it prevents in its docstring):
- `process`  process groups: start, stop (TERM, then KILL), verify, dump stacks
- `launch`   `start()`: a `LaunchConfig` (eagle3lab.engines) checked, started -> handle
- `watch`    the start-up watchdog: phases, /health, process state, NVML, verdicts

Uses `engines` (the argv, the releases), `preflight` and `serverlogs`; `measure` and the CLI
use it.
"""
