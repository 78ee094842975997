"""The figures of notebooks/04_live_server.ipynb: start-up timeline, throughput and accept
length over time, per-position acceptance.

Prevents misread plots: every axis says its unit, accept length is labelled as including
the bonus token (floor 1.0; the definitions are in eagle3lab/specdec/result.py), and per-position
acceptance says whether it is cumulative or conditional.
"""

from __future__ import annotations

from typing import Any


def _plt():
    import matplotlib.pyplot as plt

    return plt


def plot_timeline(watch_states: dict[str, dict[str, Any]], ax=None):
    """Each arm's start-up events (phases from the log, health, verdict) against seconds
    since its launch, as seen by the watchdog."""
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.5))
    labels: list[str] = []
    for arm, st in watch_states.items():
        evs = [e for e in st.get("events", []) if not e["event"].startswith("stacks")]
        ys = []
        for e in evs:
            if e["event"] not in labels:
                labels.append(e["event"])
            ys.append(labels.index(e["event"]))
        ax.plot([e["t_s"] for e in evs], ys, marker="o", drawstyle="steps-post", label=arm)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("time since launch (s)")
    ax.set_ylabel("start-up event")
    ax.set_title("Server start-up timeline (watchdog)")
    ax.grid(alpha=0.3)
    ax.legend(title="server")
    return ax


def plot_over_time(decode_df, column: str, *, ylabel: str, title: str, ax=None):
    """One line per arm of a `Decode batch` column against seconds since its first line."""
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    for arm, g in decode_df.groupby("arm", sort=False):
        g = g.dropna(subset=[column])
        if len(g):
            ax.plot(g["t_s"], g[column], marker="o", label=arm)
    ax.set_xlabel("time since the first Decode batch line (s)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(title="server")
    return ax


def plot_accept_over_time(decode_df, ax=None):
    ax = plot_over_time(decode_df, "accept_len", ax=ax,
                        ylabel="accept length (tokens per verify step, incl. bonus)",
                        title="Accept length over time (server log)")
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="floor (no draft accepted)")
    ax.legend(title="server")
    return ax


def plot_throughput_over_time(decode_df, ax=None):
    return plot_over_time(decode_df, "gen_throughput", ax=ax,
                          ylabel="gen throughput (tokens/s)",
                          title="Generation throughput over time (server log)")


def plot_per_position(positions_df, ax=None):
    """Cumulative (bars) and conditional (markers) acceptance per draft position."""
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    arms = list(dict.fromkeys(positions_df["arm"]))
    width = 0.8 / max(len(arms), 1)
    for i, arm in enumerate(arms):
        g = positions_df[positions_df["arm"] == arm]
        x = g["position"] + (i - (len(arms) - 1) / 2) * width
        bars = ax.bar(x, g["p_cumulative"], width=width, alpha=0.7,
                      label=f"{arm}: P(positions 1..k accepted)")
        ax.plot(x, g["p_conditional"], "^", color=bars.patches[0].get_facecolor(),
                markeredgecolor="black", label=f"{arm}: P(k accepted | k-1 accepted)")
    ax.set_xticks(sorted(set(positions_df["position"])))
    ax.set_xlabel("draft position k")
    ax.set_ylabel("acceptance probability (fraction of verify steps)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Per-position acceptance (from spec_accept_histogram)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return ax


def plot_tokens_per_s(summary_df, ax=None):
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.2))
    bars = ax.bar(summary_df["arm"], summary_df["tokens_per_s"],
                  color=["tab:blue", "tab:orange", "tab:green"][:len(summary_df)],
                  label="client-side completion tokens / s")
    for b, s in zip(bars, summary_df["speedup"]):
        ax.annotate(f"{s:.2f}x", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom")
    ax.set_xlabel("server")
    ax.set_ylabel("throughput (tokens/s)")
    ax.set_title("Benchmark: tokens/s and speedup vs baseline")
    ax.legend(fontsize=8)
    return ax


def plot_live_positions(live_df, offline_df=None, ax=None, predicted_df=None):
    """Per-position acceptance from /metrics windows over time (one line per position,
    vLLM's counters: accepted at position k / drafts in the window); dashed, the same
    positions from the requests' own histograms over the whole run; dotted, the offline
    engine's prediction for the same drafter and prompts (`tables.offline_positions`)."""
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    refs = [(df, ls, what) for df, ls, what in (
        (offline_df, "--", "per-request histograms"),
        (predicted_df, ":", "offline prediction")) if df is not None and len(df)]
    for k, g in live_df.groupby("position"):
        line, = ax.plot(g["t_s"], g["p_cumulative"], "o-", label=f"k={k} live (/metrics)")
        for df, ls, what in refs:
            ref = df.loc[df["position"] == k, "p_cumulative"]
            if len(ref):
                ax.axhline(float(ref.iloc[0]), ls=ls, color=line.get_color(),
                           label=f"k={k} {what}")
    ax.set_xlabel("seconds since the first window")
    ax.set_ylabel("P(positions 1..k accepted)")
    ax.set_ylim(-0.02, 1.05)
    ax.set_title("Per-position acceptance, live from /metrics")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    return ax


def plot_concurrency(sweep_df, axes=None):
    """Throughput, TTFT and accept length per concurrency level, one line per arm."""
    plt = _plt()
    if axes is None:
        _, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    for arm, g in sweep_df.groupby("arm", sort=False):
        axes[0].plot(g["concurrency"], g["throughput_tok_s"], "o-", label=arm)
        axes[1].plot(g["concurrency"], g["ttft_mean_s"], "o-", label=arm)
        axes[2].plot(g["concurrency"], g["metrics_accept_length"], "o-", label=arm)
    for ax, title in zip(axes, ("tokens/s (all requests)", "mean TTFT (s)",
                                "accept length (/metrics, incl. bonus)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("requests in flight")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return axes
