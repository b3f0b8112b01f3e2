"""The error-growth figure: per step (rows) and layer (columns), the worst error as a fraction
of its allowance, as a heat map beside a line per step through depth.

matplotlib draws it as a PNG when it is importable; otherwise this module writes the same
figure as SVG itself, so the project never needs matplotlib. Both are embedded in the HTML
report as a data: URI. Columns: `in` (embed, Engram), `L00`.., `out` (lane mean, final norm,
logits); a cell is the largest `error` of the points in that group at that step.
"""
from __future__ import annotations

import importlib.util
import io
import math
from html import escape

import pandas as pd

PASS_LO, PASS_HI = (237, 248, 233), (35, 139, 69)      # far under the bound -> near it
FAIL_LO, FAIL_HI = (252, 187, 161), (103, 0, 13)       # just over -> far over
DECADES = 4                                            # colour range: 1e-4 .. 1e4 of bound


def growth_matrix(df: pd.DataFrame):
    """(steps, columns, values[step][col], first (step index, col index) or None)."""
    steps = list(dict.fromkeys(df["step"]))
    layers = sorted(int(x) for x in set(df["layer"]) if x >= 0)
    cols = ["in"] + [f"L{i:02d}" for i in layers] + ["out"]

    def col_of(row):
        if row["layer"] >= 0:
            return f"L{int(row['layer']):02d}"
        return "out" if row["point"] in ("lane_mean", "final_norm", "logits") else "in"
    g = df.assign(col=df.apply(col_of, axis=1))
    vals = [[math.nan] * len(cols) for _ in steps]
    first = None
    for (step, col), sub in g.groupby(["step", "col"], sort=False):
        e = sub["error"].fillna(math.inf)
        vals[steps.index(step)][cols.index(col)] = float(e.max())
        if bool(sub["first_fail"].any()):
            first = (steps.index(step), cols.index(col))
    return steps, cols, vals, first


def colour(v: float) -> tuple:
    if not math.isfinite(v) and not (isinstance(v, float) and math.isnan(v)):
        return FAIL_HI
    if math.isnan(v):
        return (200, 200, 200)
    lv = math.log10(v) if v > 0 else -DECADES
    if v <= 1.0:
        t = min(max((lv + DECADES) / DECADES, 0.0), 1.0)
        lo, hi = PASS_LO, PASS_HI
    else:
        t = min(lv / DECADES, 1.0)
        lo, hi = FAIL_LO, FAIL_HI
    return tuple(round(a + (b - a) * t) for a, b in zip(lo, hi))


def _hex(rgb) -> str:
    return "#%02x%02x%02x" % rgb


def _label(v: float) -> str:
    if math.isnan(v):
        return ""
    if math.isinf(v):
        return "inf"
    return f"{v:.0e}" if v >= 1e3 or (0 < v < 1e-2) else ("0" if v == 0 else f"{v:.2g}")


def _yrange(vals):
    pos = [v for row in vals for v in row if math.isfinite(v) and v > 0]
    lo = math.floor(math.log10(min(pos))) if pos else -3
    hi = math.ceil(math.log10(max(pos))) if pos else 1
    return min(lo, -1), max(hi, 1)


