"""Figures for offline acceptance (notebook 05): per-position acceptance, the accept
histogram, tau against chain length with the i.i.d. chain model, tokens/s.

Every figure states which acceptance definition it shows (eagle3lab.specdec.stats).
"""

from __future__ import annotations

from typing import Any

from eagle3lab.specdec.stats import chain_expected_tau


def acceptance_bars(result: dict[str, Any], ax=None):
    """Cumulative and conditional acceptance per draft position, one bar group per arm."""
    import matplotlib.pyplot as plt
    import numpy as np

    arms = result["arms"]
    if ax is None:
        _, ax = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    width = 0.8 / max(len(arms), 1)
    for kind, axis in zip(("acceptance_cumulative", "acceptance_conditional"), ax):
        for j, a in enumerate(arms):
            vals = [v if v is not None else 0.0 for v in a["stats"][kind]]
            x = np.arange(1, len(vals) + 1) + (j - (len(arms) - 1) / 2) * width
            axis.bar(x, vals, width=width, label=a["name"])
        axis.set_xlabel("draft position k")
        axis.set_ylim(0, 1)
        axis.legend(fontsize=8)
    ax[0].set_title("Cumulative: P(positions 1..k all accepted)")
    ax[1].set_title("Conditional: P(k accepted | k-1 accepted)")
    ax[0].set_ylabel("acceptance (fraction of verify steps)")
    return ax


def histogram_bars(result: dict[str, Any], ax=None):
    """SGLang's spec_accept_histogram: verify steps that accepted exactly n drafts."""
    import matplotlib.pyplot as plt
    import numpy as np

    arms = result["arms"]
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.8))
    width = 0.8 / max(len(arms), 1)
    for j, a in enumerate(arms):
        h = a["stats"]["accept_histogram"]
        total = sum(h) or 1
        x = np.arange(len(h)) + (j - (len(arms) - 1) / 2) * width
        ax.bar(x, [v / total for v in h], width=width, label=f"{a['name']} (tau "
               f"{a['stats']['tau']:.2f})")
    ax.set_title("Accept histogram: drafts accepted per verify step")
    ax.set_xlabel("drafted tokens accepted in one verify step (n)")
    ax.set_ylabel("fraction of verify steps")
    ax.legend(fontsize=8)
    return ax


def tau_vs_chain(points: list[dict[str, Any]], a: float, ax=None):
    """Measured tau per chain length against (1 - a^(g+1)) / (1 - a) for the measured a."""
    import matplotlib.pyplot as plt
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.8))
    g = [p["steps"] for p in points]
    ax.plot(g, [p["tau"] for p in points], "o-", label="measured tau")
    grid = np.arange(1, max(g + [1]) + 1)
    ax.plot(grid, [chain_expected_tau(a, int(k)) for k in grid], "--",
            label=f"(1 - a^(g+1)) / (1 - a), a = {a:.2f}")
    ax.set_title("Accept length (incl. bonus token) vs chain length")
    ax.set_xlabel("draft tokens per verify step g (chain length)")
    ax.set_ylabel("tau (tokens per verify step)")
    ax.legend(fontsize=8)
    return ax


def throughput_bars(result: dict[str, Any], ax=None):
    """Plain vs speculative decode tokens/s, measured in the same run."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.8))
    names = ["plain"] + [a["name"] for a in result["arms"]]
    vals = [result["plain"]["tokens_per_s"]] + [a["stats"]["tokens_per_s"]
                                               for a in result["arms"]]
    bars = ax.bar(range(len(names)), vals, color=["grey"] + ["C0"] * len(result["arms"]),
                  label="decode tokens/s")
    for b, a in zip(bars[1:], result["arms"]):
        ax.annotate(f"x{a['speedup_measured']:.2f}", (b.get_x() + b.get_width() / 2,
                                                      b.get_height()), ha="center",
                    va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=15, fontsize=8)
    ax.set_title("Decode throughput, same prompts, same run")
    ax.set_ylabel("tokens per second")
    ax.legend(fontsize=8)
    return ax
