"""Paper figures of one example: its tokens coloured by several methods, one line per method, with a colour bar.

Three formats from one description (:class:`store.figure.Figure`): SVG (standalone, opens in a browser or
Inkscape), LaTeX (a ``figure`` body of ``\\colorbox``es with ``xcolor`` colours defined once; needs
``\\usepackage{xcolor}``) and HTML (one self-contained file, from store/render_html.py, which draws the notebooks'
views too). Colours are the TUI's truecolor ramps, so the figure looks like the screen. Token text is escaped for
each format: a token is data, never markup. Pure (no Textual, no HDF5).
"""

from __future__ import annotations

import html
import os
import re
import unicodedata

from store.figure import BAR_STEPS, Figure
from store.render_html import to_html  # one HTML renderer: the notebooks' views are the same figure
from store.text import printable

from .colors import format_score

# ---------------------------------------------------------------- SVG
_CHAR_W, _LINE_H, _FONT = 8.4, 22, 14
MAX_WIDTH = 960  # px: the tokens of a row wrap onto more lines within it (a page's width at 100 dpi)


def _svg_text(text: str) -> str:
    """Text for an SVG (XML) text node: control characters escaped as shown on screen (XML 1.0 forbids most)."""
    return html.escape(printable(text))


def _bar_ends(scale) -> tuple[str, str]:
    """The numbers at a colour bar's ends: its low end and its high end (signed: "+" before a positive end)."""
    return format_score(scale.lo), ("+" if scale.signed and scale.hi > 0 else "") + format_score(scale.hi)


def _blocks(fig: Figure):
    """(method, its token cells, the scale of the bar under it or None) per method: each method's bar follows its
    tokens when the scales differ; one bar after the last method when they share one (Figure.bars)."""
    bars = fig.bars()
    shared = len(bars) == 1 and not bars[0][0]
    cells = fig.cells()
    return [(name, row, (None if k < len(cells) - 1 else bars[0][1]) if shared else scale)
            for k, ((name, row), (_, scale)) in enumerate(zip(cells, fig.rows))]


def to_svg(fig: Figure) -> str:
    """A standalone SVG: a label column, then per method its tokens in lines of at most MAX_WIDTH px (a word's
    pieces stay together) and its colour bar with its ends (one bar at the end when the scales are shared), a gap
    between the methods. The bars' low ends are right-aligned in one column, so that every ramp starts at one x and
    no number reaches into the label column."""
    label_w = max(len(name) for name, _ in fig.rows) * _CHAR_W + 16
    lo_w = max(len(_bar_ends(scale)[0]) for _, scale in fig.rows) * _CHAR_W
    ramp_x = label_w + 4 + lo_w + 6
    limit = MAX_WIDTH - 8
    parts, width = [], 0.0
    y = 34
    # U+00A0 around the separator: XML collapses an ordinary space at the start of the tspan
    parts.append(f'<text x="8" y="18" font-weight="bold">{_svg_text(fig.example_id)}'
                 f'<tspan font-weight="normal" fill="#666">\u00a0·\u00a0{_svg_text(fig.note)}</tspan></text>')
    for name, row, bar in _blocks(fig):
        x = label_w
        parts.append(f'<text x="8" y="{y + 15}" font-weight="bold">{html.escape(printable(name))}</text>')
        shown = [(("▸" if k == fig.explained else "") + text, joined, colour, dark)
                 for k, (text, joined, colour, dark) in enumerate(row)]
        widths = [max(len(text), 1) * _CHAR_W + 6 for text, *_ in shown]
        for k, (text, joined, colour, dark) in enumerate(shown):
            if not joined:
                end = k + 1  # the word: this token and the pieces joined to it
                while end < len(shown) and shown[end][1]:
                    end += 1
                word = 4 + sum(widths[k:end])
                if x > label_w and x + word > limit:  # the next line, under the first token
                    width = max(width, x)
                    x = label_w
                    y += _LINE_H
                x += 4
            w = widths[k]
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{_LINE_H - 2}" fill="{colour}"/>')
            parts.append(f'<text x="{x + 3:.1f}" y="{y + 15}" fill="{"#000" if dark else "#fff"}">'
                         f'{html.escape(text)}</text>')
            x += w
        width = max(width, x)
        y += _LINE_H
        if bar is not None:
            lo, hi = _bar_ends(bar)
            parts.append(f'<text x="{ramp_x - 6 - len(lo) * _CHAR_W:.1f}" y="{y + 14}">{html.escape(lo)}</text>')
            for j, (_, colour) in enumerate(fig.bar(bar)):
                parts.append(f'<rect x="{ramp_x + j * 18:.1f}" y="{y + 2}" width="18" height="14" fill="{colour}"/>')
            hi_x = ramp_x + BAR_STEPS * 18 + 4
            parts.append(f'<text x="{hi_x:.1f}" y="{y + 14}">{html.escape(hi)}</text>')
            end = hi_x + len(hi) * _CHAR_W
            legend = fig.legend(bar)
            if legend:  # what the clipped tokens' marks mean
                parts.append(f'<text x="{end + 2 * _CHAR_W:.1f}" y="{y + 14}" fill="#666">{html.escape(legend)}</text>')
                end += (2 + len(legend)) * _CHAR_W
            width = max(width, end)
            y += 20
        y += 10  # the gap between methods
    height = y
    width = min(width + 8, MAX_WIDTH)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height}" '
            f'viewBox="0 0 {width:.0f} {height}" font-family="DejaVu Sans Mono, monospace" font-size="{_FONT}">\n'
            f'<rect width="100%" height="100%" fill="#ffffff"/>\n' + "\n".join(parts) + "\n</svg>\n")


