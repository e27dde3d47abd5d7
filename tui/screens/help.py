"""The help screen: key bindings, the colour scales and the glyph ramp used without colour."""

from __future__ import annotations

import numpy as np
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ..colors import DEFAULT_COLORMAP, GLYPHS, Mode, default_k, normalize
from ..render.tokens import JOIN_MARK, ColorBar

KEYS = (
    ("j ↓  k ↑", "next / previous example", "PgDn PgUp", "a page of examples"),
    ("]  [", "next / previous layer", "Home End", "first / last example"),
    ("m  M", "next / previous method", "g  l", "glyphs, layer strip"),
    ("tab  . ,", "scroll tokens; token cursor", "?  esc", "this help"),
    ("h  a", "head masks / attention", "f", "metrics (p: curves)"),
    ("c", "compare methods", "x", "token-to-token matrix"),
    ("e", "figure: SVG, TeX, HTML", "s  t", "scale: range, tokens"),
    ("/  n N", "search texts, next / prev.", "r", "reset sort and filter"),
    ("ctrl+p", "command palette", "q ^c  esc", "quit; close a screen"),
)

_H = Style(bold=True, underline=True)
_K = Style(bold=True)


GENERATION_KEYS = ("<  >", "step: the generated token", "v", "target × source heatmap")  # a generation store's


def help_text(mode: Mode, cmap: str = DEFAULT_COLORMAP, generation: bool = False) -> Text:
    """The help page (at most 74 cells wide, about 20 lines, so that it fits 80x24); a generation store's step keys
    after the others."""
    t = Text()
    t.append("Keys\n", _H)
    for k1, w1, k2, w2 in KEYS + ((GENERATION_KEYS,) if generation else ()):
        t.append(f"  {k1:<10}", _K)
        t.append(f"{w1:<28}")
        t.append(f"{k2:<11}", _K)
        t.append(f"{w2}\n")
    t.append("  layers step 1 … L then final (the method's scores); both wrap around\n", Style(dim=True))
    t.append("  compare: a methods, s scale, d A−B, + - top-k · matrix: s scale, arrows\n", Style(dim=True))
    t.append("Colours", _H)
    t.append(f" (mode {mode}; the bar shows the numbers at both ends)\n")
    t.append("  signed       ")
    t.append_text(ColorBar(normalize(np.array([-1.0, 1.0]), True), mode, glyphs=False, cmap=cmap).render(25))
    dark = cmap == "dark"
    t.append("  sign: see Glyphs\n" if mode == "mono" else "  blue -, red to yellow +\n" if dark else
             "  blue -, red +\n")
    t.append("  non-negative ")
    t.append_text(ColorBar(normalize(np.array([0.0, 1.0]), False), mode, glyphs=False, cmap=cmap).render(25))
    t.append("  min to max\n" if mode == "mono" else "  dark (min) to yellow (max)\n" if dark else
             "  white (min) to red (max)\n")
    t.append(f"  top-{default_k(100)} tokens (at most a quarter, not ▸ the explained): bold, underlined\n")
    t.append("Glyphs", _H)
    t.append(" (always on without colour, NO_COLOR; g toggles them)\n")
    t.append("  + -       ", _K)
    t.append("sign of the score (signed methods only)\n")
    t.append(f"  {GLYPHS!r:<10}", _K)
    t.append("|score| in fifths of the scale: blank lowest, █ highest\n")
    t.append(f"  play{JOIN_MARK}ing  ", _K)
    t.append("a '##' word piece, joined to the token before it\n")
    t.append("  ↑ ↓       ", _K)
    t.append("beyond the colour scale's high / low end (drawn at it)\n")
    t.append("  ▸         ", _K)
    t.append("the explained token (whose prediction the scores explain)\n")
    t.append("Sort and filter: ctrl+p, then sort: / filter:; esc cancels a long pass.", Style(dim=True))
    return t


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,question_mark", "dismiss", "close help", id="help.close"),
    ]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 78; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    """

    def __init__(self, mode: Mode, cmap: str = DEFAULT_COLORMAP, generation: bool = False):
        super().__init__()
        self.mode = mode
        self.cmap = cmap
        self.generation = generation

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(help_text(self.mode, self.cmap, self.generation), id="help-text")

    def action_dismiss(self) -> None:
        self.dismiss(None)
