#!/usr/bin/env python3
"""A benchmark sweep: every point of a grid trained back to back, one launch per point,
one CSV row per point. Inside a Slurm allocation (slurm/sweep.sbatch) each point is an
`srun`; elsewhere an `mpirun` on this machine.

    benchmarks/sweep.py benchmarks/sweeps/cpu_layouts.grid --csv runs/sweep/results.csv

The grid file holds `key = value value ...` lines; the points are every combination of
the values of config, layout (DPxTPxPP), micro_batch, zero and global_batch (a number,
or N*dp: N sequences per data-parallel rank, for weak scaling). steps, flags (extra
trident flags), launcher (srun | mpirun) and timeout_s take one value.

Points already in the CSV are skipped, so a requeued sweep resumes where it stopped.
A point that fails (bad layout, more ranks than the allocation, a crash, a timeout) is
recorded with its error and the sweep goes on. Exit code: 0 when every point has a row,
2 for a bad grid file.

Python 3 standard library only (the plots: benchmarks/plot_sweep.py, matplotlib)."""
import argparse
import csv
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

FIELDS = ["point", "config", "dp", "tp", "pp", "ranks", "micro_batch", "zero", "global_batch", "scaling",
          "status", "tokens_per_s", "mfu", "step_time_s", "memory_gib", "dp_wait", "bubble", "bubble_theory",
          "peak_gflops", "peak_source", "loss_last", "seconds", "error"]
LISTS = {"config", "layout", "micro_batch", "zero", "global_batch"}
SINGLE = {"steps": "10", "flags": "", "launcher": "", "timeout_s": "600"}


def fail(message):
    print(f"sweep: error: {message}", file=sys.stderr)
    sys.exit(2)


def read_grid(path):
    grid = {k: [] for k in LISTS}
    grid.update({"micro_batch": ["0"], "zero": ["0"], "global_batch": ["16"]})
    single = dict(SINGLE)
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        fail(f"cannot read grid '{path}': {e.strerror}")
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, eq, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not value:
            fail(f"{path}:{number}: expected 'key = value ...'")
        if key in LISTS:
            grid[key] = value.split()
        elif key in SINGLE:
            single[key] = value
        else:
            fail(f"{path}:{number}: unknown key '{key}' (known: {', '.join(sorted(LISTS | set(SINGLE)))})")
    for key in ("config", "layout"):
        if not grid[key]:
            fail(f"{path}: no '{key}' line")
    for layout in grid["layout"]:
        if not re.fullmatch(r"[1-9]\d*x[1-9]\d*x[1-9]\d*", layout):
            fail(f"{path}: layout '{layout}': expected DPxTPxPP, e.g. 2x2x1")
    for gb in grid["global_batch"]:
        if not re.fullmatch(r"[1-9]\d*(\*dp)?", gb):
            fail(f"{path}: global_batch '{gb}': expected a number or N*dp")
    return grid, single


def points(grid):
    for config, layout, mb, zero, gb in itertools.product(grid["config"], grid["layout"], grid["micro_batch"],
                                                          grid["zero"], grid["global_batch"]):
        dp, tp, pp = (int(x) for x in layout.split("x"))
        weak = gb.endswith("*dp")
        batch = int(gb[:-3]) * dp if weak else int(gb)
        name = f"{os.path.basename(config).removesuffix('.ini')} {layout} mb{mb} zero{zero} gb{gb}"
        yield {"point": name, "config": config, "dp": dp, "tp": tp, "pp": pp, "ranks": dp * tp * pp,
               "micro_batch": int(mb), "zero": int(zero), "global_batch": batch,
               "scaling": "weak" if weak else "strong"}


def done_points(csv_path):
    if not os.path.exists(csv_path):
        return set()
    with open(csv_path, newline="", encoding="utf-8") as f:
        return {row["point"] for row in csv.DictReader(f)}


