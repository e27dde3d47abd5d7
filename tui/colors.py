"""Colour scales and the glyph ramp: pure functions from scores to rich styles (no Textual, no HDF5).

Scores are first normalised per view (:func:`normalize`): signed methods to [-1, 1] by the largest |score| (so 0
stays in the middle of a diverging scale), non-negative methods to [0, 1] between the smallest and the largest score.
A normalised value then maps to a background colour (:func:`background`) in the terminal's colour mode, or, where
colour is not available (NO_COLOR), to a glyph of the ramp :data:`GLYPHS` plus a sign mark (:func:`sign_mark`).

The colour ramps (:data:`COLORMAPS`) are runs of xterm-256 palette entries: in 256-colour mode (SSH does not
forward COLORTERM) a value maps to one entry exactly, in truecolor mode it is interpolated between them, in 16-colour
mode it is bucketed into a few standard colours. In the default map ("dark") lightness grows with |value| from black
at 0; negative values are blue to cyan, positive ones red to yellow. The "light" map starts from white at 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from rich.color import Color
from rich.style import Style

Mode = Literal["truecolor", "256", "16", "mono"]
MODES: tuple[str, ...] = ("truecolor", "256", "16", "mono")

#: What a colour scale spans: one view (this example, this layer), one example (all its views), or the whole store.
NORMALISATIONS: tuple[str, ...] = ("view", "example", "global")
NORMALISATION_NAMES = {"view": "per view (this example, this layer)", "example": "per example (all its layers)",
                       "global": "global (the whole store, this layer)"}

#: Which tokens set a colour scale: every one, or the content tokens (all but the special tokens and the explained
#: one, whose score is often the model's own output: rollout's [CLS] 0.66 next to words of 0.02-0.04). Tokens outside
#: the scale are drawn at its ends.
SCALE_TOKENS: tuple[str, ...] = ("content", "all")
SCALE_TOKEN_NAMES = {"content": "w/o specials", "all": "all tokens"}
DOMINANCE = 3.0  # a token outside the content this many times larger than every content token dominates the scale

#: Magnitude ramp used without colour: the lowest fifth of |value| is a blank, the top fifth a full block.
GLYPHS = " ░▒▓█"

@dataclass(frozen=True)
class Colormap:
    """A diverging pair of ramps, each from the value 0 to the largest magnitude: ``warm`` for non-negative values
    and positive signed ones, ``cold`` for negative ones, as xterm-256 entries (256-colour mode maps a value to one
    entry; truecolor interpolates between their RGB) and as standard 16-colour entries (bucketed). Lightness moves
    monotonically away from the zero colour along every ramp."""

    name: str
    description: str
    warm_256: tuple[int, ...]
    cold_256: tuple[int, ...]
    warm_16: tuple[int, ...]
    cold_16: tuple[int, ...]

    def rgb(self, cold: bool) -> np.ndarray:
        return _RGB[(self.name, cold)]


COLORMAPS: dict[str, Colormap] = {c.name: c for c in (
    # Black at zero, brighter with |value| (CIE lightness matches between the ramps within a few units): a token
    # without attribution is not highlighted on a dark terminal.
    Colormap("dark", "black at zero: red to yellow +, blue to cyan -",
             (16, 52, 88, 124, 160, 196, 202, 208, 214, 220, 226), (16, 18, 19, 20, 21, 27, 33, 39, 45, 51, 159),
             (8, 1, 9, 3, 11), (8, 4, 12, 6, 14)),
    # White at zero, darker and more saturated with |value|, as attributions are printed in papers (and as a light
    # terminal theme wants them).
    Colormap("light", "white at zero: to red +, to blue -",
             (231, 224, 217, 210, 203, 196, 160, 124, 88), (231, 189, 117, 111, 69, 33, 27, 21, 19),
             (15, 11, 9, 1), (15, 14, 6, 4)),
)}
DEFAULT_COLORMAP = "dark"
_RGB = {(c.name, cold): np.array([Color.from_ansi(i).get_truecolor() for i in (c.cold_256 if cold else c.warm_256)],
                                 dtype=np.float64)
        for c in COLORMAPS.values() for cold in (False, True)}


def detect_mode(no_color: bool, color_system: str | None) -> Mode:
    """The display mode for a terminal, from NO_COLOR and the colour system rich detected from the environment
    (``console.color_system``: "truecolor" with COLORTERM=truecolor, "256" for TERM=*-256color, ...)."""
    if no_color or color_system is None:
        return "mono"
    if color_system == "truecolor":
        return "truecolor"
    if color_system == "256":
        return "256"
    return "16"


@dataclass(frozen=True)
class Scale:
    """Normalised scores of one view. ``values`` lie in [-1, 1] (signed) or [0, 1]; ``lo``/``hi`` are the scores
    at the ends of the scale (-M and +M for signed views, min and max otherwise)."""

    values: np.ndarray
    lo: float
    hi: float
    signed: bool


def explained_dominates(scores: np.ndarray, content: np.ndarray) -> bool:
    """True when a token outside ``content`` (a bool mask) has DOMINANCE times the largest |score| of the content
    tokens: a scale over every token would then give all the content one colour."""
    s = np.abs(np.nan_to_num(np.asarray(scores, np.float64), nan=0.0, posinf=0.0, neginf=0.0))
    content = np.asarray(content, bool)[: len(s)]
    if not content.any() or content.all():
        return False
    return bool(s[~content].max() >= DOMINANCE * s[content].max())


def normalize(scores: np.ndarray, signed: bool, keep: np.ndarray | None = None) -> Scale:
    """Normalise one view's scores. Non-finite scores count as 0 and never set the scale; neither do the tokens
    ``keep`` (a bool mask) leaves out, which are drawn at the scale's ends."""
    s = np.asarray(scores, dtype=np.float64)
    finite = np.isfinite(s)
    s = np.where(finite, s, 0.0)
    if keep is not None and (finite & np.asarray(keep, bool)[: len(s)]).any():
        finite = finite & np.asarray(keep, bool)[: len(s)]
    if signed:
        m = float(np.abs(s[finite]).max()) if finite.any() else 0.0
        values = s / m if m > 0 else np.zeros_like(s)
        return Scale(np.clip(values, -1.0, 1.0), -m, m, True)
    lo = float(s[finite].min()) if finite.any() else 0.0
    hi = float(s[finite].max()) if finite.any() else 0.0
    values = (s - lo) / (hi - lo) if hi > lo else np.zeros_like(s)
    return Scale(np.clip(values, 0.0, 1.0), lo, hi, False)


