"""The reference server: the offline engine (eagle3lab.specdec) behind the subset of
SGLang's native HTTP API and of vLLM's OpenAI completions that the clients use, logging in
SGLang's format, with `/metrics` in the engines' Prometheus names. NOT a production server.

Prevents the live-server tooling (launcher, watchdog, log reader, benchmark clients,
metrics scraper, regeneration through a server, notebook 04) from being tested only on a
GPU node, i.e. from being untested: this server runs wherever the offline engine runs.

Modules:
- `server`  the process: requests queued and decoded one at a time, SGLang-format log
            lines, per-step counts into /metrics, faulthandler on SIGUSR1, `serve`
- `routes`  its HTTP routes (SGLang native + stream, OpenAI completions, /metrics)

Uses `specdec` (the engine) and `measure.prometheus` (the /metrics exposition).
"""
