"""A tiny, dependency-free line-plot writer: PNG files from the standard library alone (``zlib``).

Why not matplotlib: the project would pull matplotlib, numpy, pillow and friends into the dev
environment for four benchmark charts. This writes 8-bit RGB PNGs (one zlib stream, filter 0) with axes,
ticks, a linear or log10 x axis, polylines with point markers, a legend and labels in a built-in 5x7
bitmap font (upper-case letters, digits and a little punctuation; lower case is drawn upper case).

Guarantee: the same data gives byte-identical files (no timestamps, no randomness).
"""

from __future__ import annotations

import itertools
import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

Color = tuple[int, int, int]

WHITE: Color = (255, 255, 255)
BLACK: Color = (0, 0, 0)
GREY: Color = (200, 200, 200)
PALETTE: tuple[Color, ...] = (
    (31, 119, 180),
    (214, 39, 40),
    (44, 160, 44),
    (255, 127, 14),
    (148, 103, 189),
    (140, 86, 75),
)

# 5x7 glyphs, one string of 7 rows of 5 cells per character ("#" = ink).
_FONT_ROWS: dict[str, str] = {
    "A": ".###. #...# #...# ##### #...# #...# #...#",
    "B": "####. #...# #...# ####. #...# #...# ####.",
    "C": ".###. #...# #.... #.... #.... #...# .###.",
    "D": "####. #...# #...# #...# #...# #...# ####.",
    "E": "##### #.... #.... ####. #.... #.... #####",
    "F": "##### #.... #.... ####. #.... #.... #....",
    "G": ".###. #...# #.... #.### #...# #...# .####",
    "H": "#...# #...# #...# ##### #...# #...# #...#",
    "I": ".###. ..#.. ..#.. ..#.. ..#.. ..#.. .###.",
    "J": "..### ...#. ...#. ...#. ...#. #..#. .##..",
    "K": "#...# #..#. #.#.. ##... #.#.. #..#. #...#",
    "L": "#.... #.... #.... #.... #.... #.... #####",
    "M": "#...# ##.## #.#.# #.#.# #...# #...# #...#",
    "N": "#...# #...# ##..# #.#.# #..## #...# #...#",
    "O": ".###. #...# #...# #...# #...# #...# .###.",
    "P": "####. #...# #...# ####. #.... #.... #....",
    "Q": ".###. #...# #...# #...# #.#.# #..#. .##.#",
    "R": "####. #...# #...# ####. #.#.. #..#. #...#",
    "S": ".#### #.... #.... .###. ....# ....# ####.",
    "T": "##### ..#.. ..#.. ..#.. ..#.. ..#.. ..#..",
    "U": "#...# #...# #...# #...# #...# #...# .###.",
    "V": "#...# #...# #...# #...# #...# .#.#. ..#..",
    "W": "#...# #...# #...# #.#.# #.#.# #.#.# .#.#.",
    "X": "#...# #...# .#.#. ..#.. .#.#. #...# #...#",
    "Y": "#...# #...# .#.#. ..#.. ..#.. ..#.. ..#..",
    "Z": "##### ....# ...#. ..#.. .#... #.... #####",
    "0": ".###. #...# #..## #.#.# ##..# #...# .###.",
    "1": "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###.",
    "2": ".###. #...# ....# ...#. ..#.. .#... #####",
    "3": "##### ...#. ..#.. ...#. ....# #...# .###.",
    "4": "...#. ..##. .#.#. #..#. ##### ...#. ...#.",
    "5": "##### #.... ####. ....# ....# #...# .###.",
    "6": "..##. .#... #.... ####. #...# #...# .###.",
    "7": "##### ....# ...#. ..#.. .#... .#... .#...",
    "8": ".###. #...# #...# .###. #...# #...# .###.",
    "9": ".###. #...# #...# .#### ....# ...#. .##..",
    " ": "..... ..... ..... ..... ..... ..... .....",
    ".": "..... ..... ..... ..... ..... .##.. .##..",
    ",": "..... ..... ..... ..... .##.. ..#.. .#...",
    "-": "..... ..... ..... ##### ..... ..... .....",
    "+": "..... ..#.. ..#.. ##### ..#.. ..#.. .....",
    ":": "..... .##.. .##.. ..... .##.. .##.. .....",
    "/": "..... ....# ...#. ..#.. .#... #.... .....",
    "(": "...#. ..#.. .#... .#... .#... ..#.. ...#.",
    ")": ".#... ..#.. ...#. ...#. ...#. ..#.. .#...",
    "%": "##... ##..# ...#. ..#.. .#... #..## ...##",
    "=": "..... ..... ##### ..... ##### ..... .....",
    "<": "...#. ..#.. .#... #.... .#... ..#.. ...#.",
    ">": ".#... ..#.. ...#. ....# ...#. ..#.. .#...",
    "_": "..... ..... ..... ..... ..... ..... #####",
    "'": "..#.. ..#.. .#... ..... ..... ..... .....",
    "*": "..... ..#.. #.#.# .###. #.#.# ..#.. .....",
    "?": ".###. #...# ....# ...#. ..#.. ..... ..#..",
}
_FONT: dict[str, list[str]] = {char: rows.split() for char, rows in _FONT_ROWS.items()}
GLYPH_W, GLYPH_H = 6, 8  # cell size including spacing


