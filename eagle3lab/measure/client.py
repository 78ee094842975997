"""The HTTP client for a running server: JSON in, (status, JSON or text) out, and the
server's own info.

Prevents a benchmark that dies with a traceback (or records garbage) when a server answers
an error page or a non-JSON body: every answer comes back as (status, parsed JSON or the
text), an HTTP error status included, so the caller can name the request that failed. It
also prevents reading "no server info" from a newer SGLang: `/get_server_info` was renamed
`/server_info`, and both are asked. `avg_spec_accept_length` in that info is cumulative
since the server started; callers report it next to their own window's number, never
instead of it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def http_json(url: str, body: Any = None, *, timeout_s: float = 600.0) -> tuple[int, Any]:
    """GET (body None) or POST JSON; returns (status, parsed JSON or text)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return status, raw.decode(errors="replace")


def server_info(url: str) -> dict[str, Any] | None:
    """`/get_server_info` (or the newer `/server_info`); None when neither answers."""
    for path in ("/get_server_info", "/server_info"):
        try:
            status, obj = http_json(url + path, timeout_s=30)
        except (urllib.error.URLError, OSError):
            return None
        if status == 200 and isinstance(obj, dict):
            return obj
    return None


def avg_spec_accept_length(info: dict[str, Any] | None) -> float | None:
    """The server's cumulative accept length (`internal_states[0]`), None when absent."""
    states = (info or {}).get("internal_states") or [{}]
    v = states[0].get("avg_spec_accept_length") if isinstance(states[0], dict) else None
    return float(v) if v is not None else None
