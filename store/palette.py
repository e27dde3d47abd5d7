"""Colour scales as numbers: scores normalised per view, and the colormaps' RGB colours of normalised values.

Shared by the TUI (tui/colors.py turns these into terminal styles) and the HTML views of store/render_html.py
(notebooks, exported figures), so a token has the same colour on the screen, in a figure and in a notebook. Pure
numpy: store/ imports nothing else.

Scores are normalised per view (:func:`normalize`): signed methods to [-1, 1] by the largest |score| (so 0 stays in
the middle of a diverging scale), non-negative methods to [0, 1] between the smallest and the largest score. The
colour ramps (:data:`COLORMAPS`) are runs of xterm-256 palette entries: a terminal in 256-colour mode shows a value
as one entry exactly, truecolor (and HTML) interpolates between their RGB (:func:`rgb`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_CUBE = (0, 95, 135, 175, 215, 255)  # the xterm-256 colour cube's levels


def xterm_rgb(index: int) -> tuple[int, int, int]:
    """RGB of an xterm-256 entry of the colour cube or the grey ramp (16-255; 0-15 are the terminal's own)."""
    if not 16 <= index <= 255:
        raise ValueError(f"xterm colour {index}: only 16-255 have a fixed RGB")
    if index >= 232:
        return (8 + 10 * (index - 232),) * 3
    i = index - 16
    return _CUBE[i // 36], _CUBE[i // 6 % 6], _CUBE[i % 6]


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
_RGB = {(c.name, cold): np.array([xterm_rgb(i) for i in (c.cold_256 if cold else c.warm_256)], dtype=np.float64)
        for c in COLORMAPS.values() for cold in (False, True)}


def rgb(value: float, cmap: str = DEFAULT_COLORMAP) -> tuple[int, int, int] | None:
    """The colour of a normalised value in ``cmap``, interpolated along its ramp (negative values on the cold one);
    None for a non-finite value."""
    v = float(value)
    if not np.isfinite(v):
        return None
    ramp = COLORMAPS[cmap].rgb(v < 0)
    x = min(abs(v), 1.0) * (len(ramp) - 1)
    i = min(int(x), len(ramp) - 2)
    mix = ramp[i] + (ramp[i + 1] - ramp[i]) * (x - i)
    r, g, b = (int(round(c)) for c in mix)
    return r, g, b


def rgb_many(values, cmap: str = DEFAULT_COLORMAP) -> list[tuple[int, int, int] | None]:
    """:func:`rgb` of every value, computed at once with numpy (a layer strip colours hundreds of cells a frame;
    one value stays rgb's: an array per call made it 3x slower). The same numbers: tests/test_tui_strip_colours.py."""
    v = np.asarray(values, np.float64).ravel()
    out: list[tuple[int, int, int] | None] = [None] * v.size
    finite = np.isfinite(v)
    for cold in (False, True):
        at = np.flatnonzero(finite & ((v < 0) == cold))
        if not at.size:
            continue
        ramp = COLORMAPS[cmap].rgb(cold)
        x = np.minimum(np.abs(v[at]), 1.0) * (len(ramp) - 1)
        i = np.minimum(x.astype(np.int64), len(ramp) - 2)
        mix = ramp[i] + (ramp[i + 1] - ramp[i]) * (x - i)[:, None]
        for k, c in zip(at.tolist(), np.round(mix).astype(np.int64).tolist()):
            out[k] = (c[0], c[1], c[2])
    return out


def lightness(rgb_: tuple[int, int, int]) -> float:
    """CIE L* (0 black .. 100 white) of an RGB colour: how bright it looks."""

    def linear(c: float) -> float:
        c /= 255.0
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in rgb_)
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return 116.0 * y ** (1.0 / 3.0) - 16.0 if y > 0.008856 else 903.3 * y


@dataclass(frozen=True)
class Scale:
    """Normalised scores of one view. ``values`` lie in [-1, 1] (signed) or [0, 1]; ``lo``/``hi`` are the scores
    at the ends of the scale (-M and +M for signed views, min and max otherwise). ``over``: per token +1 where its
    score lies above the scale's high end, -1 below its low end (drawn at that end: clipped), else 0; None: none
    computed."""

    values: np.ndarray
    lo: float
    hi: float
    signed: bool
    over: np.ndarray | None = None


#: The marks after a clipped token (Scale.over): above the scale's high end, below its low end.
CLIP_MARKS = {1: "↑", -1: "↓"}
_CLIP_TOLERANCE = 1e-9  # a score at the end itself is not beyond it (float rounding)


def _clipped(values: np.ndarray, signed: bool) -> Scale:
    """``values`` (normalised, not yet clipped) with the tokens beyond the scale's ends marked."""
    low = -1.0 if signed else 0.0
    over = np.where(values > 1.0 + _CLIP_TOLERANCE, 1, np.where(values < low - _CLIP_TOLERANCE, -1, 0))
    return np.clip(values, low, 1.0), over.astype(np.int8)


def clip_mark(scale: Scale, i: int) -> str:
    """The mark after token ``i`` of ``scale``: CLIP_MARKS when it is clipped, else ""."""
    return CLIP_MARKS.get(int(scale.over[i]), "") if scale.over is not None and i < len(scale.over) else ""


def clip_legend(scales) -> str:
    """The colour bar's legend of the marks the tokens of ``scales`` carry ("↑↓ clipped"), "" when none."""
    overs = [np.asarray(sc.over) for sc in scales if sc.over is not None]
    # a comparison per sign, not np.unique: that imports numpy.ma (a tenth of attr-tui's open, at its first draw)
    marks = [m for m in (1, -1) if any((o * m > 0).any() for o in overs)]
    return "".join(CLIP_MARKS[m] for m in marks) + " clipped" if marks else ""


def normalize(scores: np.ndarray, signed: bool, keep: np.ndarray | None = None) -> Scale:
    """Normalise one view's scores. Non-finite scores count as 0 and never set the scale; neither do the tokens
    ``keep`` (a bool mask) leaves out, which are drawn at the scale's ends when beyond them (Scale.over)."""
    s = np.asarray(scores, dtype=np.float64)
    finite = np.isfinite(s)
    s = np.where(finite, s, 0.0)
    if keep is not None and (finite & np.asarray(keep, bool)[: len(s)]).any():
        finite = finite & np.asarray(keep, bool)[: len(s)]
    if signed:
        m = float(np.abs(s[finite]).max()) if finite.any() else 0.0
        values, over = _clipped(s / m if m > 0 else np.zeros_like(s), True)
        return Scale(values, -m, m, True, over)
    lo = float(s[finite].min()) if finite.any() else 0.0
    hi = float(s[finite].max()) if finite.any() else 0.0
    values, over = _clipped((s - lo) / (hi - lo) if hi > lo else np.zeros_like(s), False)
    return Scale(values, lo, hi, False, over)


def cut_after(scale: Scale, upto: int) -> Scale:
    """``scale`` without values from position ``upto`` on (NaN, drawn without colour): a generation step's tokens
    from its target on carry no attribution. ``upto`` < 0: every position keeps its value."""
    if upto < 0:
        return scale
    values = np.asarray(scale.values, np.float64).copy()
    values[upto:] = np.nan
    over = None if scale.over is None else np.where(np.arange(len(scale.over)) < upto, scale.over, 0).astype(np.int8)
    return Scale(values, scale.lo, scale.hi, scale.signed, over)


def normalize_within(values: np.ndarray, signed: bool, lo: float | None = None, hi: float | None = None) -> Scale:
    """Normalise ``values`` on a scale with given ends: [lo, hi] (non-negative) or [-hi, hi] (signed), each end its
    own range where None. Used for scales wider than one view: a whole example, or the whole store."""
    x = np.nan_to_num(np.asarray(values, np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    if signed:
        big = float(np.abs(x).max()) if hi is None and x.size else float(hi or 0.0)
        v, over = _clipped(x / big if big > 0 else np.zeros_like(x), True)
        return Scale(v, -big, big, True, over)
    lo = float(x.min()) if lo is None and x.size else float(lo or 0.0)
    hi = float(x.max()) if hi is None and x.size else float(hi or 0.0)
    v, over = _clipped((x - lo) / (hi - lo) if hi > lo else np.zeros_like(x), False)
    return Scale(v, lo, hi, False, over)


#: Which tokens set a colour scale: every one, or the content tokens (all but the special tokens and the explained
#: one, whose score is often the model's own output: rollout's [CLS] 0.66 next to words of 0.02-0.04).
SCALE_TOKENS: tuple[str, ...] = ("content", "all")
SCALE_TOKEN_NAMES = {"content": "w/o specials", "all": "all tokens"}
DOMINANCE = 3.0  # a token outside the content this many times larger than every content token dominates the scale


def content_tokens(special: np.ndarray | None, explain_pos: int, n: int) -> np.ndarray:
    """[n] bool: the tokens that are neither special (a store's segment -1) nor the explained one."""
    keep = np.ones(n, bool) if special is None else ~np.asarray(special, bool)[:n].copy()
    if 0 <= explain_pos < n:
        keep[explain_pos] = False
    return keep


def explained_dominates(scores: np.ndarray, content: np.ndarray) -> bool:
    """True when a token outside ``content`` (a bool mask) has DOMINANCE times the largest |score| of the content
    tokens: a scale over every token would then give all the content one colour."""
    s = np.abs(np.nan_to_num(np.asarray(scores, np.float64), nan=0.0, posinf=0.0, neginf=0.0))
    content = np.asarray(content, bool)[: len(s)]
    if not content.any() or content.all():
        return False
    return bool(s[~content].max() >= DOMINANCE * s[content].max())


def default_scale_tokens(scores: np.ndarray, content: np.ndarray) -> str:
    """The tokens that set a view's scale unless a user chose (SCALE_TOKENS), one rule for every face (the TUI, the
    figures, the notebooks): the content tokens when a token outside them dominates this example, else all."""
    return "content" if explained_dominates(scores, content) else "all"


def scale_keep(scores: np.ndarray, content: np.ndarray, tokens: str | None = None) -> np.ndarray | None:
    """The mask of the tokens that set the scale (normalize's ``keep``; None: all) under ``tokens`` (SCALE_TOKENS),
    the default rule when None."""
    tokens = tokens or default_scale_tokens(scores, content)
    return content if tokens == "content" and np.asarray(content, bool).any() else None


def format_score(x: float) -> str:
    """Short, fixed-looking number for the colour bar: 3 significant digits."""
    if x == 0:
        return "0"
    return f"{x:.3g}"