@dataclass
class Canvas:
    width: int
    height: int
    pixels: bytearray = field(init=False)

    def __post_init__(self) -> None:
        self.pixels = bytearray(WHITE * (self.width * self.height))

    def dot(self, x: int, y: int, color: Color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            offset = 3 * (y * self.width + x)
            self.pixels[offset : offset + 3] = bytes(color)

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        for y in range(min(y0, y1), max(y0, y1) + 1):
            for x in range(min(x0, x1), max(x0, x1) + 1):
                self.dot(x, y, color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color: Color, width: int = 1, dash: int = 0) -> None:
        """Bresenham, thickened by drawing a small square at every step; ``dash`` > 0 draws ``dash`` pixels
        on, ``dash`` off."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        error = dx + dy
        half = width // 2
        step = 0
        while True:
            if not dash or (step // dash) % 2 == 0:
                self.rect(x0 - half, y0 - half, x0 + width - 1 - half, y0 + width - 1 - half, color)
            step += 1
            if x0 == x1 and y0 == y1:
                return
            twice = 2 * error
            if twice >= dy:
                error += dy
                x0 += sx
            if twice <= dx:
                error += dx
                y0 += sy

    def text(self, x: int, y: int, text: str, color: Color = BLACK, scale: int = 1) -> None:
        for index, char in enumerate(text.upper()):
            glyph = _FONT.get(char, _FONT["?"])
            for row, cells in enumerate(glyph):
                for column, cell in enumerate(cells):
                    if cell == "#":
                        left, top = x + (index * GLYPH_W + column) * scale, y + row * scale
                        self.rect(left, top, left + scale - 1, top + scale - 1, color)

    def text_width(self, text: str, scale: int = 1) -> int:
        return len(text) * GLYPH_W * scale

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.pixels[3 * self.width * y : 3 * self.width * (y + 1)])
            for y in range(self.height)
        )

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b"")
        )


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]
    dashed: bool = False


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        return [low]
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    return [first + n * step for n in range(int((high - first) / step) + 1)]


def _label(value: float) -> str:
    if value != 0 and (abs(value) >= 100_000 or abs(value) < 0.001):
        exponent = math.floor(math.log10(abs(value)))
        mantissa = value / 10**exponent
        return f"{mantissa:g}E{exponent}" if mantissa != 1 else f"1E{exponent}"
    return f"{value:g}"


def line_plot(
    title: str,
    x_label: str,
    y_label: str,
    series: Sequence[Series],
    *,
    log_x: bool = False,
    log_y: bool = False,
    y_min: float | None = None,
    width: int = 720,
    height: int = 440,
) -> bytes:
    """A PNG line chart of ``series`` (x values > 0 when ``log_x``, y values > 0 when ``log_y``)."""
    canvas = Canvas(width, height)
    left, right, top, bottom = 80, width - 20, 56, height - 50
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]

    def fx(value: float) -> float:
        return math.log10(value) if log_x else value

    def fy(value: float) -> float:
        return math.log10(value) if log_y else value

    x_low, x_high = fx(min(xs)), fx(max(xs))
    if x_high == x_low:
        x_low, x_high = x_low - 1, x_high + 1
    y_low = fy(min(ys) if y_min is None else y_min)
    y_high = fy(max(ys))
    if log_y:
        y_low, y_high = math.floor(y_low), math.ceil(y_high)
    if y_high == y_low:
        y_high = y_low + 1
    if not log_y:
        y_high += (y_high - y_low) * 0.05

    def px(x: float) -> int:
        return round(left + (fx(x) - x_low) / (x_high - x_low) * (right - left))

    def py(y: float) -> int:
        return round(bottom - (fy(y) - y_low) / (y_high - y_low) * (bottom - top))

    canvas.text(left, 10, title, scale=2)
    canvas.text(left - 40, top - 16, y_label)
    # grid and ticks
    y_ticks = [10.0**e for e in range(int(y_low), int(y_high) + 1)] if log_y else _ticks(y_low, y_high)
    for tick in y_ticks:
        canvas.line(left, py(tick), right, py(tick), GREY)
        label = _label(tick)
        canvas.text(left - 6 - canvas.text_width(label), py(tick) - 3, label)
    if log_x:
        x_ticks = [10.0**e for e in range(math.floor(x_low), math.ceil(x_high) + 1) if x_low <= e <= x_high]
    else:
        x_ticks = _ticks(x_low, x_high)
    for tick in x_ticks:
        canvas.line(px(tick), top, px(tick), bottom, GREY)
        label = _label(tick)
        canvas.text(px(tick) - canvas.text_width(label) // 2, bottom + 6, label)
    canvas.line(left, bottom, right, bottom, BLACK)
    canvas.line(left, top, left, bottom, BLACK)
    canvas.text((left + right) // 2 - canvas.text_width(x_label) // 2, bottom + 22, x_label)
    # series, then the legend (top right, as wide as its longest label)
    legend_x = right - 24 - max(canvas.text_width(one.label) for one in series)
    for number, one in enumerate(series):
        color = PALETTE[number % len(PALETTE)]
        points = [(px(x), py(y)) for x, y in one.points]
        for (x0, y0), (x1, y1) in itertools.pairwise(points):
            canvas.line(x0, y0, x1, y1, color, width=2, dash=6 if one.dashed else 0)
        for x, y in points:
            canvas.rect(x - 2, y - 2, x + 2, y + 2, color)
        legend_y = top + 6 + number * 12
        canvas.rect(legend_x, legend_y, legend_x + 10, legend_y + 6, color)
        canvas.text(legend_x + 15, legend_y, one.label)
    return canvas.png()