def append_row(csv_path, row):
    new = not os.path.exists(csv_path) or os.path.getsize(csv_path) == 0
    with open(csv_path, "a", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            w.writeheader()
        w.writerow({k: row.get(k, "") for k in FIELDS})
        f.flush()
        os.fsync(f.fileno())


def launch_command(launcher, ranks, build):
    if launcher == "srun":
        cmd = ["srun", "--mpi=" + os.environ.get("TRIDENT_SRUN_MPI", "pmix"), "--kill-on-bad-exit=1", "-n", str(ranks)]
        # Fill nodes in order (a small point on as few nodes as it needs, node-local tp).
        per_node = int(os.environ.get("SLURM_NTASKS_PER_NODE", "0").split("(")[0] or 0)
        if per_node > 0:
            cmd += ["-N", str(-(-ranks // per_node)), f"--ntasks-per-node={min(ranks, per_node)}"]
        return cmd + [f"{build}/trident"]
    cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), "-x", "OMP_NUM_THREADS"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + [f"{build}/trident"]


def first_error(output):
    for line in output.splitlines():
        if line.startswith("trident: error:") or line.startswith("trident: rank"):
            return line
    lines = [l for l in output.splitlines() if l.strip()]
    return lines[-1] if lines else ""


def run_point(p, single, build, out_dir, allocation):
    row = dict(p)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", p["point"])
    run_dir = os.path.join(out_dir, "points", slug)
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    if allocation and p["ranks"] > allocation:
        row.update(status="failed", error=f"needs {p['ranks']} ranks, the allocation has {allocation}")
        return row
    launcher = single["launcher"] or ("srun" if "SLURM_JOB_ID" in os.environ else "mpirun")
    cmd = launch_command(launcher, p["ranks"], build) + [
        "train", "--config", p["config"], f"--parallel.dp={p['dp']}", f"--parallel.tp={p['tp']}",
        f"--parallel.pp={p['pp']}", f"--parallel.zero={p['zero']}", f"--train.global_batch={p['global_batch']}",
        f"--train.micro_batch={p['micro_batch']}", f"--train.steps={single['steps']}", f"--log.run_dir={run_dir}",
        "--log.val_every_steps=0", "--log.sample_every_steps=0",
        # A checkpoint folder of the point's own (made afresh above): a config that names
        # one must not resume some other run's checkpoint and measure nothing.
        f"--checkpoint.dir={os.path.join(run_dir, 'checkpoints')}"] + shlex.split(single["flags"])
    start = time.monotonic()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    with open(os.path.join(run_dir, "output.txt"), "w", encoding="utf-8") as log:
        log.write(" ".join(shlex.quote(c) for c in cmd) + "\n")
        log.flush()
        try:
            # A session of its own: on a timeout the launcher and every rank it started go.
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        except OSError as e:
            row.update(status="failed", error=f"cannot start {cmd[0]}: {e.strerror}")
            return row
        try:
            rc = proc.wait(timeout=float(single["timeout_s"]))
        except subprocess.TimeoutExpired:
            rc = None
            for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=grace)
                    break
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    continue
    row["seconds"] = f"{time.monotonic() - start:.1f}"
    output = open(os.path.join(run_dir, "output.txt"), encoding="utf-8", errors="replace").read()
    summary_path = os.path.join(run_dir, "summary.json")
    if rc is None:
        row.update(status="timeout", error=f"no end within timeout_s={single['timeout_s']}")
    elif rc != 0 or not os.path.exists(summary_path):
        row.update(status="failed", error=f"exit {rc}: {first_error(output)}")
    else:
        s = json.load(open(summary_path, encoding="utf-8"))
        if s.get("steps_run", s.get("steady_steps", 0) + 1) == 0 or s.get("tokens_per_s", 0) <= 0:
            row.update(status="failed", error="trained no step")
            return row
        row.update(status="ok", tokens_per_s=f"{s['tokens_per_s']:.1f}", mfu=f"{s['mfu']:.4f}",
                   step_time_s=f"{s['step_time_s']:.4f}", memory_gib=f"{s['memory_gib']:.3f}",
                   dp_wait=f"{s['dp_wait']:.4f}", bubble=f"{s['bubble']:.4f}",
                   bubble_theory=f"{s['bubble_theory']:.4f}", peak_gflops=f"{s['peak_gflops']:.1f}",
                   peak_source=s["peak_source"], loss_last=f"{s['loss_last']:.4f}")
    return row


def print_table(csv_path):
    with open(csv_path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    print("| point | ranks | status | tokens/s | MFU | step (ms) | memory (GiB) | dp wait | bubble (theory) |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        if r["status"] != "ok":
            print(f"| {r['point']} | {r['ranks']} | {r['status']}: {r['error'][:80]} | | | | | | |")
            continue
        print(f"| {r['point']} | {r['ranks']} | ok | {float(r['tokens_per_s']):.0f} | {100 * float(r['mfu']):.1f}% | "
              f"{1000 * float(r['step_time_s']):.1f} | {float(r['memory_gib']):.2f} | {100 * float(r['dp_wait']):.1f}% | "
              f"{100 * float(r['bubble']):.1f}% ({100 * float(r['bubble_theory']):.1f}%) |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grid")
    ap.add_argument("--csv", required=True, help="results, appended to; its points are skipped")
    ap.add_argument("--build", default="build")
    a = ap.parse_args()
    grid, single = read_grid(a.grid)
    out_dir = os.path.dirname(os.path.abspath(a.csv))
    os.makedirs(out_dir, exist_ok=True)
    allocation = int(os.environ.get("SLURM_NTASKS", "0") or 0)
    have = done_points(a.csv)
    every = list(points(grid))
    todo = [p for p in every if p["point"] not in have]
    total = len(every)
    print(f"sweep: {total} points, {total - len(todo)} already in {a.csv}, {len(todo)} to run", flush=True)
    for i, p in enumerate(todo, 1):
        row = run_point(p, single, a.build, out_dir, allocation)
        append_row(a.csv, row)
        detail = (f"{float(row['tokens_per_s']):.0f} tok/s, MFU {100 * float(row['mfu']):.1f}%"
                  if row["status"] == "ok" else row["error"])
        print(f"sweep: [{i}/{len(todo)}] {p['point']} ({p['ranks']} ranks): {row['status']}: {detail}", flush=True)
    print_table(a.csv)


if __name__ == "__main__":
    main()
