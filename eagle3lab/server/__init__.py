"""Live serving: launch SGLang (or the embedded reference server) with a watchdog, read
its logs, and benchmark it with and without speculation.

Modules, lowest first (each names the failure it prevents in its docstring):
- `warnings`   the catalogue of known SGLang start-up messages and hang causes, as data
- `logs`       SGLang log-line parser and log analysis (phases, verdict, decode over time)
- `process`    process groups: start, stop (TERM, then KILL), verify, dump stacks
- `launch`     `LaunchConfig` -> exact argv, SGLang's own argv check, `start()` -> handle
- `sglang_check` the subprocess that runs `prepare_server_args` on CPU
- `watch`      the start-up watchdog: phases, /health, process state, NVML, verdicts
- `client`     HTTP to a running server: JSON answers (errors included), its server info
- `workload`   the benchmark's requests to the native `/generate`, raw counts per request
- `tables`     per-arm summary (ratios of sums) and per-position acceptance
- `arms`       the arm plan: baseline and, when it can run, speculative
- `bench`      the benchmark run over the arms -> `BenchResult` and its key numbers
- `reference`  the reference HTTP server over the offline engine (CPU; not for production)
- `plots`      the figures of notebooks/04_live_server.ipynb

`server` uses `specdec` only in `reference` (lower layers never import higher ones:
docs/ARCHITECTURE.md, "The package map").
"""