def normalize_within(values: np.ndarray, signed: bool, lo: float | None = None, hi: float | None = None) -> Scale:
    """Normalise ``values`` on a scale with given ends: [lo, hi] (non-negative) or [-hi, hi] (signed), each end its
    own range where None. Used for scales wider than one view: a whole example, or the whole store."""
    x = np.nan_to_num(np.asarray(values, np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    if signed:
        big = float(np.abs(x).max()) if hi is None and x.size else float(hi or 0.0)
        v = x / big if big > 0 else np.zeros_like(x)
        return Scale(np.clip(v, -1, 1), -big, big, True)
    lo = float(x.min()) if lo is None and x.size else float(lo or 0.0)
    hi = float(x.max()) if hi is None and x.size else float(hi or 0.0)
    v = (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)
    return Scale(np.clip(v, 0, 1), lo, hi, False)


def top_k(scores: np.ndarray, signed: bool, k: int) -> set[int]:
    """Positions of the k largest scores (largest |score| for signed methods). Non-finite scores never count."""
    s = np.asarray(scores, dtype=np.float64)
    key = np.abs(s) if signed else s
    key = np.where(np.isfinite(key), key, -np.inf)
    k = max(0, min(k, len(s)))
    if k == 0:
        return set()
    order = np.argsort(-key, kind="stable")[:k]
    return {int(i) for i in order if np.isfinite(key[i])}


def default_k(n: int) -> int:
    """How many tokens to mark as top-k: 5, but at most a quarter of the example (at least 1)."""
    return max(1, min(5, n // 4))


def glyph(value: float) -> str:
    """Glyph of the ramp for a normalised value (its magnitude)."""
    level = int(abs(float(value)) * len(GLYPHS))
    return GLYPHS[min(max(level, 0), len(GLYPHS) - 1)]


def sign_mark(value: float) -> str:
    """'+' or '-' for the sign of a value ('·' for exactly 0): colourless output must not rely on hue for sign."""
    v = float(value)
    return "+" if v > 0 else "-" if v < 0 else "·"


def _level(value: float, n_levels: int) -> int:
    """Bucket |value| in [0, 1] into the nearest of n_levels steps (0..n_levels-1)."""
    a = min(abs(float(value)), 1.0)
    return int(min(n_levels - 1, max(0, round(a * (n_levels - 1)))))


def background(value: float, mode: Mode, cmap: str = DEFAULT_COLORMAP) -> Color | None:
    """Background colour of a normalised value in colormap ``cmap`` (negative values use its cold ramp); None in
    mono mode."""
    v = float(value)
    if mode == "mono" or not np.isfinite(v):
        return None
    cold = v < 0
    c = COLORMAPS[cmap]
    if mode == "16":
        ramp = c.cold_16 if cold else c.warm_16
        return Color.from_ansi(ramp[_level(v, len(ramp))])
    if mode == "256":
        ramp = c.cold_256 if cold else c.warm_256
        return Color.from_ansi(ramp[_level(v, len(ramp))])
    rgb = c.rgb(cold)
    x = min(abs(v), 1.0) * (len(rgb) - 1)
    i = min(int(x), len(rgb) - 2)
    mix = rgb[i] + (rgb[i + 1] - rgb[i]) * (x - i)
    r, g, b = (int(round(c)) for c in mix)
    return Color.from_rgb(r, g, b)


def lightness(color: Color) -> float:
    """CIE L* (0 black .. 100 white) of a colour: how bright it looks."""

    def linear(c: float) -> float:
        c /= 255.0
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in color.get_truecolor())
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return 116.0 * y ** (1.0 / 3.0) - 16.0 if y > 0.008856 else 903.3 * y


def token_style(value: float, mode: Mode, *, top: bool = False, cmap: str = DEFAULT_COLORMAP) -> Style:
    """Style of a token: a background from the scale with a readable foreground; bold + underline for top-k."""
    bg = background(value, mode, cmap)
    if bg is None:
        return Style(bold=top, underline=top)
    light = lightness(bg) > 60
    if mode == "16":
        fg = Color.from_ansi(0) if light else Color.from_ansi(15)
    else:
        fg = Color.from_rgb(0, 0, 0) if light else Color.from_rgb(255, 255, 255)
    return Style(color=fg, bgcolor=bg, bold=top, underline=top)


#: Head-mask marks: not selected, selected, selected by two or more sources (a mask combined by "sum").
MASK_MARKS = ("·", "●", "◆")


def mask_mark(value: int) -> str:
    """The glyph of a head-mask value: the shape alone tells selected from not (NO_COLOR keeps it readable)."""
    return MASK_MARKS[min(max(int(value), 0), len(MASK_MARKS) - 1)]


def mask_style(value: int, mode: Mode) -> Style:
    """Style of a head-mask cell: a selected head is bold on the warm ramp (brighter when selected twice); in mono
    mode it is bold only and the glyph (:func:`mask_mark`) carries the rest. Unselected heads are unstyled."""
    v = int(value)
    if v <= 0:
        return Style()
    return token_style(0.6 if v == 1 else 1.0, mode) + Style(bold=True)


def format_score(x: float) -> str:
    """Short, fixed-looking number for the colour bar: 3 significant digits."""
    if x == 0:
        return "0"
    return f"{x:.3g}"
