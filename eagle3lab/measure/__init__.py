"""Measuring a running server: requests with raw counts, N streaming requests in flight,
acceptance from /metrics over a window, the offline engine's prediction against it, and
the benchmark of a baseline and a speculative arm with its tables and figures.

Prevents speed-ups and acceptance misreported: per-request ratios averaged instead of
ratios of sums, a counter since boot quoted as one run's number, a batch-1 speed-up quoted
for a loaded server, arms that differ in more than speculation, servers left running after
a failed request.

Modules, lowest first (each names the failure it prevents in its docstring):
- `client`      HTTP to a running server: JSON answers (errors included), its server info
- `workload`    the benchmark's requests to the native `/generate`, raw counts per request
- `prometheus`  /metrics: the reference exposition, the scraper, acceptance over a window
- `loadgen`     the concurrent client: N streaming requests in flight per level
- `agreement`   the offline engine's acceptance against a server's, with the noise
- `tables`      per-arm summary (ratios of sums) and per-position acceptance
- `arms`        the arm plan: baseline and, when it can run, speculative
- `bench`       the benchmark run over the arms -> `BenchResult` and its key numbers
- `plots`       the figures of notebooks/04_live_server.ipynb

Uses `serving` (start, watch, stop), `serverlogs`, `preflight` (a refused arm) and `data`
(the prompts).
"""
