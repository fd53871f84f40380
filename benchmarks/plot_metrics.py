#!/usr/bin/python3
"""Loss curves from trident's metrics.jsonl files, as a PNG.

    /usr/bin/python3 benchmarks/plot_metrics.py runs/tiny/metrics.jsonl [more.jsonl ...] --out loss.png

Needs Debian's python3-matplotlib (apt-get install python3-matplotlib). Tooling only:
nothing on the training path uses Python."""
import argparse, json
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

p = argparse.ArgumentParser()
p.add_argument("files", nargs="+")
p.add_argument("--out", default="loss.png")
p.add_argument("--entropy", type=float, default=None, help="draw the corpus' unigram entropy (nats)")
a = p.parse_args()
fig, (loss_ax, speed_ax) = plt.subplots(1, 2, figsize=(11, 4))
for path in a.files:
    rows = [json.loads(line) for line in open(path)]
    steps = [r for r in rows if "loss" in r]
    val = [r for r in rows if "val_loss" in r]
    loss_ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], label=f"train ({path})")
    if val:
        loss_ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o--", label=f"validation ({path})")
    speed_ax.plot([r["step"] for r in steps], [r["tokens_per_s"] for r in steps], label=path)
if a.entropy:
    loss_ax.axhline(a.entropy, color="gray", linestyle=":", label="unigram entropy")
loss_ax.set(xlabel="step", ylabel="loss (nats)", title="loss")
speed_ax.set(xlabel="step", ylabel="tokens/s", title="throughput")
loss_ax.legend(fontsize=7)
speed_ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(a.out, dpi=100)
print("wrote", a.out)
