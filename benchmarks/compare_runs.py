#!/usr/bin/python3
"""benchmarks/bit_identity.sh's comparison of two folders of runs: verify's figures
(timings aside), the logged steps' loss, norm and lr, and every checkpoint dataset, bitwise.
Prints each difference; exit 1 if there is one."""
import glob, json, os, re, sys

import h5py

base, new = sys.argv[1], sys.argv[2]
differences = 0


def figures(path):
    """The lines of a run's output that carry no timing."""
    timing = re.compile(r'(\d+\.\d+ s\b|GFLOP|tokens/s|tok/s|MiB|GiB|setup|ETA|seconds|ms\b|threads)')
    return [line for line in open(path, errors='replace') if not timing.search(line)]


def steps(folder):
    out = []
    path = os.path.join(folder, 'run', 'metrics.jsonl')
    if not os.path.exists(path):
        return out
    for line in open(path):
        j = json.loads(line)
        out.append({k: j[k] for k in ('step', 'loss', 'val_loss', 'grad_norm', 'lr') if k in j})
    return out


def datasets(path):
    names = []
    with h5py.File(path, 'r') as f:
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        return {n: f[n][()].tobytes() for n in names}


def verify_runs(folder):
    """Each verify run's output file by its layout line (layouts.txt, in run order): a
    layout added or removed between the two folders shifts no other's pairing."""
    layouts = open(os.path.join(folder, 'layouts.txt')).read().splitlines()
    return {layout: os.path.join(folder, f'verify_{i}.txt') for i, layout in enumerate(layouts)}


base_runs, new_runs = verify_runs(base), verify_runs(new)
verify = list(base_runs)
for layout, a in base_runs.items():
    b = new_runs.get(layout)
    if b is None or figures(a) != figures(b):
        differences += 1
        print('verify differs:', layout)
trains = sorted(d for d in glob.glob(os.path.join(base, 'train_*')) if os.path.isdir(d))
for a in trains:
    b = os.path.join(new, os.path.basename(a))
    if steps(a) != steps(b) or not steps(a):
        differences += 1
        print('logged steps differ:', os.path.basename(a))
    for file in sorted(glob.glob(os.path.join(a, 'ckpt', 'step_*', 'node_*.h5'))):
        other = file.replace(a, b, 1)
        if not os.path.exists(other) or datasets(file) != datasets(other):
            differences += 1
            print('checkpoint differs:', os.path.relpath(file, base))
print(f'{len(verify)} verify runs, {len(trains)} training runs compared: {differences} differences')
sys.exit(1 if differences else 0)
