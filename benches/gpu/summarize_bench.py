"""Prints one line per run of `tandem bench --json` output files: depth, decode and prefill tok/s, speed-up,
acceptance, tokens per cycle and the verify's share of a cycle; for `--streams`, each batch size's aggregate and
per-stream speed; for `--prefix-cache`, turn 2's time to first token cold and from the cache."""
import json
import sys

for path in sys.argv[1:]:
    d = json.load(open(path))
    print(f"{path}: {d.get('backend')}, mlx {d.get('mlx')}, oracle {d.get('oracle_acceptance')}, "
          f"compiled {d.get('compiled')}" + (f", CUDA headers {d['cuda_headers']}" if d.get("cuda_headers") else ""))
    for g in d.get("graph_ops", []):
        top = ", ".join(f"{n} {c}" for n, c in g["by_op"][:8])
        draft = f", an MTP draft {g['draft_ops']} more" if g.get("draft_ops") is not None else ""
        print(f"  MLX operations, forward of {g['width']}: {g['ops']}{draft} ({top})")
    for r in d.get("streams", []):
        each = ", ".join(f"{t:.1f}" for t in r["per_stream_tok_s"])
        acc = f", acceptance {r['acceptance']:.2f}" if r.get("acceptance") is not None else ""
        print(f"  streams {r['streams']} depth {r['depth']}: aggregate {r['aggregate_tok_s']:.1f} tok/s "
              f"(x{r['speedup']:.2f} one stream, x{r['vs_plain']:.2f} plain alone), each [{each}]{acc}")
    for r in d.get("prefix_cache", []):
        disk = ""
        if r.get("disk_bytes_turn1") is not None:
            disk = (f", SSD written: turn 1 {r['disk_bytes_turn1'] / 1e6:.1f} MB, "
                    f"turn 2 {r['disk_bytes_turn2'] / 1e6:.1f} MB")
        print(f"  depth {r['depth']}: turn 2 of {r['turn2_tokens']} tokens ({r['cached_tokens']} cached), TTFT "
              f"{r['ttft_ms_cold']:.1f} ms cold, {r['ttft_ms_cached']:.1f} ms cached (x{r['speedup']:.1f}), "
              f"same tokens {r['same_tokens']}{disk}")
    for r in d.get("runs", []):
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
