"""The engine releases eagle3lab launches for and judges against, and their order.

Prevents two places deciding the SGLang release differently (the launcher picking a flag's
spelling for one release while preflight judges the drafter for another) and a version
compared as a string ('0.5.9' > '0.5.23'): the installed release comes from the
distribution's metadata (nothing of sglang or vllm is imported), the pinned SGLang is the
one requirements-sglang-cpu.txt installs, and versions compare as integer tuples.
"""

from __future__ import annotations

import re
from importlib import metadata

#: The release requirements-sglang-cpu.txt pins; the default when none is installed.
PINNED_SGLANG = "0.5.23"


def version_tuple(v: str) -> tuple[int, ...]:
    """'0.5.23' -> (0, 5, 23); suffixes such as 'rc1' or '+cu128' are ignored (each part's
    leading digits count: '0.25.1rc1' is (0, 25, 1), not (0, 25, 11))."""
    return tuple(int(re.match(r"\d*", p).group() or 0) for p in v.split(".")[:3])


def installed_version(distribution: str) -> str | None:
    """The installed release of a distribution (its metadata; never imported), else None."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def installed_sglang_version() -> str | None:
    return installed_version("sglang")


def installed_vllm_version() -> str | None:
    return installed_version("vllm")
