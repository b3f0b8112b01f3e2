"""The systematic statistics as a report shows them: per point its scale estimate with a 95 %
interval, in units of the point's margin, points in ladder order grouped by layer (an SVG of
plain shapes, no dependency), and the same numbers as a table."""
from __future__ import annotations

from html import escape

import pandas as pd

from ladder.engine.trace import layer_of

CLIP = 8.0          # margins: an estimate further out is drawn at the edge, its number kept
Z95 = 1.96


def systematic_frame(results: list) -> pd.DataFrame:
    rows = []
    for r in results:
        rows.append(dict(point=r.point, result=r.status, kind=r.kind if r.status != "pass"
                         else "", positions=r.clusters, scale_minus_1=r.scale.value,
                         scale_se=r.scale.se, scale_p=r.scale.p_adj, bias=r.bias.value,
                         bias_se=r.bias.se, bias_p=r.bias.p_adj, toward_zero=r.toward.value,
                         toward_p=r.toward.p_adj, iterations=r.iterations.value,
                         iterations_se=r.iterations.se, iterations_p=r.iterations.p_adj,
                         iterations_along=r.along, margin=r.scale.margin))
    return pd.DataFrame(rows)


def systematic_svg(results: list, title: str) -> bytes:
    pts = [r for r in results if r.scale.se == r.scale.se and r.scale.margin > 0]
    W, H, left, top, bottom = max(420, 12 + 5 * len(pts)), 260, 48, 28, 40
    plot_h = H - top - bottom
    y = lambda v: top + plot_h / 2 - max(-CLIP, min(CLIP, v)) / CLIP * plot_h / 2
    x = lambda i: left + 4 + i * 5
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W + left}" height="{H}" '
           f'font-family="sans-serif" font-size="10">',
           f'<text x="{left}" y="14" font-size="12">{escape(title)}: scale - 1 in margins, '
           f'95 % interval (Holm-corrected verdicts: red fails, orange a finding)</text>',
           f'<rect x="{left}" y="{y(1):.1f}" width="{W - 8}" height="{y(-1) - y(1):.1f}" '
           f'fill="#e8f4ea"/>']
    for v in (-CLIP, -1, 0, 1, CLIP):
        out.append(f'<line x1="{left}" x2="{left + W - 8}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                   f'stroke="#ccc"/><text x="{left - 4}" y="{y(v) + 3:.1f}" '
                   f'text-anchor="end">{v:+g}</text>')
    last = object()
    for i, r in enumerate(pts):
        m, s, e = r.scale.margin, r.scale.value, r.scale.se
        colour = "#b00" if r.failed else "#e08a00" if r.finding else "#456"
        lay = layer_of(r.point)
        if lay != last:
            out.append(f'<line x1="{x(i) - 2.5}" x2="{x(i) - 2.5}" y1="{top}" '
                       f'y2="{top + plot_h}" stroke="#eee"/><text x="{x(i)}" '
                       f'y="{H - bottom + 14}">{"" if lay is None else f"L{lay}"}</text>')
            last = lay
        out.append(f'<line x1="{x(i)}" x2="{x(i)}" y1="{y((s - Z95 * e) / m):.1f}" '
                   f'y2="{y((s + Z95 * e) / m):.1f}" stroke="{colour}"/>'
                   f'<circle cx="{x(i)}" cy="{y(s / m):.1f}" r="1.8" fill="{colour}">'
                   f'<title>{escape(r.point)}: {escape(r.text())}</title></circle>')
    out.append("</svg>")
    return "\n".join(out).encode()
