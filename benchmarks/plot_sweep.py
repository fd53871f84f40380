#!/usr/bin/env python3
"""Plots of a sweep's CSV (benchmarks/sweep.py) as PNG files in --out:

  throughput.png  tokens/s and MFU of every point that ran, grouped by layout
  scaling.png     scaling efficiency against ranks, strong and weak: for each config,
                  the best tokens/s at R ranks over R times the best at 1 rank
  collectives.png (with --collectives FILE: build/bench/collectives' output) bus
                  bandwidth per message size, nccl-tests' busbw, layer and direct MPI

    python3 benchmarks/plot_sweep.py runs/sweep/results.csv --out runs/sweep [--collectives coll.txt]

Needs matplotlib (Debian: python3-matplotlib)."""
import argparse
import collections
import csv
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def read_rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return [r for r in csv.DictReader(f)]


def config_name(r):
    return os.path.basename(r["config"]).removesuffix(".ini")


def layout(r):
    return f"{r['dp']}x{r['tp']}x{r['pp']}"


def plot_throughput(rows, out):
    ok = [r for r in rows if r["status"] == "ok"]
    labels = list(dict.fromkeys(f"{layout(r)} {r['scaling']}" for r in ok))
    configs = list(dict.fromkeys(config_name(r) for r in ok))
    fig, (tps_ax, mfu_ax) = plt.subplots(2, 1, figsize=(max(8, 0.5 * len(labels) * len(configs)), 7), sharex=True)
    width = 0.8 / max(1, len(configs))
    for i, c in enumerate(configs):
        by_label = {f"{layout(r)} {r['scaling']}": r for r in ok if config_name(r) == c}
        xs = [j + i * width for j, label in enumerate(labels) if label in by_label]
        tps_ax.bar(xs, [float(by_label[l]["tokens_per_s"]) for l in labels if l in by_label], width, label=c)
        mfu_ax.bar(xs, [100 * float(by_label[l]["mfu"]) for l in labels if l in by_label], width, label=c)
    tps_ax.set(ylabel="tokens/s", title="throughput per layout (dp x tp x pp)")
    mfu_ax.set(ylabel="MFU (%)")
    mfu_ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))], labels, rotation=60, ha="right")
    tps_ax.legend()
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        mfu_ax.set_xlabel(f"{len(failed)} point(s) failed: see the CSV's error column")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "throughput.png"), dpi=110)
    plt.close(fig)


def plot_scaling(rows, out):
    best = collections.defaultdict(dict)  # (config, scaling) -> ranks -> tokens/s
    for r in rows:
        if r["status"] != "ok":
            continue
        key, ranks = (config_name(r), r["scaling"]), int(r["ranks"])
        best[key][ranks] = max(best[key].get(ranks, 0.0), float(r["tokens_per_s"]))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (c, scaling), by_ranks in sorted(best.items()):
        if 1 not in by_ranks:
            continue
        ranks = sorted(by_ranks)
        ax.plot(ranks, [by_ranks[n] / (n * by_ranks[1]) for n in ranks], "o-" if scaling == "strong" else "s--",
                label=f"{c}, {scaling}")
    ax.axhline(1.0, color="gray", linestyle=":", label="ideal")
    ax.set(xlabel="ranks", ylabel="efficiency: tokens/s(R) / (R x tokens/s(1))", title="scaling efficiency")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "scaling.png"), dpi=110)
    plt.close(fig)


def plot_collectives(path, out):
    """build/bench/collectives' tables: '## op' then rows '| size | count | type | time | algbw | busbw | ...'."""
    tables, op = {}, None
    for line in open(path, encoding="utf-8"):
        m = re.match(r"## (\w+)", line)
        if m:
            op = m.group(1)
            tables[op] = []
        elif op and re.match(r"\| \d", line):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            tables[op].append((float(cells[0]), float(cells[5]), float(cells[9])))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for op, rows in tables.items():
        (line,) = ax.plot([r[0] for r in rows], [r[1] for r in rows], "o-", label=f"{op} (trident)")
        ax.plot([r[0] for r in rows], [r[2] for r in rows], "x:", color=line.get_color(), label=f"{op} (direct MPI)")
    ax.set(xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)", title="collectives: busbw (nccl-tests)")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "collectives.png"), dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--out", required=True)
    ap.add_argument("--collectives", help="output of build/bench/collectives")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows = read_rows(a.csv)
    plot_throughput(rows, a.out)
    plot_scaling(rows, a.out)
    made = ["throughput.png", "scaling.png"]
    if a.collectives:
        plot_collectives(a.collectives, a.out)
        made.append("collectives.png")
    print("plots: " + ", ".join(os.path.join(a.out, m) for m in made))


if __name__ == "__main__":
    main()
