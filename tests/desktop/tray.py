#!/usr/bin/env python3
"""The tray icon's menu, driven the way a Linux desktop's indicator host drives it: over D-Bus
(com.canonical.dbusmenu, which libayatana-appindicator exports for the menu). Needs the app running
on a session bus (run.sh starts one with dbus-run-session). Stdlib and `gdbus` only.

    python3 tray.py --pid APP_PID --url http://127.0.0.1:PORT

Checks, in order, with bounded waits:
  1. the menu lists no loaded model, memory, the API address, and offers "Load <default>";
  2. clicking "Load" loads the model (the server says so) and the menu then names it;
  3. during a generation the menu shows live tok/s ("Generating: …"), afterwards the last answer's
     tok/s and MTP acceptance, and the models' memory;
  4. clicking "Unload" unloads it;
  5. clicking "Quit Tandem" ends the app (run.sh checks its exit status).
"""
import argparse
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request

DBUS = ["--session", "--dest", "org.freedesktop.DBus", "--object-path", "/org/freedesktop/DBus"]


def gdbus(*args, timeout=10):
    out = subprocess.run(["gdbus", "call", *args], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"gdbus {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def bus_name_of(pid):
    names = re.findall(r"'(:[0-9.]+)'", gdbus(*DBUS, "--method", "org.freedesktop.DBus.ListNames"))
    for name in names:
        try:
            out = gdbus(*DBUS, "--method", "org.freedesktop.DBus.GetConnectionUnixProcessID", name)
        except RuntimeError:
            continue
        if re.search(r"\b(\d+),\)", out) and int(re.search(r"\b(\d+),\)", out).group(1)) == pid:
            yield name


def menu_path(name):
    out = subprocess.run(["gdbus", "introspect", "--session", "--dest", name, "--object-path", "/org/ayatana/NotificationItem"],
                         capture_output=True, text=True, timeout=10)
    nodes = [n for n in re.findall(r"node (\S+) \{", out.stdout) if not n.startswith("/")]
    return f"/org/ayatana/NotificationItem/{nodes[0]}/Menu" if nodes else None


LABEL = re.compile(r"'label': <(?:'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\")>")


class Menu:
    def __init__(self, name, path):
        self.name, self.path = name, path

    def items(self):
        """[(id, label, enabled)] of the menu's items that have a label."""
        text = gdbus("--session", "--dest", self.name, "--object-path", self.path,
                     "--method", "com.canonical.dbusmenu.GetLayout", "--", "0", "-1", "[]")
        items = []
        for m in re.finditer(r"\((\d+), \{([^{}]*)\}", text):
            label = LABEL.search(m.group(2))
            if label:
                enabled = "'enabled': <false>" not in m.group(2)
                items.append((int(m.group(1)), label.group(1) or label.group(2), enabled))
        return items

    def labels(self):
        return [label for _, label, _ in self.items()]

    def click(self, label):
        ids = [i for i, l, enabled in self.items() if l == label and enabled]
        assert ids, f"no enabled item `{label}` in {self.items()}"
        gdbus("--session", "--dest", self.name, "--object-path", self.path,
              "--method", "com.canonical.dbusmenu.Event", "--", str(ids[0]), "clicked", "<0>", "0")

    def wait_for(self, what, check, timeout):
        deadline = time.monotonic() + timeout
        while True:
            items = self.items()
            if check(items):
                return items
            if time.monotonic() > deadline:
                raise AssertionError(f"the tray menu never showed {what}; it shows {[(l, e) for _, l, e in items]}")
            time.sleep(0.1)


def get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


def loaded(url, model):
    models = get(url + "/api/models")
    models = models.get("models", models.get("data", models)) if isinstance(models, dict) else models
    return any(m["id"] == model and m["loaded"] for m in models)


def has(items, prefix, enabled=None):
    return any(l.startswith(prefix) and (enabled is None or e == enabled) for _, l, e in items)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="tandem-tiny")
    a = ap.parse_args()
    model = a.model

    menu = None
    deadline = time.monotonic() + 30
    while menu is None:
        for name in bus_name_of(a.pid):
            path = menu_path(name)
            if path:
                menu = Menu(name, path)
        if menu is None:
            if time.monotonic() > deadline:
                raise AssertionError("the app exported no tray menu on the session bus")
            time.sleep(0.2)
    print(f"tray: menu {menu.path} on {menu.name}")

    # 1. Idle, nothing loaded.
    items = menu.wait_for("its first state", lambda it: has(it, f"Load {model}", True), 15)
    print("tray: menu:", " | ".join(l for _, l, _ in items))
    assert has(items, "No model loaded"), items
    assert has(items, "Memory: ") and re.search(r"Memory: [\d.]+ [kMG]B", " ".join(menu.labels())), items
    assert has(items, f"API: {a.url}"), items
    assert has(items, f"Unload {model}", False), items

    # 2. Load from the tray.
    menu.click(f"Load {model}")
    menu.wait_for(f"`Model: {model}`", lambda it: has(it, f"Model: {model}") and has(it, f"Unload {model}", True), 120)
    assert loaded(a.url, model), "the server does not list the model as loaded"
    print(f"tray: Load {model} -> loaded")

    # 3. Live statistics during and after a generation.
    seen, done = set(), threading.Event()
    timing = {}

    def generate():
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Tell me a long story about two bicycles."}],
                           "max_tokens": 400, "temperature": 0}).encode()
        request = urllib.request.Request(a.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
        start = time.monotonic()
        with urllib.request.urlopen(request, timeout=300) as r:
            timing["answer"] = json.load(r)
        timing["seconds"] = time.monotonic() - start
        done.set()

    worker = threading.Thread(target=generate, daemon=True)
    worker.start()
    while not done.wait(0.05):
        seen.update(l for l in menu.labels() if l.startswith("Generating:"))
    worker.join()
    tokens = timing["answer"]["usage"]["completion_tokens"]
    print(f"tray: generated {tokens} tokens in {timing['seconds']:.1f} s; live labels seen: {sorted(seen)[:3]}")
    if timing["seconds"] >= 1.0:
        assert seen, "the menu showed no live tok/s during a generation of a second or more"
        assert any(re.match(r"Generating: [\d.]*[1-9][\d.]* tok/s", l) for l in seen), f"no live tok/s in {seen}"
    items = menu.wait_for("the last answer's speed", lambda it: has(it, "Last answer: "), 15)
    speed = next(l for _, l, _ in items if l.startswith("Last answer: "))
    assert re.match(r"Last answer: [\d.]+ tok/s · MTP acceptance \d+%", speed), speed
    memory = next(l for _, l, _ in items if l.startswith("Memory: "))
    assert re.match(r"Memory: [\d.]+ [kMG]B \(models [\d.]+ [kMG]B\)", memory), memory
    print(f"tray: {speed} | {memory}")

    # 4. Unload from the tray.
    menu.click(f"Unload {model}")
    menu.wait_for("`No model loaded`", lambda it: has(it, "No model loaded") and has(it, f"Load {model}", True), 60)
    assert not loaded(a.url, model), "the server still lists the model as loaded"
    print(f"tray: Unload {model} -> unloaded")

    # 5. Quit.
    try:
        menu.click("Quit Tandem")
    except RuntimeError as e:
        # The app may be gone before it answers the click.
        if "NoReply" not in str(e) and "disconnected" not in str(e):
            raise
    print("tray: Quit Tandem clicked")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (AssertionError, RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"tray: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
