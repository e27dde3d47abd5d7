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

from store.figure import BAR_STEPS, Figure
from store.render_html import to_html  # one HTML renderer: the notebooks' views are the same figure

from .colors import format_score

# ---------------------------------------------------------------- SVG
_CHAR_W, _LINE_H, _FONT = 8.4, 22, 14


def to_svg(fig: Figure) -> str:
    """A standalone SVG: a label column, one line of token boxes per method, the colour bar of the first row."""
    label_w = max(len(name) for name, _ in fig.rows) * _CHAR_W + 16
    parts, width = [], 0.0
    y = 34
    parts.append(f'<text x="8" y="18" font-weight="bold">{html.escape(fig.example_id)}'
                 f'<tspan font-weight="normal" fill="#666"> {html.escape(fig.note)}</tspan></text>')
    for name, row in fig.cells():
        x = label_w
        parts.append(f'<text x="8" y="{y + 15}" font-weight="bold">{html.escape(name)}</text>')
        for k, (text, joined, colour, dark) in enumerate(row):
            w = max(len(text), 1) * _CHAR_W + 6
            x += 0 if joined else 4
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{_LINE_H - 2}" fill="{colour}"/>')
            mark = "▸" if k == fig.explained else ""
            parts.append(f'<text x="{x + 3:.1f}" y="{y + 15}" fill="{"#000" if dark else "#fff"}">'
                         f'{html.escape(mark + text)}</text>')
            x += w
        width = max(width, x)
        y += _LINE_H + 4
    scale = fig.rows[0][1]
    parts.append(f'<text x="8" y="{y + 14}">{html.escape(format_score(scale.lo))}</text>')
    for j, (_, colour) in enumerate(fig.bar(scale)):
        parts.append(f'<rect x="{label_w + 4 + j * 18}" y="{y + 2}" width="18" height="14" fill="{colour}"/>')
    parts.append(f'<text x="{label_w + 8 + BAR_STEPS * 18}" y="{y + 14}">'
                 f'{html.escape(format_score(scale.hi))}</text>')
    height = y + 26
    width = max(width, label_w + 80 + BAR_STEPS * 18) + 8
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height}" '
            f'viewBox="0 0 {width:.0f} {height}" font-family="DejaVu Sans Mono, monospace" font-size="{_FONT}">\n'
            f'<rect width="100%" height="100%" fill="#ffffff"/>\n' + "\n".join(parts) + "\n</svg>\n")


# ---------------------------------------------------------------- LaTeX
_TEX_SPECIALS = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&", "#": r"\#",
                 "^": r"\textasciicircum{}", "_": r"\_", "~": r"\textasciitilde{}", "%": r"\%"}


def tex_escape(text: str) -> str:
    return "".join(_TEX_SPECIALS.get(ch, ch) for ch in text)


def to_latex(fig: Figure) -> str:
    """A LaTeX snippet (xcolor): colours defined once, one line of \\colorbox per method, a colour bar."""
    names: dict[str, str] = {}

    def colour_name(hex_colour: str) -> str:
        if hex_colour not in names:
            names[hex_colour] = f"attr{len(names)}"
        return names[hex_colour]

    lines = []
    for name, row in fig.cells():
        boxes = []
        for k, (text, joined, colour, dark) in enumerate(row):
            body = tex_escape(("▸" if k == fig.explained else "") + text)
            if not dark:
                body = r"\textcolor{white}{" + body + "}"
            boxes.append(("" if joined or not boxes else r"\,") + r"\colorbox{" + colour_name(colour) + "}{"
                         + r"\strut " + body + "}")
        lines.append(r"\textbf{" + tex_escape(name) + r"} & " + "".join(boxes) + r" \\")
    scale = fig.rows[0][1]
    bar = "".join(r"\colorbox{" + colour_name(c) + r"}{\strut\hspace{0.6em}}" for _, c in fig.bar(scale))
    lines.append(r"\multicolumn{2}{l}{\small " + tex_escape(format_score(scale.lo)) + r"\," + bar + r"\,"
                 + tex_escape(format_score(scale.hi)) + r"} \\")
    defs = [r"\definecolor{" + n + "}{HTML}{" + c.lstrip("#").upper() + "}" for c, n in names.items()]
    return ("% attr-tui figure: " + tex_escape(fig.example_id) + (" (" + tex_escape(fig.note) + ")" if fig.note else "")
            + "\n% needs \\usepackage{xcolor}\n" + "\n".join(defs) + "\n\\setlength{\\fboxsep}{1pt}\n"
            + "\\begin{tabular}{@{}ll@{}}\n" + "\n".join(lines) + "\n\\end{tabular}\n")


WRITERS = {"svg": to_svg, "tex": to_latex, "html": to_html}


def safe_stem(text: str) -> str:
    """A file-name-safe version of an example id or store name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "example"


def write_figure(fig: Figure, directory: str, stem: str) -> list[str]:
    """Write the figure in every format into ``directory`` as ``stem``.svg/.tex/.html; the paths written."""
    paths = []
    for ext, writer in WRITERS.items():
        path = os.path.join(directory, f"{stem}.{ext}")
        tmp = path + ".part"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(writer(fig))
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