# ---------------------------------------------------------------- LaTeX
_TEX_SPECIALS = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&", "#": r"\#",
                 "^": r"\textasciicircum{}", "_": r"\_", "~": r"\textasciitilde{}", "%": r"\%"}
# Combining marks (after NFD) as the LaTeX kernel's accent commands: "é" is e + U+0301 -> \'{e}.
_TEX_ACCENTS = {"\u0300": "`", "\u0301": "'", "\u0302": "^", "\u0303": "~", "\u0304": "=", "\u0307": ".",
                "\u0308": '"'}
_TEX_SYMBOLS = {"↑": r"$\uparrow$", "↓": r"$\downarrow$"}  # the clip marks (palette.CLIP_MARKS), the kernel's
_TEX_MARK = r"$\triangleright$"  # the explained token's mark (EXPLAINED_MARK), in the kernel's math symbols
_TEX_CHAR_EM = 0.75  # em per character of a bold label, a little over Computer Modern's widest lowercase average
_TEX_DIGIT_EM = 0.45  # em per character of a \small number (Computer Modern's digits are 0.5em at 10pt, \small 9pt)
_TEX_GAP = "[0.8ex]"  # the space after each method's block (tokens and bar)


def _tex_char(ch: str) -> str:
    if ch in _TEX_SPECIALS:
        return _TEX_SPECIALS[ch]
    if ch in _TEX_SYMBOLS:
        return _TEX_SYMBOLS[ch]
    if " " <= ch <= "~":
        return ch
    base, *marks = unicodedata.normalize("NFD", ch)
    if base.isascii() and base.isalpha() and len(marks) == 1 and marks[0] in _TEX_ACCENTS:
        return "\\" + _TEX_ACCENTS[marks[0]] + "{" + (r"\i" if base == "i" else base) + "}"
    folded = unicodedata.normalize("NFKD", ch)  # ligatures and compatibility forms: "ﬁ" -> "fi"
    if folded.isascii() and folded.isprintable() and folded != ch:
        return "".join(_tex_char(c) for c in folded)
    return f"[U+{ord(ch):04X}]"  # pdflatex's default fonts have no glyph for it: its code point, legibly


def tex_escape(text: str) -> str:
    """``text`` as LaTeX that pdflatex compiles with the kernel's fonts alone: ASCII, specials escaped, accented
    Latin letters as accent commands, anything else as its code point."""
    return "".join(_tex_char(ch) for ch in text)


def _tex_comment(text: str) -> str:
    """``text`` inside a % comment: one line (control characters escaped by printable), ASCII."""
    return tex_escape(printable(text).replace("·", "-"))


