"""Prints one line per run of `tandem bench --json` output files: depth, decode and prefill tok/s, speed-up,
acceptance, tokens per cycle and the verify's share of a cycle."""
import json
import sys

for path in sys.argv[1:]:
    d = json.load(open(path))
    print(f"{path}: {d['backend']}, mlx {d['mlx']}, oracle {d.get('oracle_acceptance')}, compiled {d.get('compiled')}")
    for g in d.get("graph_ops", []):
        top = ", ".join(f"{n} {c}" for n, c in g["by_op"][:8])
        draft = f", an MTP draft {g['draft_ops']} more" if g.get("draft_ops") is not None else ""
        print(f"  MLX operations, forward of {g['width']}: {g['ops']}{draft} ({top})")
    for r in d["runs"]:
        s = r["stats"]
        sp = s.get("spec") or {}
        ms = sp.get("ms") or {}
        cycles = sp.get("cycles") or 0
        line = (f"  depth {r['depth']}{' adaptive' if r['adaptive'] else ''}: decode {s['decode_tok_s']:.1f} tok/s "
                f"(x{r['speedup']:.2f}), prefill {s['prefill_tok_s']:.0f} tok/s")
        if cycles:
            line += (f", acceptance {sp.get('acceptance', 0):.2f}, {sp.get('tok_per_cycle', 0):.2f} tok/cycle, "
                     f"verify {ms.get('verify', 0) / cycles:.2f} ms/cycle, draft {ms.get('draft', 0) / cycles:.2f} "
                     f"ms/cycle, parked {sp.get('parked_cycles', 0)}")
        print(line)
