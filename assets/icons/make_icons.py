#!/usr/bin/env python3
"""Draws Tandem's icons (no downloads, no Pillow): two overlapping discs, the draft and the verifier,
on a rounded square. Writes the PNG sizes Tauri's bundler wants, icon.ico and icon.icns (both
carrying PNGs), and the tray icons: a coloured one (Linux, Windows) and a black-on-transparent
template (macOS menu bar, which tints it).

    python3 assets/icons/make_icons.py      # rewrites the files beside this script
"""
import math
import os
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))

BG_TOP = (38, 42, 74)       # indigo
BG_BOTTOM = (22, 24, 44)
DISC_BACK = (94, 234, 212)  # teal: the draft
DISC_FRONT = (129, 140, 248)  # violet: the verifier


def clamp01(x):
    return 0.0 if x < 0 else 1.0 if x > 1 else x


def rounded_square_sdf(x, y, half, radius):
    """Signed distance to a rounded square centred at 0 (negative inside)."""
    qx = abs(x) - (half - radius)
    qy = abs(y) - (half - radius)
    outside = math.hypot(max(qx, 0.0), max(qy, 0.0))
    inside = min(max(qx, qy), 0.0)
    return outside + inside - radius


def over(dst, src, alpha):
    """`src` (rgb) with coverage `alpha` over `dst` (rgba floats)."""
    r, g, b, a = dst
    out_a = alpha + a * (1 - alpha)
    if out_a <= 0:
        return (0.0, 0.0, 0.0, 0.0)
    mix = lambda s, d: (s * alpha + d * a * (1 - alpha)) / out_a
    return (mix(src[0], r), mix(src[1], g), mix(src[2], b), out_a)


def draw(size, template=False, background=True):
    """RGBA rows of the icon at `size` pixels."""
    s = float(size)
    # The app icon leaves a margin (macOS's grid: 824 of 1024); the tray icon fills its box.
    half = s * (0.5 * 824 / 1024 if background else 0.5)
    radius = half * 0.45
    disc_r = half * (0.42 if background else 0.52)
    back_c = (-half * 0.22, -half * 0.02) if background else (-half * 0.40, 0.0)
    front_c = (half * 0.22, half * 0.02) if background else (half * 0.40, 0.0)
    ring = s / 40 if background else s / 14  # the gap that separates the front disc from the back one
    rows = []
    for j in range(size):
        y = j + 0.5 - s / 2
        row = bytearray()
        for i in range(size):
            x = i + 0.5 - s / 2
            px = (0.0, 0.0, 0.0, 0.0)
            if background:
                a = clamp01(0.5 - rounded_square_sdf(x, y, half, radius))
                if a > 0:
                    t = clamp01((y + half) / (2 * half))
                    bg = tuple(BG_TOP[k] + (BG_BOTTOM[k] - BG_TOP[k]) * t for k in range(3))
                    px = over(px, bg, a)
            d_back = math.hypot(x - back_c[0], y - back_c[1])
            d_front = math.hypot(x - front_c[0], y - front_c[1])
            if template:
                # One ink: the back disc minus a gap around the front disc, plus the front disc.
                a_back = clamp01(disc_r - d_back + 0.5) * (1 - clamp01(disc_r + ring - d_front + 0.5))
                a_front = clamp01(disc_r - d_front + 0.5)
                a = clamp01(a_back + a_front)
                px = (0.0, 0.0, 0.0, a)
            else:
                px = over(px, DISC_BACK, clamp01(disc_r - d_back + 0.5))
                gap = clamp01(disc_r + ring - d_front + 0.5) * clamp01(disc_r - d_back + ring + 0.5)
                if gap > 0:
                    under = BG_TOP if background else None
                    if under is None:
                        px = (px[0], px[1], px[2], px[3] * (1 - gap))
                    else:
                        t = clamp01((y + half) / (2 * half))
                        bg = tuple(BG_TOP[k] + (BG_BOTTOM[k] - BG_TOP[k]) * t for k in range(3))
                        px = over(px, bg, gap)
                px = over(px, DISC_FRONT, clamp01(disc_r - d_front + 0.5))
            row += bytes(int(round(c)) for c in px[:3]) + bytes([int(round(px[3] * 255))])
        rows.append(bytes(row))
    return rows


def png(rows, size):
    raw = b"".join(b"\x00" + r for r in rows)
    chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def ico(pngs):
    """An .ico whose entries are PNGs (Windows Vista and later read them)."""
    header = struct.pack("<HHH", 0, 1, len(pngs))
    offset = 6 + 16 * len(pngs)
    entries, blobs = b"", b""
    for size, data in pngs:
        dim = 0 if size >= 256 else size
        entries += struct.pack("<BBBBHHII", dim, dim, 0, 0, 1, 32, len(data), offset)
        offset += len(data)
        blobs += data
    return header + entries + blobs


def icns(pngs):
    """An .icns whose entries are PNGs (macOS 10.7 and later)."""
    kinds = {16: b"icp4", 32: b"icp5", 64: b"icp6", 128: b"ic07", 256: b"ic08", 512: b"ic09", 1024: b"ic10"}
    body = b"".join(kinds[size] + struct.pack(">I", 8 + len(data)) + data for size, data in pngs if size in kinds)
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


def write(name, data):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(data)


def main():
    app = {size: png(draw(size), size) for size in (16, 32, 64, 128, 256, 512, 1024)}
    write("32x32.png", app[32])
    write("128x128.png", app[128])
    write("128x128@2x.png", app[256])
    write("icon.png", app[512])
    write("icon.ico", ico([(s, app[s]) for s in (16, 32, 64, 256)]))
    write("icon.icns", icns(sorted(app.items())))
    write("tray.png", png(draw(64, background=False), 64))
    write("tray-template.png", png(draw(44, template=True, background=False), 44))


if __name__ == "__main__":
    main()
