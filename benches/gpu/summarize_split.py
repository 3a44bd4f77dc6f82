"""Means of the host/device split trace lines of `tandem bench` (issue16_bench.sh's `split` phase).

Usage: python3 summarize_split.py BENCH.json BENCH.log
One stream: `step started` (MLX's host time to launch a step) and `pipelined step` (building and
starting the next step, then waiting for this one). A batch: `batched plain step` and `batched cycle
split` per stream count, and the commonest operations of each kind of graph. The first quarter of
each group is left out (warm-up).
"""
import collections
import json
import re
import sys

bench = json.load(open(sys.argv[1]))
for g in bench.get("graph_ops", []):
    print(f"graph ops width {g['width']}: {g['ops']} ({', '.join(f'{n} {c}' for n, c in g['by_op'][:8])})")
for r in bench.get("runs", []):
    s = r["stats"]
    print(f"run depth {r['depth']}: decode {s['decode_tok_s']:.1f} tok/s")
for r in bench.get("streams", []):
    print(f"run depth {r['depth']} streams {r['streams']}: aggregate {r['aggregate_tok_s']:.1f} tok/s, acceptance {r['acceptance']}")

groups = collections.defaultdict(list)
ops_seen = {}
pending = []
for line in open(sys.argv[2]):
    line = re.sub(r"\x1b\[[0-9;]*m", "", line)
    fields = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", line)}
    if "operations:" in line:
        pending.append(line.split("operations:", 1)[1].strip()[:240])
        continue
    for tag in ("step started", "pipelined step", "batched plain step", "batched cycle split"):
        if tag in line:
            key = (tag, int(fields.get("streams", 1)), int(fields.get("k", 0)))
            groups[key].append(fields)
            if pending and key not in ops_seen:
                ops_seen[key] = " | ".join(pending)
            pending = []
for key, rows in sorted(groups.items()):
    rows = rows[len(rows) // 4:] or rows
    names = [k for k in rows[0] if k not in ("streams", "k")]
    means = ", ".join(f"{k} {sum(r.get(k, 0) for r in rows) / len(rows):.2f}" for k in names)
    print(f"{key[0]} streams {key[1]} k {key[2]}: {len(rows)} lines, mean {means}")
    if key in ops_seen:
        print(f"  commonest operations: {ops_seen[key]}")
