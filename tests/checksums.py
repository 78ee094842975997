"""The check of a shipped folder's SHA256SUMS (`sha256sum` format), shared by the tests of
the shipped drafter and of the study's winner."""

import hashlib
from pathlib import Path


def assert_checksums(folder: Path) -> set[str]:
    """Assert every file `folder/SHA256SUMS` lists still hashes to what it records; return
    the names it lists."""
    sums = dict(line.split()[::-1] for line in (folder / "SHA256SUMS").read_text().splitlines())
    for name, digest in sums.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
    return set(sums)