def svg(steps, cols, vals, first, title: str) -> bytes:
    cw, ch, left, top = 44, 18, 78, 62          # top: title, subtitle, then column labels
    hm_w, hm_h = cw * len(cols), ch * len(steps)
    lx, lw, lh = left + hm_w + 70, 360, max(hm_h, 220)
    W, H = lx + lw + 30, top + max(hm_h, lh) + 70
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{left}" y="18" font-size="14" font-weight="bold">{escape(title)}</text>',
         f'<text x="{left}" y="34" fill="#555">worst error / allowance per step and layer '
         f'(1 = the rule\'s bound; red fails)</text>']
    for j, c in enumerate(cols):
        o.append(f'<text x="{left + j * cw + cw / 2}" y="{top - 4}" '
                 f'text-anchor="middle">{c}</text>')
    for i, s in enumerate(steps):
        y = top + i * ch
        o.append(f'<text x="{left - 6}" y="{y + ch - 5}" text-anchor="end">{escape(s)}</text>')
        for j, v in enumerate(vals[i]):
            rgb = colour(v)
            ink = "white" if sum(rgb) < 380 else "black"
            o.append(f'<rect x="{left + j * cw}" y="{y}" width="{cw}" height="{ch}" '
                     f'fill="{_hex(rgb)}" stroke="white"/>'
                     f'<text x="{left + j * cw + cw / 2}" y="{y + ch - 5}" text-anchor="middle" '
                     f'font-size="9" fill="{ink}">{_label(v)}</text>')
    if first is not None:
        i, j = first
        o.append(f'<rect x="{left + j * cw}" y="{top + i * ch}" width="{cw}" height="{ch}" '
                 f'fill="none" stroke="black" stroke-width="2.5" class="first-divergence"/>')
    lo, hi = _yrange(vals)
    ly = top
    ypix = lambda v: ly + lh - (min(max(math.log10(v), lo), hi) - lo) / (hi - lo) * lh \
        if v > 0 else ly + lh
    xpix = lambda j: lx + j * lw / max(len(cols) - 1, 1)
    o.append(f'<rect x="{lx}" y="{ly}" width="{lw}" height="{lh}" fill="none" stroke="#888"/>')
    for e in range(lo, hi + 1):
        y = ypix(10.0 ** e)
        o.append(f'<line x1="{lx}" x2="{lx + lw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                 f'<text x="{lx - 4}" y="{y + 4:.1f}" text-anchor="end">1e{e}</text>')
    for j, c in enumerate(cols):
        o.append(f'<text x="{xpix(j):.1f}" y="{ly + lh + 14}" text-anchor="middle">{c}</text>')
    y1 = ypix(1.0)
    o.append(f'<line x1="{lx}" x2="{lx + lw}" y1="{y1:.1f}" y2="{y1:.1f}" stroke="#c00" '
             f'stroke-dasharray="5,3"/><text x="{lx + lw - 2}" y="{y1 - 4:.1f}" '
             f'text-anchor="end" fill="#c00">bound</text>')
    worst = [max((r[j] for r in vals if not math.isnan(r[j])), default=math.nan)
             for j in range(len(cols))]
    for series, style in [(r, 'stroke="#9ab" stroke-width="1"') for r in vals] + \
            [(worst, 'stroke="#135" stroke-width="2.5"')]:
        pts = " ".join(f"{xpix(j):.1f},{ypix(v if math.isfinite(v) else 10.0 ** hi):.1f}"
                       for j, v in enumerate(series) if not math.isnan(v))
        o.append(f'<polyline points="{pts}" fill="none" {style}/>')
    o.append(f'<text x="{lx}" y="{ly + lh + 32}" fill="#555">thin: one line per step; '
             f'bold: worst over steps</text>')
    o.append("</svg>")
    return "\n".join(o).encode()


def png_matplotlib(steps, cols, vals, first, title: str) -> bytes:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    img = [[tuple(c / 255 for c in colour(v)) for v in row] for row in vals]
    fig, (a, b) = plt.subplots(1, 2, figsize=(4 + 0.5 * len(cols), 1.5 + 0.25 * len(steps)),
                               gridspec_kw={"width_ratios": [len(cols), 8]})
    a.imshow(img, aspect="auto", interpolation="nearest")
    a.set_xticks(range(len(cols)), cols, fontsize=7)
    a.set_yticks(range(len(steps)), steps, fontsize=7)
    for i, row in enumerate(vals):
        for j, v in enumerate(row):
            a.text(j, i, _label(v), ha="center", va="center", fontsize=5,
                   color="white" if sum(colour(v)) < 380 else "black")
    if first is not None:
        a.add_patch(Rectangle((first[1] - 0.5, first[0] - 0.5), 1, 1, fill=False, lw=2.5))
    lo, hi = _yrange(vals)
    for row in vals:
        b.plot(range(len(cols)), [max(v, 10.0 ** lo) for v in row], color="#9ab", lw=0.8)
    worst = [max((r[j] for r in vals if not math.isnan(r[j])), default=math.nan)
             for j in range(len(cols))]
    b.plot(range(len(cols)), [max(v, 10.0 ** lo) for v in worst], color="#135", lw=2.2,
           label="worst over steps")
    b.axhline(1.0, color="#c00", ls="--", lw=1, label="bound")
    b.set_yscale("log")
    b.set_ylim(10.0 ** lo, 10.0 ** hi)
    b.set_xticks(range(len(cols)), cols, fontsize=7)
    b.legend(fontsize=7)
    fig.suptitle(title + "  (error / allowance)", fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def fallback_note(backend: str):
    """What `--plot auto` should tell the user when it draws SVG for want of matplotlib."""
    if backend == "auto" and not have_matplotlib():
        return ("note: matplotlib is not installed, so the figure is SVG (pip install "
                "'needle-parity[plot]' for PNG)")
    return None


def growth_plot(df: pd.DataFrame, title: str = "error growth", backend: str = "auto"):
    """(mime type, image bytes). backend: "auto" (matplotlib if importable), "svg", "png"."""
    steps, cols, vals, first = growth_matrix(df)
    # "auto" decides by have_matplotlib(), the same test fallback_note() reports from
    if backend == "png" or (backend == "auto" and have_matplotlib()):
        return "image/png", png_matplotlib(steps, cols, vals, first, title)
    return "image/svg+xml", svg(steps, cols, vals, first, title)


def floor_matrix(df: pd.DataFrame):
    """Three-way rows (a noise floor beside the reference): per column of growth_matrix, the
    port's worst max|a-b|, the floor's worst max|floor-b| and the worst ratio in noise units.
    None when the rows have no floor."""
    if "floor_abs" not in df.columns or not df["floor_abs"].notna().any():
        return None
    _, cols, _, _ = growth_matrix(df)
    col = df["layer"].map(lambda x: f"L{int(x):02d}" if x >= 0 else None)
    col = col.where(col.notna(), df["point"].map(
        lambda p: "out" if p in ("lane_mean", "final_norm", "logits") else "in"))
    g = df.assign(col=col).groupby("col")
    pick = lambda name: [float(g[name].max().get(c, math.nan)) for c in cols]
    return cols, pick("max_abs"), pick("floor_abs"), pick("noise_ratio")


def floor_svg(cols, port, floor, ratio, title: str) -> bytes:
    """The port's error over the noise floor's, per layer (log scale), the ratio above each."""
    left, top, w, h = 70, 50, max(44 * len(cols), 300), 220
    W, H = left + w + 40, top + h + 60
    vals = [v for v in port + floor if math.isfinite(v) and v > 0]
    lo = math.floor(math.log10(min(vals))) if vals else -6
    hi = math.ceil(math.log10(max(vals))) if vals else 0
    hi = max(hi, lo + 1)
    ypix = lambda v: top + h - (min(max(math.log10(v), lo), hi) - lo) / (hi - lo) * h \
        if v > 0 else top + h
    xpix = lambda j: left + (j + 0.5) * w / len(cols)
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{left}" y="18" font-size="14" font-weight="bold">{escape(title)}</text>',
         f'<text x="{left}" y="34" fill="#555">worst max|a-b| (port, dark) and max|floor-b| '
         f'(noise floor, grey) per layer; above: worst ratio in noise units</text>',
         f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#888"/>']
    for e in range(lo, hi + 1):
        y = ypix(10.0 ** e)
        o.append(f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                 f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">1e{e}</text>')
    for series, style in ((floor, 'stroke="#999" stroke-dasharray="5,3" stroke-width="2"'),
                          (port, 'stroke="#135" stroke-width="2.5"')):
        pts = " ".join(f"{xpix(j):.1f},{ypix(v):.1f}" for j, v in enumerate(series)
                       if math.isfinite(v))
        o.append(f'<polyline points="{pts}" fill="none" {style}/>')
    for j, c in enumerate(cols):
        o.append(f'<text x="{xpix(j):.1f}" y="{top + h + 14}" text-anchor="middle">{c}</text>')
        if math.isfinite(ratio[j]):
            o.append(f'<text x="{xpix(j):.1f}" y="{top - 4}" text-anchor="middle" '
                     f'font-size="9">{ratio[j]:.2g}</text>')
    o.append("</svg>")
    return "\n".join(o).encode()