def to_latex(fig: Figure) -> str:
    """A LaTeX snippet (xcolor): colours defined once, one row per method whose tokens wrap within the line's
    width, its colour bar under it (one bar at the end when the scales are shared), a gap between the methods;
    everything inside a group, so that nothing it sets leaks into the document."""
    names: dict[str, str] = {}

    def colour_name(hex_colour: str) -> str:
        if hex_colour not in names:
            names[hex_colour] = f"attr{len(names)}"
        return names[hex_colour]

    lo_em = _TEX_DIGIT_EM * max(len(_bar_ends(scale)[0]) for _, scale in fig.rows)
    lines = []
    for name, row, bar in _blocks(fig):
        boxes = []
        for k, (text, joined, colour, dark) in enumerate(row):
            body = (_TEX_MARK if k == fig.explained else "") + tex_escape(text)
            if not dark:
                body = r"\textcolor{white}{" + body + "}"
            # a space between words is where a line may break; a word's pieces stay together
            boxes.append(("" if joined or not boxes else " ") + r"\colorbox{" + colour_name(colour) + "}{"
                         + r"\strut " + body + "}")
        lines.append(r"\textbf{" + tex_escape(name) + r"} & \raggedright " + "".join(boxes) + r" \tabularnewline")
        if bar is not None:  # under the tokens, its low end right-aligned in one box: every ramp starts at one x
            ramp = "".join(r"\colorbox{" + colour_name(c) + r"}{\strut\hspace{0.6em}}" for _, c in fig.bar(bar))
            lo, hi = _bar_ends(bar)
            legend = fig.legend(bar)
            lines.append(f" & \\makebox[{lo_em:.1f}em][r]{{\\small {tex_escape(lo)}}}\\," + ramp + r"\,\small "
                         + tex_escape(hi) + (r"\quad " + tex_escape(legend) if legend else "") + r" \tabularnewline")
        lines[-1] += _TEX_GAP  # the methods apart
    defs = [r"\definecolor{" + n + "}{HTML}{" + c.lstrip("#").upper() + "}" for c, n in names.items()]
    label_em = _TEX_CHAR_EM * max(len(tex_escape(name)) for name, _ in fig.rows)
    columns = (f"@{{}}p{{{label_em:.1f}em}}@{{\\hspace{{0.5em}}}}"
               f"p{{\\dimexpr\\linewidth-{label_em + 0.5:.1f}em\\relax}}@{{}}")
    return ("% attr-tui figure: " + _tex_comment(fig.example_id) + (" (" + _tex_comment(fig.note) + ")" if fig.note
                                                                     else "")
            + "\n% needs \\usepackage{xcolor}\n\\begingroup\n" + "\n".join(defs) + "\n\\setlength{\\fboxsep}{1pt}\n"
            + "\\noindent\\begin{tabular}{" + columns + "}\n" + "\n".join(lines) + "\n\\end{tabular}\\par\n\\endgroup\n")


WRITERS = {"svg": to_svg, "tex": to_latex, "html": to_html}


def safe_stem(text: str) -> str:
    """A file-name-safe version of an example id or store name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "example"


def figure_stem(store_name: str, example_id: str, methods: list[str], *, shared: bool = False,
                step: int = -1) -> str:
    """The file name (no extension) of an example's figure: the store, the example, a generation store's step
    (1-based), the methods (final scores) and a shared scale, so that a figure of other methods never takes another's
    name."""
    return "-".join([safe_stem(os.path.splitext(store_name)[0]), safe_stem(example_id)]
                    + ([f"step{step + 1}"] if step >= 0 else [])
                    + ["+".join(safe_stem(m) for m in methods)] + (["shared"] if shared else []))


def write_figure(fig: Figure, directory: str, stem: str) -> list[str]:
    """Write the figure in every format into ``directory`` as ``stem``.svg/.tex/.html, or as ``stem``-2, -3, ...
    when files of that name hold another figure (the same figure again rewrites its own files); the paths written."""
    texts = {ext: writer(fig) for ext, writer in WRITERS.items()}

    def taken(name: str) -> bool:  # a file of this name that holds something else
        for ext, text in texts.items():
            path = os.path.join(directory, f"{name}.{ext}")
            if os.path.exists(path):
                with open(path, encoding="utf-8", errors="replace") as f:
                    if f.read() != text:
                        return True
        return False

    name, n = stem, 1
    while taken(name):
        n += 1
        name = f"{stem}-{n}"
    paths = []
    for ext, text in texts.items():
        path = os.path.join(directory, f"{name}.{ext}")
        tmp = path + ".part"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)  # never a half-written figure
        paths.append(path)
    return paths


def export_directory(store_path: str | None = None) -> str:
    """Where exports go: the current directory when writable, else the store's, else the temporary directory."""
    import tempfile

    for d in (os.getcwd(), os.path.dirname(os.path.abspath(store_path)) if store_path else None):
        if d and os.access(d, os.W_OK):
            return d
    return tempfile.gettempdir()
