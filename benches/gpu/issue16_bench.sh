#!/usr/bin/env bash
# Issue 16's measurements on the lent H200 in as few calls as the carry limit allows, by phases:
#   gen      the 27B-shaped random slice (benches/gpu/random_qwen35.py --preset 27b-slice, torch only: runs
#            before MLX has arrived) into /tmp/s27; SLICE_DIR and GEN_ARGS: another shape in another folder
#            for every phase (e.g. GEN_ARGS="--preset 27b-slice --hidden 1024 --intermediate 3072": the same
#            layers and operations with a tenth of the bytes, where the host's part of a step stands alone)
#   setup    MLX's CUDA wheel, mlx, mlx-lm (as benches/gpu/cuda_bench.sh's header says) into /tmp/site
#   kernels  the gated-delta kernel's Python parity and timings (benches/gpu/gdn_kernel.py)
#   rust     the Rust suite's kernels:: tests (.devcarry/it.xz: the integration-test binary built on the CPU
#            machine, stripped), then the gated-delta selection test under TANDEM_KERNELS=off
#   dmm      the dense matmul kernel's Python parity and timings (benches/gpu/dmm_kernel.py)
#   convert  4-bit and 8-bit conversions of the slice by `tandem convert`
#   q4 q8 bf16  per format, 512-token prompt and 512 generated, greedy: `tandem bench` with oracle
#            acceptance 0.8 at depths 1 and 3 (depth 0 is plain decoding), the same without the
#            gated-delta kernel (TANDEM_KERNELS=-gated_delta), oracle 0.0 at depth 3 fixed and adaptive,
#            then mlx-lm on the same files
#   repeat   plain decoding, Tandem and mlx-lm alternated, two more rounds per format (FORMATS, default q4 q8 bf16)
#   ab       plain decoding in 4-bit (FORMATS), alternated for two rounds: Tandem as built, Tandem under AB_ENV
#            (default TANDEM_KERNELS=-qmm_narrow: the quantized matmul in its one pre-session-17 launch shape)
#            or, with AB_BIN (a file in .devcarry/, xz-compressed like tandem.xz), another build, then mlx-lm;
#            AB_ARGS replaces the bench arguments (default --depths 0)
#   dense    bf16 only, with and without the dense matmul kernel (TANDEM_KERNELS=-dense_matmul), alternated:
#            oracle acceptance 0.8 at depths 1 and 3 and plain decoding, twice each (no mlx-lm)
#   streams  issue 22: the 4-bit and bf16 slices, 512-token prompts, 256 generated per stream: `tandem bench
#            --streams 1,2,4,8` plain and at depth 3 with oracle acceptance 0.8 (drafts from the plain batch's
#            tokens), then depth 3 adaptive at oracle 0.0 (ADAPTIVE=0 leaves that out)
#   slabs    the quantized matmul past 8 rows, all slabs in one block against a block per slab (abstreams, 4-bit;
#            ROUNDS rounds, default 2)
#   dslabs   the dense matmul past 8 rows, all slabs in one block (the default since session 22) against a block per
#            slab (TANDEM_KERNELS=-dmm_slabs; abstreams, bf16)
#   abstreams  this build against itself under AB_ENV, or another build (AB_BIN, a file in .devcarry/ xz-compressed
#            like tandem.xz) under AB_ENV, alternated for ROUNDS rounds (default 2): FORMATS (default q4), 512-token
#            prompts, 256 generated a stream, MTP depth 3, oracle 0.8, 1 / 2 / 4 / 8 streams
#            (AB_STREAMS: other stream counts; AB_RUN: other bench arguments, AB_TAG: their name in the results)
#   abzero   abstreams for the adaptive controller where no draft lands: oracle 0.0, depth 3 adaptive
#   writes   issue 16: the MTP head's catch-ups and prompt pairs as cache writes on CUDA (TANDEM_HEAD_WRITES=N for
#            N in WRITES, default "16 32") against whole passes (N = 0), adaptive at oracle 0.0, 4-bit, ROUNDS rounds
#   mtptrace issue 16: where one stream's MTP cycle goes, 4-bit, depth 3, oracle 0.8, 256 generated (the `mtp: cycle`
#            trace lines: the cycle, its drafts' build and launch, the verify's wait and read, means past the first quarter)
#   cycles   issue 22: where a batched MTP cycle's time goes, 4-bit slice, depth 3, oracle 0.8, 2 / 4 / 8 streams
#            (the `batched cycle (ms)` debug lines of generate::batch, averaged per stream count)
#   early    model::launch (a forward's layers started while the rest is built) A/B, FORMATS (default bf16):
#            this build, the same under TANDEM_NO_EARLY_LAUNCH=1, and AB_BIN if given; 1 and 8 streams, plain
#            and depth 3 at oracle acceptance 0.8, 512-token prompts, 256 generated per stream
#   split    issues 16 and 22: host against device time per step (Tandem's trace, mlx-lm by benches/host_split.py),
#            one stream in 4-bit and bf16, then batched plain steps and cycles (drafts, verify) at 2 / 4 / 8 streams
#   hostprof where the host's time goes in a plain 4-bit step: `tandem bench` decodes a long run while cuda-gdb
#            attaches SAMPLES times (default 40) and takes every thread's backtrace; the decoding thread's frames
#            are counted (self and inclusive, benches/gpu/host_profile.py). PROF_ENV: extra environment;
#            PROF_ARGS: other bench arguments (default --depths 0; an MTP run decodes its plain oracle first)
#   hostcost MLX's own host cost per operation on CUDA (benches/gpu/mlx_host_cost.py): elementwise ops,
#            reshapes and custom kernels with a tiny and a 16 KB header, with CUDA graphs on and off
#   knobs    MLX's CUDA graph settings (MLX_USE_CUDA_GRAPHS, MLX_MAX_OPS_PER_BUFFER, MLX_MAX_MB_PER_BUFFER: how
#            many kernels and bytes one CUDA graph takes before MLX launches it), 4-bit slice, 256 generated:
#            Tandem plain and at depth 3 oracle 0.8, then mlx-lm, under each setting in KNOBS
#   qmm      the quantized matmul kernel's device time per launch shape (R, KS, U, P, S) on the slice's fused
#            projections, 4 and 8 bits, M = 1, 4, 8, 32, by Nsight Compute (benches/gpu/qmm_device.py; VARIANTS,
#            QMM_MS and QMM_BITS change the launch shapes, Ms and bit widths)
#   ahead    the next MTP cycle built while a verify runs (TANDEM_CYCLE_AHEAD=off | always | judged, the
#            default), FORMATS (default q4 bf16): oracle acceptance 0.8 at depths 1 and 3 and plain decoding under
#            each, oracle 0.0 at depth 3 adaptive (judged), then mlx-lm on the same files
#   judge    the cycles of one 4-bit run at depth 1, oracle 0.8, 256 generated, built ahead always and judged
#            (per-cycle trace lines in the .err files: what the judge's trials measured against the whole run)
#   vs       plain decoding against mlx-lm, one round per format in FORMATS (default q8 bf16)
#   prefix   issue 21: the 4-bit slice, a 32,000-token turn 1 and a 64-token reply: turn 2's time to first
#            token cold and restored from the SSD tier (`--prefix-cache --prefix-disk`, a fresh memory tier over
#            turn 1's files), and the bytes each turn wrote
# Each call copies what it carries of .devcarry/ to /tmp/keep, so parts may come in earlier calls on the
# same warm machine (the working tree is ~30 MB, so the MLX wheel travels in 25 MiB parts, `split -b 25M`, one
# a call: `gen` carries partaa and tandem.xz, a bare copy call partab and the two wheels, `setup ...` partac;
# .devcarry/it.xz, for `rust`, whenever it fits). On the device, phases must follow within the machine's 30 s
# warm time, or /tmp (the slice, the conversions, MLX) is gone. Results: $OUT gets two files, summary.txt
# (appended as each run ends) and raw.tgz (the JSON, logs and traces under /tmp/raw, re-tarred after every phase,
# so a call cut off at its limit still returns what its finished phases wrote; the device returns few files).
set -uo pipefail
DEST=${OUT:-/tmp/out}
OUT=/tmp/raw
PHASES=${*:-gen setup kernels rust convert q4 q8 bf16}
mkdir -p /tmp/site /tmp/keep "$OUT" "$DEST" target/release
cp -n .devcarry/* /tmp/keep/ 2>/dev/null || true
M=${SLICE_DIR:-/tmp/s27}  # another folder (with GEN_ARGS) for another shape, e.g. a narrow slice
ARGS="--prompt-tokens 512 --gen-tokens 512"
B=/tmp/keep/tandem
S="$DEST/summary.txt"
env_setup() {
  export PYTHONPATH=/tmp/site MLX_PTX_CACHE_DIR=/tmp/ptx
  NV=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))')/nvidia
  export LD_LIBRARY_PATH=/tmp/site/mlx/lib:$(find "$NV" -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd:)
  [ -x $B ] || { xz -dc /tmp/keep/tandem.xz > $B && chmod +x $B; }
  cp $B target/release/tandem  # benches/vs_mlx_lm.py runs target/release/tandem
}
model_for() {  # a format (q4, q8, bf16): MODEL is its folder
  case $1 in q4) MODEL=$M-4bit ;; q8) MODEL=$M-8bit ;; bf16) MODEL=$M ;; esac
}
bench() {  # tag, then tandem bench arguments; extra environment in ENVS, another binary in BIN
  local tag=$1; shift
  env $ENVS ${BIN:-$B} bench --model "$MODEL" $ARGS "$@" --json > "$OUT/$tag.json" 2> "$OUT/$tag.err" || tail -5 "$OUT/$tag.err"
  python3 benches/gpu/summarize_bench.py "$OUT/$tag.json" | sed "s|^|$tag |" | tee -a "$S"
}
mlx_lm() {  # tag
  python3 benches/vs_mlx_lm.py "$MODEL" $ARGS --mlx-lm-only 2>&1 | tail -1 | sed "s|^|$1 |" | tee -a "$S"
}
ab_streams() {  # abstreams: this build (tags ...-a-...) against OTHER under AB_ENV (tags ...-b-...)
  env_setup
  local other=$B f round
  if [ -n "${AB_BIN:-}" ]; then
    other=/tmp/keep/$AB_BIN.bin
    [ -x "$other" ] || { xz -dc "/tmp/keep/$AB_BIN" > "$other" && chmod +x "$other"; }
  fi
  ARGS="--prompt-tokens 512 --gen-tokens 256"
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for f in ${FORMATS:-q4}; do
      model_for $f
      # shellcheck disable=SC2086
      ENVS= bench s27-$f-a-${AB_TAG:-streams}-r$round --streams ${AB_STREAMS:-1,2,4,8} ${AB_RUN:---depths 3 --oracle-acceptance 0.8}
      # shellcheck disable=SC2086
      ENVS=${AB_ENV:-} BIN=$other bench s27-$f-b-${AB_TAG:-streams}-r$round --streams ${AB_STREAMS:-1,2,4,8} ${AB_RUN:---depths 3 --oracle-acceptance 0.8}
    done
  done
  ARGS="--prompt-tokens 512 --gen-tokens 512"
}
for phase in $PHASES; do
  echo "== $phase $(date +%T)"
  case $phase in
  gen)
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$S"
    # shellcheck disable=SC2086
    [ -d $M ] || time python3 benches/gpu/random_qwen35.py $M ${GEN_ARGS:---preset 27b-slice}
    ;;
  setup)
    cat /tmp/keep/mlxcuda.tar.xz.part* | xz -d | tar x -C /tmp/site
    for w in /tmp/keep/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
    env_setup
    python3 -c 'import mlx.core as mx, mlx_lm; print("mlx", mx.__version__, mx.default_device(), "mlx-lm", mlx_lm.__version__)' | tee -a "$S"
    ;;
  kernels)
    env_setup
    PYTHONUNBUFFERED=1 python3 benches/gpu/gdn_kernel.py 2>&1 | tee "$OUT/gdn_kernel.txt" | tee -a "$S"
    ;;
  dmm)
    env_setup
    PYTHONUNBUFFERED=1 python3 benches/gpu/dmm_kernel.py 2>&1 > "$OUT/dmm_kernel.txt"
    grep -E "^parity|^time|FAIL|passed|sum over" "$OUT/dmm_kernel.txt" | tee -a "$S"
    ;;
  rust)
    env_setup
    if [ -e /tmp/keep/it.xz ]; then
      mkdir -p /tmp/itbin/deps && xz -dc /tmp/keep/it.xz > /tmp/itbin/deps/it && chmod +x /tmp/itbin/deps/it
      ln -sfn /tmp/site/mlx /tmp/itbin/mlx
      # The binary finds the repository (tandem-tiny) at the path it was built in (the main checkout or a
      # helper's worktree).
      for d in /work/main /work/wt/gpu; do [ -e $d/assets ] || { mkdir -p "$(dirname $d)" && ln -sfn "$PWD" $d; }; done
      if [ -n "${RUST_TESTS:-}" ]; then  # only these tests (a filter), e.g. RUST_TESTS=attention_kernel::
        /tmp/itbin/deps/it $RUST_TESTS --test-threads 1 --nocapture > "$OUT/rust_kernels.txt" 2>&1
        grep -E "parity|selected|SKIPPED|test result|panicked|FAILED|depth|compute capability|probe" "$OUT/rust_kernels.txt" | tee -a "$S"
        continue
      fi
      (/tmp/itbin/deps/it kernels:: gated_delta_kernel:: --test-threads 1 --nocapture 2>&1; \
       TANDEM_KERNELS=off /tmp/itbin/deps/it gated_delta_kernel::gated_delta_cuda_selected --nocapture 2>&1; \
       TANDEM_KERNELS=-dense_matmul /tmp/itbin/deps/it kernels::dmm_cuda_selected --nocapture 2>&1) \
        > "$OUT/rust_kernels.txt"
      grep -E "parity|selected|SKIPPED|test result|panicked|FAILED|depth|compute capability|dmm" "$OUT/rust_kernels.txt" | tee -a "$S"
    fi
    ;;
  convert)
    env_setup
    for bits in ${BITS:-4 8}; do
      [ -d $M-${bits}bit ] || { time $B convert $M --out $M-${bits}bit --bits $bits --group-size 64 > /dev/null; }
    done
    ;;
  q4 | q8 | bf16)
    env_setup
    case $phase in q4) MODEL=$M-4bit ;; q8) MODEL=$M-8bit ;; bf16) MODEL=$M ;; esac
    ENVS= bench s27-$phase-oracle08 --depths 0,1,3 --oracle-acceptance 0.8
    ENVS=TANDEM_KERNELS=-gated_delta bench s27-$phase-oracle08-nogdn --depths 0,1,3 --oracle-acceptance 0.8
    ENVS= bench s27-$phase-oracle00 --depths 0,3 --oracle-acceptance 0.0 --adaptive
    mlx_lm s27-$phase-mlx-lm
    ;;
  ab)
    env_setup
    for round in 1 2; do
      for f in ${FORMATS:-q4}; do
        model_for $f
        ENVS= bench s27-$f-a-r$round ${AB_ARGS:---depths 0}
        if [ -n "${AB_BIN:-}" ]; then
          [ -x /tmp/keep/b-bin ] || { xz -dc "/tmp/keep/$AB_BIN" > /tmp/keep/b-bin && chmod +x /tmp/keep/b-bin; }
          ENVS= BIN=/tmp/keep/b-bin bench s27-$f-b-r$round ${AB_ARGS:---depths 0}
        else
          ENVS=${AB_ENV:-TANDEM_KERNELS=-qmm_narrow} bench s27-$f-b-r$round ${AB_ARGS:---depths 0}
        fi
        mlx_lm s27-$f-mlx-lm-ab-r$round
      done
    done
    ;;
  early)
    env_setup
    for f in ${FORMATS:-bf16}; do
      model_for $f
      ARGS="--prompt-tokens 512 --gen-tokens 256"
      ENVS= bench s27-$f-early --streams 1,8 --depths 0,3 --oracle-acceptance 0.8
      ENVS=TANDEM_NO_EARLY_LAUNCH=1 bench s27-$f-lazy --streams 1,8 --depths 0,3 --oracle-acceptance 0.8
      if [ -n "${AB_BIN:-}" ]; then
        [ -x /tmp/keep/b-bin ] || { xz -dc "/tmp/keep/$AB_BIN" > /tmp/keep/b-bin && chmod +x /tmp/keep/b-bin; }
        ENVS= BIN=/tmp/keep/b-bin bench s27-$f-b --streams 1,8 --depths 0,3 --oracle-acceptance 0.8
      fi
    done
    ARGS="--prompt-tokens 512 --gen-tokens 512"
    ;;
  ahead)
    env_setup
    for f in ${FORMATS:-q4 bf16}; do
      model_for $f
      for mode in off always judged; do
        ENVS="TANDEM_CYCLE_AHEAD=$mode RUST_LOG=tandem::generate::mtp=debug" \
          bench s27-$f-ahead-$mode --depths 0,1,3 --oracle-acceptance 0.8
        # Cycles built ahead and kept, per run (warm-ups included), and what the judge measured.
        grep -a "built ahead" "$OUT/s27-$f-ahead-$mode.err" | sed 's/\x1b\[[0-9;]*m//g; s/.*mtp: //' \
          | sed "s|^|$f $mode |" | tee -a "$S"
      done
      ENVS= bench s27-$f-ahead-oracle00 --depths 0,3 --oracle-acceptance 0.0 --adaptive
      mlx_lm s27-$f-mlx-lm
    done
    ;;
  judge)
    env_setup
    MODEL=$M-4bit
    ARGS="--prompt-tokens 512 --gen-tokens 256"
    for mode in always judged; do
      ENVS="TANDEM_CYCLE_AHEAD=$mode RUST_LOG=tandem::generate::mtp=trace" \
        bench s27-q4-judge-$mode --depths 1 --oracle-acceptance 0.8
    done
    ARGS="--prompt-tokens 512 --gen-tokens 512"
    ;;
  vs)
    env_setup
    for f in ${FORMATS:-q8 bf16}; do
      model_for $f
      ENVS= bench s27-$f-vs-plain --depths 0
      mlx_lm s27-$f-vs-mlx-lm
    done
    ;;
  dense)
    env_setup
    MODEL=$M
    for round in 1 2; do
      ENVS= bench s27-bf16-dmm-r$round --depths 0,1,3 --oracle-acceptance 0.8
      ENVS=TANDEM_KERNELS=-dense_matmul bench s27-bf16-nodmm-r$round --depths 0,1,3 --oracle-acceptance 0.8
    done
    ;;
  streams)
    env_setup
    for f in ${FORMATS:-q4 bf16}; do
      model_for $f
      ARGS="--prompt-tokens 512 --gen-tokens 256"
      ENVS= bench s27-$f-streams-oracle08 --streams 1,2,4,8 --depths 0,3 --oracle-acceptance 0.8
      [ "${ADAPTIVE:-1}" = 0 ] || ENVS= bench s27-$f-streams-oracle00-adaptive --streams 1,2,4,8 --depths 0,3 --oracle-acceptance 0.0 --adaptive
    done
    ARGS="--prompt-tokens 512 --gen-tokens 512"
    ;;
  slabs)
    # The quantized matmul past 8 rows: every 8-row slab in one block (the default since session 21) against a
    # block per slab: abstreams on the 4-bit slice under TANDEM_KERNELS=-qmm_slabs.
    FORMATS=q4 AB_BIN= AB_ENV=TANDEM_KERNELS=-qmm_slabs ab_streams
    ;;
  dslabs)
    # The dense matmul past 8 rows, the same way: abstreams on the bf16 slice under TANDEM_KERNELS=-dmm_slabs.
    FORMATS=bf16 AB_BIN= AB_ENV=TANDEM_KERNELS=-dmm_slabs ab_streams
    ;;
  abstreams)
    ab_streams
    ;;
  abzero)
    # The adaptive controller where no draft lands: abstreams at oracle acceptance 0.0, depth 3 adaptive (each run
    # measures plain decoding at every stream count first, so each build's ratio is against its own plain steps).
    AB_TAG=zero AB_RUN="--depths 3 --oracle-acceptance 0.0 --adaptive" ab_streams
    ;;
  writes)
    # The MTP head's catch-up and prompt pairs written into its cache (no attention or MLP for pairs whose output
    # nobody reads) on CUDA too, in passes of at most N pairs (TANDEM_HEAD_WRITES=N, WRITES: the Ns, default
    # "16 32"), against whole head passes (TANDEM_HEAD_WRITES=0; 16 is the default since session 27): the 4-bit slice, one stream, oracle 0.0 at depth 3
    # adaptive (parks, then probes that catch up), 512-token prompt, 256 generated, ROUNDS rounds alternated. Each
    # run's trace gives its catch-ups (count, first, median, max ms) beside its tok/s against plain.
    env_setup
    MODEL=$M-4bit
    ARGS="--prompt-tokens 512 --gen-tokens 256"
    for round in $(seq 1 "${ROUNDS:-2}"); do
      for w in 0 ${WRITES:-16 32}; do
        tag=s27-q4-writes$w-r$round
        ENVS="RUST_LOG=tandem::generate::mtp=trace TANDEM_HEAD_WRITES=$w" bench $tag --depths 3 --oracle-acceptance 0.0 --adaptive
        python3 - "$OUT/$tag.err" <<'PY' | sed "s|^|$tag |" | tee -a "$S"
import re, statistics as st, sys
ups = []
for line in open(sys.argv[1], errors="replace"):
    line = re.sub(r"\x1b\[[0-9;]*m", "", line)
    m = re.search(r"catch_up_ms=([\d.]+)", line)
    if "mtp: cycle" in line and m and float(m.group(1)) > 0:
        ups.append(float(m.group(1)))
if ups:
    print(f"catch-ups {len(ups)}: first {ups[0]:.1f} ms, median {st.median(ups):.1f}, max {max(ups):.1f}, all {sum(ups):.0f} ms")
else:
    print("no catch-ups traced")
# Where the adaptive run's time goes (the last run of the bench: its "cycles built ahead" line ends each run):
# parked steps (the first after a cycle apart: no step ran ahead of it) and cycles, ms from the previous
# step's return.
runs = [[]]
for line in open(sys.argv[1], errors="replace"):
    line = re.sub(r"\x1b\[[0-9;]*m", "", line)
    if "mtp: cycles built ahead" in line:
        runs.append([])
    else:
        runs[-1].append(line)
parked, after_cycle, cycles, prev = [], [], [], None
for line in (runs[-2] if len(runs) > 1 else []):
    m = re.search(r" ms=([\d.]+)", line)
    if not m:
        continue
    if "mtp: parked step" in line:
        (after_cycle if prev == "cycle" else parked).append(float(m.group(1)))
        prev = "parked"
    elif "mtp: cycle" in line:
        cycles.append(float(m.group(1)))
        prev = "cycle"
shadows = [dict(re.findall(r"(pending|ops|ms)=([\d.]+)", l)) for l in (runs[-2] if len(runs) > 1 else [])
           if "shadow drafts started" in l]
if shadows:
    print("shadow probes (pairs pending, operations, host ms): "
          + ", ".join(f"{s.get('pending')}/{s.get('ops')}/{float(s.get('ms', 0)):.1f}" for s in shadows))
if parked:
    print(f"parked steps {len(parked)}: mean {st.mean(parked):.3f} ms, median {st.median(parked):.3f}, sum {sum(parked):.0f}; "
          f"first after a cycle {len(after_cycle)}: mean {st.mean(after_cycle or [0]):.3f}; "
          f"cycles {len(cycles)}: mean {st.mean(cycles or [0]):.3f}, sum {sum(cycles):.0f} ms")
PY
      done
    done
    ARGS="--prompt-tokens 512 --gen-tokens 512"
    ;;
  mtptrace)
    env_setup
    RUST_LOG=tandem::generate::mtp=trace $B bench --model $M-4bit --prompt-tokens 512 --gen-tokens 256 \
      --depths 0,3 --oracle-acceptance 0.8 --json > "$OUT/mtptrace.json" 2> "$OUT/mtptrace.log"
    python3 benches/gpu/summarize_bench.py "$OUT/mtptrace.json" | sed "s|^|mtptrace |" | tee -a "$S"
    python3 - "$OUT/mtptrace.log" <<'PY' | tee -a "$S"
import re, sys
rows = []
for line in open(sys.argv[1]):
    line = re.sub(r"\x1b\[[0-9;]*m", "", line)
    if "mtp: cycle k=" in line:
        rows.append({k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", line)})
rows = rows[len(rows) // 4:]
if rows:
    keys = ["ms", "draft_ms", "verify_ms", "accepted"]
    print(f"one stream: {len(rows)} cycles, means " + ", ".join(f"{k} {sum(r[k] for r in rows) / len(rows):.3f}" for k in keys))
PY
    ;;
  cycles)
    env_setup
    RUST_LOG=tandem::generate::batch=debug $B bench --model $M-4bit --prompt-tokens 512 --gen-tokens 128 \
      --streams 2,4,8 --depths 3 --oracle-acceptance 0.8 --json > "$OUT/cycles.json" 2> "$OUT/cycles.log"
    python3 - "$OUT/cycles.log" <<'PY' | tee -a "$S"
import re, sys, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if "batched cycle (ms)" not in line:
        continue
    f = dict(re.findall(r"(\w+)=([\d.]+)", re.sub(r"\x1b\[[0-9;]*m", "", line)))
    if f.get("k") == "3":
        rows[f["streams"]].append({k: float(v) for k, v in f.items()})
for b, rs in sorted(rows.items(), key=lambda x: int(x[0])):
    rs = rs[len(rs) // 4:]  # past the warm-up
    keys = ["draft_build", "verify_build", "eval", "decide", "commit", "after"]
    print(f"streams {b}: {len(rs)} cycles, mean ms " + ", ".join(f"{k} {sum(r[k] for r in rs) / len(rs):.2f}" for k in keys))
PY
    ;;
  split)
    # Host against device: per step, MLX's host work (building and launching kernels, until async_eval
    # returns) and the wait for the device, Tandem (trace lines) and mlx-lm (benches/host_split.py), one
    # stream; then a batched plain step and a batched cycle's drafts and verify at 2 / 4 / 8 streams
    # (4-bit, depth 3, oracle 0.8), with their operation counts and the commonest operations.
    env_setup
    for f in ${FORMATS:-q4 bf16}; do
      model_for $f
      RUST_LOG=tandem::generate::step=trace $B bench --model $MODEL --prompt-tokens 512 --gen-tokens 256 \
        --depths 0 --json > "$OUT/split-$f.json" 2> "$OUT/split-$f.log"
      python3 benches/gpu/summarize_split.py "$OUT/split-$f.json" "$OUT/split-$f.log" | sed "s|^|$f tandem |" | tee -a "$S"
      python3 benches/host_split.py $MODEL --prompt-tokens 512 --gen-tokens 256 2>&1 | tail -1 | sed "s|^|$f |" | tee -a "$S"
    done
    RUST_LOG=tandem::generate::batch=trace $B bench --model $M-4bit --prompt-tokens 512 --gen-tokens 96 \
      --streams 2,4,8 --depths 0,3 --oracle-acceptance 0.8 --json > "$OUT/split-batch.json" 2> "$OUT/split-batch.log"
    python3 benches/gpu/summarize_split.py "$OUT/split-batch.json" "$OUT/split-batch.log" | sed "s|^|q4 batch |" | tee -a "$S"
    ;;
  qmm)
    env_setup
    timeout ${NCU_TIMEOUT:-400} ncu --clock-control none --kernel-name regex:tandem_qmm \
      --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed --csv \
      python3 benches/gpu/qmm_device.py run --manifest "$OUT/qmm-labels.json" ${VARIANTS:+--variants "$VARIANTS"} \
      ${QMM_MS:+--ms "$QMM_MS"} ${QMM_BITS:+--bits "$QMM_BITS"} \
      > "$OUT/qmm-ncu.csv" 2> "$OUT/qmm-ncu.err"
    grep -E "PARITY|SAME-BITS|launches|rror" "$OUT/qmm-ncu.err" | tee -a "$S"
    python3 benches/gpu/qmm_device.py summarize "$OUT/qmm-ncu.csv" "$OUT/qmm-labels.json" | tee "$OUT/qmm-device.txt" | tee -a "$S"
    ;;
  ncu)
    # Device time per plain step: Nsight Compute's duration of 1000 kernels well inside decoding (past
    # prefill and warm-up), Tandem and mlx-lm, per step = per argmax launch (one a step in both). SKIP,
    # COUNT (kernels skipped, profiled), WHO (the engines) and NCU_TIMEOUT (seconds per engine) change the
    # defaults. Tandem's default skip is larger: at 120,000 its run was still in prefill (session 16).
    env_setup
    for who in ${WHO:-tandem mlxlm}; do
      case $who in
        tandem) cmd="$B bench --model $M-4bit --prompt-tokens 512 --gen-tokens 256 --depths 0"; skip=${SKIP:-200000} ;;
        mlxlm) cmd="python3 benches/host_split.py $M-4bit --prompt-tokens 512 --gen-tokens 256"; skip=${SKIP:-120000} ;;
      esac
      timeout ${NCU_TIMEOUT:-280} ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip $skip \
        --launch-count ${COUNT:-1000} --csv $cmd > "$OUT/ncu-$who.csv" 2> "$OUT/ncu-$who.err"
      python3 - "$OUT/ncu-$who.csv" <<'PY' | sed "s|^|ncu $who |" | tee -a "$S"
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, rows = rows[0], rows[1:]
name, val = head.index("Kernel Name"), head.index("Metric Value")
# Whole steps only: the kernels after the first argmax up to and including the last.
marks = [i for i, r in enumerate(rows) if "arg_reduce" in r[name].lower()]
if len(marks) < 2:
    sys.exit(f"fewer than two argmax launches among {len(rows)} kernels: no whole step (change SKIP)")
rows, steps = rows[marks[0] + 1 : marks[-1] + 1], len(marks) - 1
by = collections.defaultdict(lambda: [0, 0.0])
for r in rows:
    v = float(r[val].replace(",", ""))
    by[r[name][:60]][0] += 1
    by[r[name][:60]][1] += v
total = sum(t for _, t in by.values())
print(f"{steps} steps, {total / steps / 1e6:.3f} ms of kernels a step, {len(rows) / steps:.0f} kernels a step")
for k, (n, t) in sorted(by.items(), key=lambda x: -x[1][1])[:40]:
    print(f"  {t / steps / 1e6:.3f} ms/step {n / steps:5.1f}/step {k}")
PY
    done
    ;;
  hostprof)
    env_setup
    # shellcheck disable=SC2086
    env ${PROF_ENV:-} $B bench --model $M-4bit --prompt-tokens 512 --gen-tokens ${PROF_TOKENS:-30000} ${PROF_ARGS:---depths 0} \
      > "$OUT/hostprof.json" 2> "$OUT/hostprof.err" &
    pid=$!
    sleep ${PROF_DELAY:-15}  # past loading, the probes and prefill
    : > "$OUT/hostprof.txt"
    for _ in $(seq "${SAMPLES:-40}"); do
      kill -0 $pid 2>/dev/null || break
      echo "=== sample" >> "$OUT/hostprof.txt"
      timeout 30 cuda-gdb -q -nx -p $pid -batch -iex 'set auto-solib-add off' -ex 'sharedlibrary libmlx' \
        -ex 'sharedlibrary libc.so' -ex 'thread apply all bt 60' >> "$OUT/hostprof.txt" 2>&1
    done
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    python3 benches/gpu/host_profile.py "$OUT/hostprof.txt" | sed "s|^|hostprof ${PROF_ENV:-} |" | tee -a "$S"
    ;;
  hostcost)
    env_setup
    for g in 1 0; do
      MLX_USE_CUDA_GRAPHS=$g python3 benches/gpu/mlx_host_cost.py 2>&1 | tail -6 | tee -a "$S"
    done
    ;;
  knobs)
    env_setup
    MODEL=$M-4bit
    ARGS="--prompt-tokens 512 --gen-tokens 256"
    for knob in ${KNOBS:-default MLX_USE_CUDA_GRAPHS=0 MLX_MAX_OPS_PER_BUFFER=100,MLX_MAX_MB_PER_BUFFER=10000 MLX_MAX_OPS_PER_BUFFER=1000,MLX_MAX_MB_PER_BUFFER=100000}; do
      ENVS=$( [ "$knob" = default ] || echo "$knob" | tr , ' ')
      bench s27-q4-knob-$(echo "$knob" | tr ,= -_) --depths 0,3 --oracle-acceptance 0.8
      env $ENVS python3 benches/vs_mlx_lm.py "$MODEL" $ARGS --mlx-lm-only 2>&1 | tail -1 | sed "s|^|knob $knob mlx-lm |" | tee -a "$S"
    done
    ARGS="--prompt-tokens 512 --gen-tokens 512"
    ;;
  prefix)
    env_setup
    MODEL=$M-4bit
    ARGS="--prompt-tokens 32000 --gen-tokens 64"
    ENVS= bench s27-q4-prefix-ssd --prefix-cache --prefix-disk /tmp/prefix-ssd --depths 0
    ARGS="--prompt-tokens 512 --gen-tokens 512"
    ;;
  repeat)
    env_setup
    for round in 2 3; do
      for f in ${FORMATS:-q4 q8 bf16}; do
        model_for $f
        ENVS= bench s27-$f-plain-r$round --depths 0
        mlx_lm s27-$f-mlx-lm-r$round
      done
    done
    ;;
  esac
  tar czf "$DEST/raw.tgz" -C "$OUT" . 2>/dev/null || true
done
