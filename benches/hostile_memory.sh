#!/usr/bin/env bash
# Peak memory of `tandem serve` under hostile requests (issue 17): the bundled model loaded, then
# eight 30 MB prompts at once (refused before tokenizing; read four at a time), a 40 MB body (over the 32 MB limit), and
# 1,000 idle connections. Prints the server's resident memory (VmRSS) and its peak (VmHWM, Linux)
# after each phase. Usage: bash benches/hostile_memory.sh [path/to/tandem]  (default target/debug/tandem)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/debug/tandem}
PY=${TANDEM_PYTHON:-.venv/bin/python}
WORK=$(mktemp -d)
trap 'kill $PID 2>/dev/null || true; rm -rf "$WORK"' EXIT
mkdir -p "$WORK/models"
cat > "$WORK/models.toml" <<EOF
models_dir = "$WORK/models"
default = "tiny"
[[model]]
name = "tiny"
path = "$PWD/assets/models/tandem-tiny"
EOF
PORT=$((20000 + RANDOM % 20000))
TANDEM_CONFIG="$WORK/models.toml" "$BIN" serve --port $PORT > "$WORK/log" 2>&1 &
PID=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/api/health" >/dev/null && break; sleep 0.2; done
mem() { echo "$1: $(grep -E 'VmRSS|VmHWM' /proc/$PID/status | tr -s ' ' | tr '\n' ' ')"; }
mem "started"
"$PY" - "$PORT" "$PID" <<'EOF'
import json, socket, sys, threading, urllib.request
port, pid = int(sys.argv[1]), sys.argv[2]
def mem(what):
    st = dict(l.split(":", 1) for l in open(f"/proc/{pid}/status"))
    print(f"  {what}: VmRSS {st['VmRSS'].strip()}, VmHWM {st['VmHWM'].strip()}")
url = f"http://127.0.0.1:{port}/v1/chat/completions"
def post(body):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception as e:
        return type(e).__name__
ok = json.dumps({"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "Hello"}]}).encode()
print("a chat:", post(ok)); mem("after loading the model and one chat")
big = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "word " * (6 << 20)}]}).encode()
res = []
ts = [threading.Thread(target=lambda: res.append(post(big))) for _ in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
print("eight 30 MB prompts at once:", res); mem("after them")
print("a 40 MB body (the server closes the connection at 32 MB):", post(b'{"model": "tiny", "messages": [{"role": "user", "content": "' + b"x" * (40 << 20) + b'"}]}'))
idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(1000)]
print("1,000 idle connections open; a chat beside them:", post(ok)); mem("with 1,000 idle connections")
for s in idle: s.close()
EOF
mem "after the hostile requests"
