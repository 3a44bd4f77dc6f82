#!/usr/bin/env bash
# Issue 23's loopback figure: tandem-tiny (converted to f32) answered by one `tandem serve` and by two processes
# (`tandem serve --hostfile` + `tandem worker`) on this machine, the same greedy chat request (256 tokens, MTP depth
# 3) to each; prints each answer's decode tok/s (Tandem's `stats`) and whether the texts agree.
# Usage: [SPLIT=tensor|pipeline] bash benches/distributed_loopback.sh [TANDEM_BINARY]   (default target/release/tandem)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/tandem}
SPLIT=${SPLIT:-tensor}
PY=${TANDEM_PYTHON:-.venv/bin/python}
W=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$W"' EXIT
"$BIN" convert assets/models/tandem-tiny --out "$W/tiny-f32" --dtype f32 > /dev/null
printf 'models_dir = "models"\ndefault = "tiny"\n[[model]]\nname = "tiny"\npath = "%s"\nmtp = { enabled = true, depth = 3, adaptive = false }\nprefix_cache_bytes = 0\n' "$W/tiny-f32" > "$W/models.toml"
ports=$($PY -c 'import socket
s=[socket.socket() for _ in range(4)]
[x.bind(("127.0.0.1",0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))')
read -r R0 R1 P1 P2 <<< "$ports"
echo "[[\"127.0.0.1:$R0\"], [\"127.0.0.1:$R1\"]]" > "$W/hosts.json"
export TANDEM_CONFIG=$W/models.toml
"$BIN" serve --port "$P1" 2> "$W/one.log" &
"$BIN" worker --hostfile "$W/hosts.json" --rank 1 --model tiny --split "$SPLIT" 2> "$W/worker.log" &
"$BIN" serve --port "$P2" --hostfile "$W/hosts.json" --split "$SPLIT" 2> "$W/split.log" &
SPLIT=$SPLIT $PY - "$P1" "$P2" <<'PY'
import json, sys, time, urllib.request
def ask(port):
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=1); break
        except Exception:
            time.sleep(0.2)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me about the sea."}],
            "max_tokens": 256, "temperature": 0, "ignore_eos": True}
    runs = []
    for _ in range(3):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        r = json.load(urllib.request.urlopen(req, timeout=600))
        runs.append((r["stats"]["decode_tok_s"], r["choices"][0]["message"]["content"], r["stats"].get("spec") or {}))
    return runs
one, split = ask(sys.argv[1]), ask(sys.argv[2])
for name, runs in (("one process", one), ("2 processes (" + __import__("os").environ.get("SPLIT", "tensor") + ")", split)):
    print(f"{name}: decode tok/s {', '.join(f'{t:.1f}' for t, _, _ in runs)}; acceptance {runs[0][2].get('acceptance', 0):.2f}")
print("same text:", all(a[1] == b[1] for a, b in zip(one, split)))
PY
