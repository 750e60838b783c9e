"""A dependency-free PNG line plot (zlib + struct): step time against world size.

matplotlib is not a dependency of echo-et; a sweep only needs lines, axes, ticks and short
labels, which a 5x7 bitmap font and a few hundred lines of drawing cover. The output is
deterministic (same input, same bytes).
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence

_GLYPHS = {
    "0": ".###.#...##..###.#.###..##...#.###.",
    "1": "..#...##....#....#....#....#...###.",
    "2": ".###.#...#....#...#...#...#...#####",
    "3": "#####...#...#.....#.....##...#.###.",
    "4": "...#...##..#.#.#..#.#####...#....#.",
    "5": "######....####.....#....##...#.###.",
    "6": "..##..#...#....####.#...##...#.###.",
    "7": "#####....#...#...#...#....#....#...",
    "8": ".###.#...##...#.###.#...##...#.###.",
    "9": ".###.#...##...#.####....#...#..##..",
    "a": "...........###.....#.#####...#.####",
    "b": "#....#....#.##.##..##...##...#####.",
    "c": "...........###.#....#....#...#.###.",
    "d": "....#....#.##.##..###...##...#.####",
    "e": "...........###.#...#######.....###.",
    "f": "..##..#..#.#...###...#....#....#...",
    "g": "......#####...##...#.####....#.###.",
    "h": "#....#....#.##.##..##...##...##...#",
    "i": "..#........##....#....#....#...###.",
    "j": "...#........##....#....#.#..#..##..",
    "k": "#....#....#..#.#.#..##...#.#..#..#.",
    "l": ".##....#....#....#....#....#...###.",
    "m": "..........##.#.#.#.##.#.##...##...#",
    "n": "..........#.##.##..##...##...##...#",
    "o": "...........###.#...##...##...#.###.",
    "p": "..........####.#...#####.#....#....",
    "q": "...........##.##..##.####....#....#",
    "r": "..........#.##.##..##....#....#....",
    "s": "...........###.#.....###.....#####.",
    "t": ".#....#...###...#....#....#..#..##.",
    "u": "..........#...##...##...##..##.##.#",
    "v": "..........#...##...##...#.#.#...#..",
    "w": "..........#...##...##.#.##.#.#.#.#.",
    "x": "..........#...#.#.#...#...#.#.#...#",
    "y": "..........#...##...#.####....#.###.",
    "z": "..........#####...#...#...#...#####",
    ".": "..........................##...##..",
    ",": ".....................##....#...#...",
    "=": "..........#####.....#####..........",
    "-": "...............#####...............",
    "(": "...#...#...#....#....#.....#.....#.",
    ")": ".#.....#.....#....#....#...#...#...",
    "/": ".........#...#...#...#...#.........",
    "%": "##...##..#...#...#...#...#..##...##",
    ":": "......##...##........##...##.......",
    " ": "...................................",
}

PALETTE = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14), (148, 103, 189),
           (140, 86, 75), (227, 119, 194), (127, 127, 127)]


class Canvas:
    def __init__(self, width: int, height: int, bg: tuple[int, int, int] = (255, 255, 255)):
        self.w, self.h = width, height
        self.px = bytearray(bytes(bg) * (width * height))

    def set(self, x: int, y: int, c: tuple[int, int, int]) -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            i = 3 * (y * self.w + x)
            self.px[i:i + 3] = bytes(c)

    def rect(self, x0: int, y0: int, x1: int, y1: int, c: tuple[int, int, int]) -> None:
        for y in range(max(0, y0), min(self.h, y1 + 1)):
            for x in range(max(0, x0), min(self.w, x1 + 1)):
                self.set(x, y, c)

    def line(self, x0: int, y0: int, x1: int, y1: int, c: tuple[int, int, int], width: int = 1) -> None:
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        r = width // 2
        while True:
            self.rect(x0 - r, y0 - r, x0 - r + width - 1, y0 - r + width - 1, c)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x: int, y: int, s: str, c: tuple[int, int, int] = (0, 0, 0), scale: int = 1) -> None:
        for ch in s.lower():
            g = _GLYPHS.get(ch, _GLYPHS[" "])
            for i, bit in enumerate(g):
                if bit == "#":
                    gx, gy = i % 5, i // 5
                    self.rect(x + gx * scale, y + gy * scale, x + gx * scale + scale - 1,
                              y + gy * scale + scale - 1, c)
            x += 6 * scale

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.px[3 * y * self.w: 3 * (y + 1) * self.w]) for y in range(self.h))

        def chunk(tag: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

        ihdr = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9))
                + chunk(b"IEND", b""))


def text_width(s: str, scale: int = 1) -> int:
    return 6 * scale * len(s)


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v <= hi + step * 1e-9:
        if v >= lo - step * 1e-9:
            ticks.append(round(v, 10))
        v += step
    return ticks


def _fmt(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:g}m"
    if v >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def line_plot(series: dict[str, Sequence[tuple[float, float]]], *, title: str = "",
              xlabel: str = "", ylabel: str = "", logx: bool = True,
              width: int = 720, height: int = 480) -> bytes:
    """A PNG of one line per series (points sorted by x); x on a log2 axis when ``logx``."""
    pts = [p for s in series.values() for p in s]
    if not pts:
        raise ValueError("nothing to plot")
    fx = (lambda v: math.log2(v)) if logx else (lambda v: v)
    xs = [fx(x) for x, _ in pts]
    ys = [y for _, y in pts]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    yticks = _nice_ticks(0.0, max(ys) * 1.05 if max(ys) > 0 else 1.0)
    y0, y1 = 0.0, max(yticks[-1], max(ys))
    left, right, top, bottom = 80, 170, 40, 60
    pw, ph = width - left - right, height - top - bottom
    c = Canvas(width, height)

    def X(v: float) -> int:  # noqa: N802
        return left + round((fx(v) - x0) / (x1 - x0) * pw)

    def Y(v: float) -> int:  # noqa: N802
        return top + ph - round((v - y0) / (y1 - y0) * ph)

    grey, black = (220, 220, 220), (0, 0, 0)
    for t in yticks:
        c.line(left, Y(t), left + pw, Y(t), grey)
        label = _fmt(t)
        c.text(left - 8 - text_width(label), Y(t) - 3, label)
    xvals = sorted({x for x, _ in pts})
    for v in xvals:
        c.line(X(v), top, X(v), top + ph, grey)
        label = _fmt(v)
        c.text(X(v) - text_width(label) // 2, top + ph + 8, label)
    c.line(left, top, left, top + ph, black, 2)
    c.line(left, top + ph, left + pw, top + ph, black, 2)
    if title:
        c.text(left + (pw - text_width(title, 2)) // 2, 10, title, scale=2)
    if xlabel:
        c.text(left + (pw - text_width(xlabel)) // 2, height - 22, xlabel)
    if ylabel:
        c.text(8, top - 20, ylabel)
    for i, (name, s) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        ordered = sorted(s)
        for (ax, ay), (bx, by) in zip(ordered, ordered[1:], strict=False):
            c.line(X(ax), Y(ay), X(bx), Y(by), color, 2)
        for ax, ay in ordered:
            c.rect(X(ax) - 3, Y(ay) - 3, X(ax) + 3, Y(ay) + 3, color)
        ly = top + 10 + 16 * i
        c.rect(left + pw + 16, ly, left + pw + 28, ly + 6, color)
        c.text(left + pw + 34, ly, name)
    return c.png()
