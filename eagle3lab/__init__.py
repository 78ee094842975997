"""eagle3lab: a research workbench for EAGLE-3 draft models.

The library does the work; notebooks and the `eagle3lab` CLI only drive it. Every
artifact records what made it, so that the next stage can refuse a silent mismatch.
"""

__version__ = "0.1.0"
