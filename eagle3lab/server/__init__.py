"""Live serving: launch SGLang, vLLM (or the embedded reference server) with a watchdog,
read their logs and /metrics, and benchmark them with and without speculation, one
request at a time or N in flight.

Modules, lowest first (each names the failure it prevents in its docstring):
- `warnings`   the catalogue of known SGLang start-up messages and hang causes, as data
- `vllm_logs`  vLLM's log lines (stamp, phases, crash markers, stats and SpecDecoding lines)
- `logs`       log analysis for both engines (phases, verdict, decode over time, findings)
- `process`    process groups: start, stop (TERM, then KILL), verify, dump stacks
- `launch`     `LaunchConfig` -> exact argv, SGLang's own argv check, `start()` -> handle
- `sglang_check` the subprocess that runs `prepare_server_args` on CPU
- `watch`      the start-up watchdog: phases, /health, process state, NVML, verdicts
- `client`     HTTP to a running server: JSON answers (errors included), its server info
- `metrics`    /metrics: the reference exposition, the scraper, acceptance over a window
- `workload`   the benchmark's requests to the native `/generate`, raw counts per request
- `loadgen`    the concurrent client: N streaming requests in flight per level
- `tables`     per-arm summary (ratios of sums) and per-position acceptance
- `arms`       the arm plan: baseline and, when it can run, speculative
- `bench`      the benchmark run over the arms -> `BenchResult` and its key numbers
- `reference`  the reference server over the offline engine (CPU; not for production)
- `reference_http` its routes (SGLang native + stream, OpenAI completions, /metrics)
- `plots`      the figures of notebooks/04_live_server.ipynb

`server` uses `specdec` only in `reference` (lower layers never import higher ones:
docs/ARCHITECTURE.md, "The package map").
"""
