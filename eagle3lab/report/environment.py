"""What computed a report: package versions, Python, the machine and its accelerator.

Prevents numbers nobody can trace: every report records the versions of the libraries that
computed it (torch, transformers, speculators, papermill, nbconvert) and the machine, so a
number that changes between two reports can be traced to a changed version or device.
Collecting them never fails a report (a missing package is recorded as such).
"""

from __future__ import annotations

import os
import platform

from eagle3lab.config import package_versions


#: Packages whose versions every report records.
PACKAGES = ("torch", "transformers", "speculators", "papermill", "nbconvert")


def versions() -> dict[str, str]:
    """Versions of what computed the report (packages, Python, machine)."""
    out = package_versions(PACKAGES)
    out = {"eagle3lab": out.pop("eagle3lab"), "python": platform.python_version(), **out}
    out["platform"] = platform.platform()
    out["cpus"] = str(os.cpu_count())
    try:
        import torch

        out["accelerator"] = (torch.cuda.get_device_name(0) if torch.cuda.is_available()
                              else "none (CPU)")
    except Exception:  # noqa: BLE001 - versions must never fail a report
        out["accelerator"] = "unknown"
    return out
