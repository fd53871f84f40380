#!/usr/bin/env python3
"""Memory per rank against dp for every ZeRO stage (and the other modes at their point),
from benchmarks/memory_modes.sh's CSV: what the plan said (line) and what rank 0 took
(markers), with the formula of the model states (dashed).

    /usr/bin/python3 benchmarks/plot_memory.py benchmarks/memory_modes/memory_modes.csv benchmarks/memory_modes.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(csv_path, png_path):
    rows = [r for r in csv.DictReader(open(csv_path)) if r["part"] == "memory"]
    fig, ax = plt.subplots(figsize=(10.5, 4.8))
    colors = {"zero0": "tab:blue", "zero1": "tab:orange", "zero2": "tab:green", "zero3": "tab:red"}
    for mode, color in colors.items():
        points = sorted((int(r["dp"]), r) for r in rows if r["mode"] == mode)
        if not points:
            continue
        dps = [dp for dp, _ in points]
        ax.plot(dps, [float(r["planned_mib"]) / 1024 for _, r in points], "-", color=color, label=f"{mode}: plan")
        ax.plot(dps, [float(r["taken_mib"]) / 1024 for _, r in points], "o", color=color, label=f"{mode}: took")
        ax.plot(dps, [float(r["states_formula_mib"]) / 1024 for _, r in points], "--", color=color, alpha=0.5,
                label=f"{mode}: model states, formula")
    for r in rows:
        if r["mode"] in colors:
            continue
        ax.plot([int(r["dp"])], [float(r["taken_mib"]) / 1024], "s", label=f"{r['mode']} (tp {r['tp']}): took")
    ax.set_xlabel("dp (ranks sharding the states)")
    ax.set_ylabel("GiB per rank (rank 0)")
    ax.set_xticks(sorted({int(r["dp"]) for r in rows}))
    ax.set_title("GPT-2 124M, T=256, micro-batch 1: memory per rank by mode")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
