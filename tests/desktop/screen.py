#!/usr/bin/env python3
"""Screenshots of the Xvfb screen without ImageMagick: reads `xwd -root` output (ZPixmap, 24/32 bits
per pixel, as Xvfb writes it), writes a PNG, and says whether the frame shows a rendered page rather
than an empty screen or a blank window.

    xwd -root -silent | python3 screen.py --png out.png [--baseline blank.xwd]

Prints one JSON line: {"width", "height", "colours", "dominant_share", "differs_from_baseline", "rendered"}.
`rendered` is true when the frame has many distinct colours (text is anti-aliased, so a page with
words has hundreds) and no single colour covers nearly all of it. Exit status 0 when rendered, 1 when
not, 2 on a bad input.
"""
import argparse
import collections
import json
import struct
import sys
import zlib

MIN_COLOURS = 64
MAX_DOMINANT = 0.97


def read_xwd(data):
    """(width, height, rows of RGB bytes)."""
    header_size, version = struct.unpack(">II", data[:8])
    if version != 7:
        raise ValueError(f"not an XWD file (version {version})")
    fields = struct.unpack(">25I", data[:100])
    (_, _, pixmap_format, depth, width, height, _xoffset, byte_order, _unit, _bit_order, _pad, bits_per_pixel,
     bytes_per_line, _visual_class, red_mask, green_mask, blue_mask, _bits_rgb, _cmap_entries, ncolors,
     _ww, _wh, _wx, _wy, _bw) = fields
    if pixmap_format != 2 or bits_per_pixel not in (24, 32):
        raise ValueError(f"unsupported XWD: format {pixmap_format}, {bits_per_pixel} bits per pixel")
    offset = header_size + 12 * ncolors
    step = bits_per_pixel // 8
    order = "<" if byte_order == 0 else ">"

    def shift(mask):
        s = 0
        while mask and not mask & 1:
            mask >>= 1
            s += 1
        return s

    rs, gs, bs = shift(red_mask), shift(green_mask), shift(blue_mask)
    rows = []
    for y in range(height):
        line = data[offset + y * bytes_per_line: offset + y * bytes_per_line + width * step]
        if step == 4:
            pixels = struct.unpack(f"{order}{width}I", line)
        else:
            pixels = [int.from_bytes(line[i:i + 3], "little" if order == "<" else "big") for i in range(0, len(line), 3)]
        rows.append(bytes(c for p in pixels for c in (
            (p & red_mask) >> rs, (p & green_mask) >> gs, (p & blue_mask) >> bs)))
    return width, height, rows


def write_png(path, width, height, rows):
    raw = b"".join(b"\x00" + r for r in rows)
    chunk = lambda kind, body: struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def colour_counts(rows):
    counts = collections.Counter()
    for r in rows:
        counts.update(r[i:i + 3] for i in range(0, len(r), 3))
    return counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--png", help="write the frame here")
    ap.add_argument("--baseline", help="an XWD of the screen before the app started")
    ap.add_argument("input", nargs="?", help="XWD file (default: stdin)")
    a = ap.parse_args()
    data = open(a.input, "rb").read() if a.input else sys.stdin.buffer.read()
    try:
        width, height, rows = read_xwd(data)
    except (ValueError, struct.error) as e:
        print(json.dumps({"error": str(e)}))
        return 2
    if a.png:
        write_png(a.png, width, height, rows)
    counts = colour_counts(rows)
    dominant = counts.most_common(1)[0][1] / (width * height)
    differs = None
    if a.baseline:
        _, _, base = read_xwd(open(a.baseline, "rb").read())
        differs = base != rows
    rendered = len(counts) >= MIN_COLOURS and dominant <= MAX_DOMINANT and differs is not False
    print(json.dumps({"width": width, "height": height, "colours": len(counts), "dominant_share": round(dominant, 4),
                      "differs_from_baseline": differs, "rendered": rendered}))
    return 0 if rendered else 1


if __name__ == "__main__":
    sys.exit(main())
