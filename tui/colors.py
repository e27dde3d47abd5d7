"""Colour scales and the glyph ramp: pure functions from scores to rich styles (no Textual).

Scores are first normalised per view (:func:`normalize`, from store/palette.py with the colormaps and their RGB,
which the notebooks' HTML shares): signed methods to [-1, 1] by the largest |score| (so 0 stays in the middle of a
diverging scale), non-negative methods to [0, 1] between the smallest and the largest score. A normalised value then
maps to a background colour (:func:`background`) in the terminal's colour mode, or, where colour is not available
(NO_COLOR), to a glyph of the ramp :data:`GLYPHS` plus a sign mark (:func:`sign_mark`).

The colour ramps (:data:`COLORMAPS`) are runs of xterm-256 palette entries: in 256-colour mode (SSH does not
forward COLORTERM) a value maps to one entry exactly, in truecolor mode it is interpolated between them, in 16-colour
mode it is bucketed into a few standard colours. In the default map ("dark") lightness grows with |value| from black
at 0; negative values are blue to cyan, positive ones red to yellow. The "light" map starts from white at 0.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from rich.color import Color
from rich.style import Style

# The scales as numbers are store/'s (its HTML views colour tokens without rich); this module re-exports them.
from store.palette import (COLORMAPS, DEFAULT_COLORMAP, DOMINANCE, SCALE_TOKEN_NAMES, SCALE_TOKENS,  # noqa: F401
                           Scale, clip_legend, clip_mark, content_tokens, default_scale_tokens, explained_dominates,
                           format_score, normalize, normalize_within, rgb, rgb_many, scale_keep)
from store.palette import lightness as rgb_lightness

Mode = Literal["truecolor", "256", "16", "mono"]
MODES: tuple[str, ...] = ("truecolor", "256", "16", "mono")

#: What a colour scale spans: one view (this example, this layer), one example (all its views), or the whole store.
NORMALISATIONS: tuple[str, ...] = ("view", "example", "global")
NORMALISATION_NAMES = {"view": "per view (this example, this layer)", "example": "per example (all its layers)",
                       "global": "global (the whole store, this layer)"}

#: Magnitude ramp used without colour: the lowest fifth of |value| is a blank, the top fifth a full block.
GLYPHS = " ░▒▓█"

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


def top_k(scores: np.ndarray, signed: bool, k: int, skip: int | None = None) -> set[int]:
    """Positions of the k largest scores (largest |score| for signed methods), leaving out position ``skip`` (the
    explained token: its score is the model's own output for several methods). Non-finite scores never count. The
    one top-k set: the underlined tokens and the compare screen's top-k overlap (agreement.top_k_overlap)."""
    s = np.asarray(scores, dtype=np.float64)
    key = np.abs(s) if signed else s
    key = np.where(np.isfinite(key), key, -np.inf)
    if skip is not None and 0 <= skip < len(key):
        key[skip] = -np.inf
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
    return Color.from_rgb(*rgb(v, cmap))


def background_styles(values, mode: Mode, cmap: str = DEFAULT_COLORMAP) -> list[Style]:
    """``Style(bgcolor=background(v, mode, cmap))`` of every value: the colours computed at once, each distinct
    colour's style made once (a layer strip built them cell by cell: half of the browse screen's draw)."""
    keys, make = _background_keys(values, mode, cmap)
    styles = {None: _NO_BACKGROUND}
    out = []
    for key in keys:
        style = styles.get(key)
        if style is None:
            style = styles[key] = Style(bgcolor=make(*key))
        out.append(style)
    return out


def token_styles(values, mode: Mode, top, cmap: str = DEFAULT_COLORMAP) -> list[Style]:
    """``token_style(v, mode, top=i in top, cmap)`` of every value (the i-th), each distinct style made once: a
    4,096-token example's colours one token at a time were most of its draw."""
    keys, make = _background_keys(values, mode, cmap)
    styles: dict = {}
    out = []
    for i, key in enumerate(keys):
        t = i in top
        style = styles.get((key, t))
        if style is None:
            if key is None:
                style = Style(bold=t, underline=t)
            else:
                bg = make(*key)
                light = lightness(bg) > 60
                if mode == "16":
                    fg = Color.from_ansi(0) if light else Color.from_ansi(15)
                else:
                    fg = Color.from_rgb(0, 0, 0) if light else Color.from_rgb(255, 255, 255)
                style = Style(color=fg, bgcolor=bg, bold=t, underline=t)
            styles[(key, t)] = style
        out.append(style)
    return out


def _background_keys(values, mode: Mode, cmap: str):
    """(a key per value, None where background() is None; ``make(*key)``: the key's colour)."""
    v = np.asarray(values, np.float64).ravel()
    if mode == "mono":
        return [None] * v.size, None
    if mode == "truecolor":
        return rgb_many(v, cmap), Color.from_rgb
    c = COLORMAPS[cmap]  # the ramp's step of each value, as _level rounds it
    ramps = {False: c.warm_16, True: c.cold_16} if mode == "16" else {False: c.warm_256, True: c.cold_256}
    size = np.minimum(np.abs(np.nan_to_num(v)), 1.0)
    steps = {cold: np.clip(np.round(size * (len(r) - 1)), 0, len(r) - 1).astype(int).tolist()
             for cold, r in ramps.items()}
    keys = [(bool(x < 0), steps[bool(x < 0)][j]) if np.isfinite(x) else None for j, x in enumerate(v.tolist())]
    return keys, lambda cold, k: Color.from_ansi(ramps[cold][k])


_NO_BACKGROUND = Style(bgcolor=None)


def lightness(color: Color) -> float:
    """CIE L* (0 black .. 100 white) of a colour: how bright it looks."""
    return rgb_lightness(color.get_truecolor())


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
