#!/usr/bin/env bash
# Two builds of `tandem` alternated on this machine, ROUNDS rounds (default 4), each run a `tandem bench` over
# tandem-tiny: one and two streams, plain and MTP at depth 3, oracle acceptance 0.8 (override with BENCH_ARGS).
# Prints each run's four figures (tok/s: plain 1, MTP 1, plain 2, MTP 2) and per build their medians and the
# median of MTP 2 / MTP 1 (issue 22's ratio). A CPU VM's single runs can differ two-fold; only alternation over
# several rounds shows a 10 % effect (docs/PERF.md, session 26).
#   usage: benches/ab_cpu.sh BIN_A BIN_B        e.g. target/release/tandem target/release/tandem-old
set -euo pipefail
A=${1:?usage: ab_cpu.sh BIN_A BIN_B}
B=${2:?usage: ab_cpu.sh BIN_A BIN_B}
ROUNDS=${ROUNDS:-4}
MODEL=${MODEL:-assets/models/tandem-tiny}
BENCH_ARGS=${BENCH_ARGS:---prompt-tokens 128 --gen-tokens 512 --streams 1,2 --depths 0,3 --oracle-acceptance 0.8}
for _ in $(seq "$ROUNDS"); do
  for bin in "$A" "$B"; do
    # shellcheck disable=SC2086
    figures=$("$bin" bench --model "$MODEL" $BENCH_ARGS 2>&1 | grep '^streams' | awk '{print $6}' | paste -sd' ')
    echo "$bin $figures"
  done
done | python3 -c '
import collections, statistics as st, sys
runs = collections.defaultdict(list)
for line in sys.stdin:
    print(line.rstrip())
    name, *figures = line.split()
    if len(figures) == 4:
        runs[name].append([float(f) for f in figures])
for name, rows in runs.items():
    med = [st.median(col) for col in zip(*rows)]
    ratio = st.median(r[3] / r[1] for r in rows)
    print(f"{name}: plain1 {med[0]:.0f} mtp1 {med[1]:.0f} plain2 {med[2]:.0f} mtp2 {med[3]:.0f} "
          f"mtp2/mtp1 {ratio:.2f} ({len(rows)} runs)")
'
