"""A serving engine's log read: SGLang's and vLLM's lines -> start-up phases, a verdict,
decode statistics over time, and findings (`eagle3lab logs`).

Prevents reading a server's state wrong from a raw log: a hang read as a slow start, a
traceback lost under import-error noise, an accept length stuck at 1.00 read as working
speculation, a stopped server read as still ready, harmless warnings chased and real causes
missed.

Modules, lowest first (each names the failure it prevents in its docstring):
- `catalogue`    known SGLang start-up messages and hang causes per phase, as data
- `vllm_format`  vLLM's log lines (stamp, phases, crash markers, stats and SpecDecoding)
- `analyzer`     log analysis for both engines (phases, verdict, decode over time, findings)

Imports nothing of eagle3lab but its own modules: preflight (the start-up warnings), the
watchdog and the benchmark read logs through it.
"""
