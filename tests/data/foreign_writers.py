"""The foreign-layout writers the readers' tests use: the library's own
(eagle3lab.data.foreign.write), which the notebooks also call."""

from eagle3lab.data.foreign.write import final_norm, to_specforge, to_speculators  # noqa: F401
