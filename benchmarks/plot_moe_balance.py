#!/usr/bin/python3
"""Expert load per MoE layer over a run, from trident's metrics.jsonl files, as a PNG: for
each run, each layer's most loaded expert over the mean expert (1: balanced), and the loss.

    /usr/bin/python3 benchmarks/plot_moe_balance.py a/metrics.jsonl b/metrics.jsonl --labels A B --out load.png

Needs Debian's python3-matplotlib. Tooling only: nothing on the training path uses Python."""
import argparse, json
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

p = argparse.ArgumentParser()
p.add_argument("files", nargs="+")
p.add_argument("--labels", nargs="+", default=None)
p.add_argument("--out", default="moe_balance.png")
a = p.parse_args()
labels = a.labels or a.files
fig, axes = plt.subplots(1, len(a.files) + 1, figsize=(5 * (len(a.files) + 1), 4), sharey=False)
top = 1.0
for ax, path, label in zip(axes, a.files, labels):
    rows = [json.loads(line) for line in open(path)]
    steps = [r for r in rows if "expert_load_per_layer" in r]
    for layer in range(len(steps[0]["expert_load_per_layer"])):
        loads = [r["expert_load_per_layer"][layer] for r in steps]
        top = max(top, max(loads))
        ax.plot([r["step"] for r in steps], loads, label=f"layer {layer}")
    ax.axhline(1.0, color="gray", linestyle=":", label="balanced")
    ax.set(xlabel="step", ylabel="most loaded expert / mean", title=label)
    ax.legend(fontsize=7)
    axes[-1].plot([r["step"] for r in steps], [r["loss"] for r in steps], label=label)
for ax in axes[:-1]:
    ax.set_ylim(0.9, top * 1.05)
axes[-1].set(xlabel="step", ylabel="loss (nats)", title="loss")
axes[-1].legend(fontsize=7)
fig.tight_layout()
fig.savefig(a.out, dpi=100)
print("wrote", a.out)
