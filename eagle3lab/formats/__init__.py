"""Checkpoint formats: engine profiles as data, format detection, the checkpoint doctor
(`inspect_checkpoint`), converters (`convert_checkpoint`) and serving-path emulation
(`load_as`). See docs/formats.md.

Prevents train/serve mismatches (dropped keys, shifted aux layer ids, ignored norms, broken
vocab maps) from being discovered only as accept length 1.00 on a GPU server.
"""

from eagle3lab.formats.convert import convert_checkpoint
from eagle3lab.formats.doctor import inspect_checkpoint
from eagle3lab.formats.findings import CODES, Finding, Report
from eagle3lab.formats.load_as import EngineRefusal, load_as
from eagle3lab.formats.profiles import ENGINES, PROFILES, get_profile

__all__ = ["CODES", "ENGINES", "PROFILES", "EngineRefusal", "Finding", "Report",
           "convert_checkpoint", "get_profile", "inspect_checkpoint", "load_as"]
