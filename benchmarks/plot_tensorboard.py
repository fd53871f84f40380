#!/usr/bin/env python3
"""Plots a run's curves as read back from its TensorBoard event files (neither TensorBoard
nor Grafana is packaged where trident is built, so this reads the files itself, through
tests/monitor/read_tensorboard.py: protobuf on TensorBoard's schema, CRCs checked).

  /usr/bin/python3 benchmarks/plot_tensorboard.py RUN_DIR/tensorboard --out curves.png
      [--tags "lm loss,lm loss validation,learning-rate,throughput/tokens-per-second"]
"""
import argparse
import json
import os
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--out", default="tensorboard_curves.png")
    parser.add_argument("--tags", default="lm loss,lm loss validation,learning-rate,throughput/tokens-per-second")
    args = parser.parse_args()
    reader = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "monitor", "read_tensorboard.py")
    text = subprocess.run([sys.executable, reader, args.folder], check=True, capture_output=True, text=True).stdout
    tags = args.tags.split(",")
    # step -> value per tag; a later file (a resumed run) replaces what an earlier one held
    # from its START step on, as TensorBoard does.
    series = {tag: {} for tag in tags}
    for line in text.splitlines():
        event = json.loads(line)
        if event.get("session_log") == "START":
            for values in series.values():
                for step in [s for s in values if s >= event["step"]]:
                    del values[step]
        for tag, value in event.get("scalars", {}).items():
            if tag in series:
                series[tag][event["step"]] = value
    fig, axes = plt.subplots(len(tags), 1, figsize=(8, 2.4 * len(tags)), sharex=True)
    for ax, tag in zip(axes, tags):
        steps = sorted(series[tag])
        ax.plot(steps, [series[tag][s] for s in steps], marker="." if len(steps) < 40 else None)
        ax.set_ylabel(tag, fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    fig.suptitle(f"TensorBoard event files of {args.folder}", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}: {', '.join(f'{t} ({len(series[t])} points)' for t in tags)}")


if __name__ == "__main__":
    main()
