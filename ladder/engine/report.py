"""Reports: markdown, CSV and a self-contained HTML page (no external file, script or font).

The HTML page holds the run's description, the verdict and the locate report, the
error-growth figure embedded as a data: URI (plot.py), the per-point summary with failing
rows highlighted (the first divergence strongest), the logits checks, the rules that judged
each point with their reasons, and every (step, point) row.
"""
from __future__ import annotations

import base64
import io
import os
from html import escape

import pandas as pd

from ladder.engine.compare import Comparison
from ladder.engine.plot import floor_matrix, floor_svg, growth_plot
from ladder.engine.systematic_plot import systematic_frame, systematic_svg
from ladder.engine.table import (GROWTH_LEGEND, HEADERS, SUMMARY, frame, summary, to_csv,
                                 to_markdown, fmt_number)

FULL = ["step", "point", "shape", "error", "passed", "max_abs", "max_rel", "ulp", "one_minus_cos",
        "sqnr_db", "mismatch", "nan_a", "nan_b", "inf_a", "inf_b", "rule", "growth",
        "first_bad_pos", "note"]

SYSTEMATIC_COLUMNS = ["point", "result", "kind", "positions", "scale_minus_1", "scale_se", "scale_p",
                      "bias", "bias_se", "bias_p", "toward_zero", "toward_p", "iterations",
                      "iterations_se", "iterations_p", "iterations_along", "margin"]

CSS = """
body{font-family:sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em} h2{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:right;white-space:nowrap}
th{background:#f3f3f3;position:sticky;top:0}
td.l,th.l{text-align:left} td.w{white-space:normal;min-width:30em}
tr.fail td{background:#fde0dc}
tr.first td{background:#f4a99b;font-weight:bold}
.pass{color:#176d2c;font-weight:bold} .div{color:#b00;font-weight:bold}
pre{background:#f7f7f7;padding:.8em;overflow-x:auto;font-size:12px;white-space:pre-wrap;
overflow-wrap:anywhere}
p.legend{font-size:12px;color:#555}
img{max-width:100%;border:1px solid #eee}
"""


def _table_html(df: pd.DataFrame, cols) -> str:
    left = {"step", "worst_step", "point", "rule", "note", "shape", "passed", "why", "pattern",
            "scale", "stat"}
    cl = lambda c: "l w" if c in ("why", "note") else ("l" if c in left else "")
    head = "".join(f'<th class="{cl(c)}">{escape(HEADERS.get(c, c))}</th>' for c in cols)
    rows = []
    for _, r in df.iterrows():
        cls = "first" if r.get("first_fail", False) else ("fail" if "passed" in r
                                                         and not r["passed"] else "")
        cells = "".join(f'<td class="{cl(c)}">{escape(fmt_number(r[c], c))}</td>' for c in cols)
        rows.append(f'<tr class="{cls}">{cells}</tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _rules_frame(cmp: Comparison) -> pd.DataFrame:
    used = {r.pattern for r in cmp.rows}
    return pd.DataFrame([dict(pattern=p, rtol=r.rtol, atol=r.atol, noise=r.noise, scale=r.scale,
                              stat=r.stat, used="yes" if p in used else "", why=r.why)
                         for p, r in cmp.rules.rules.items()])


def _logits_frame(cmp: Comparison) -> pd.DataFrame:
    return pd.DataFrame([dict(step=r.step, position=r.pos, argmax_port=r.argmax_a,
                              argmax_ref=r.argmax_b, near_tie=r.near_tie,
                              topk_agree=r.topk_agree, kl=r.kl, kl_bound=r.kl_bound,
                              passed=r.passed) for r in cmp.logits])


def html(cmp: Comparison, loc=None, info: dict | None = None, plot_backend="auto") -> str:
    df = frame(cmp)
    summ = summary(df)
    verdict = ('<span class="pass">PASS</span>: every point inside its rule' if cmp.passed
               else f'<span class="div">DIVERGENCE</span>: first at '
                    f'<b>{escape(cmp.first.key)}</b>')
    mime, img = growth_plot(df, title=f"{cmp.a_label} vs {cmp.b_label}", backend=plot_backend)
    uri = f"data:{mime};base64,{base64.b64encode(img).decode()}"
    info_rows = "".join(f"<tr><th class='l'>{escape(str(k))}</th><td class='l'>"
                        f"{escape(str(v))}</td></tr>" for k, v in (info or {}).items())
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>ladder: {escape(cmp.a_label)} vs {escape(cmp.b_label)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>needle-parity ladder: {escape(cmp.a_label)} vs {escape(cmp.b_label)}</h1>",
        f"<p>{verdict}. {len(cmp.rows)} points over {len(cmp.steps)} steps, "
        f"{len(cmp.failures)} failing.</p>",
        f"<table>{info_rows}</table>" if info_rows else "",
        f"<pre>{escape(str(cmp))}</pre>",
    ]
    if loc is not None:
        parts.append(f"<h2>Locate</h2><pre>{escape(str(loc))}</pre>")
    three = floor_matrix(df)
    floor_fig = [] if three is None else [
        "<h2>The port's error over the noise floor's</h2>",
        '<img alt="port error and noise-floor error per layer" src="data:image/svg+xml;base64,'
        + base64.b64encode(floor_svg(*three, title=cmp.floor_label or "noise floor")).decode()
        + '">']
    sys_fig = [] if not cmp.systematic else [
        "<h2>Systematic errors per point</h2>",
        '<img alt="systematic scale per point, in margins" src="data:image/svg+xml;base64,'
        + base64.b64encode(systematic_svg(cmp.systematic, cmp.a_label)).decode() + '">',
        _table_html(systematic_frame(cmp.systematic), SYSTEMATIC_COLUMNS)]
    parts += floor_fig + [
        "<h2>Error growth</h2>",
        f'<img alt="error / allowance per step and layer" src="{uri}">', *sys_fig,
        "<h2>Per point (worst step)</h2>",
        _table_html(summ, SUMMARY + ["growth", "note"]),
        f'<p class="legend">{escape(GROWTH_LEGEND)}</p>',
        "<h2>Logits</h2>", _table_html(_logits_frame(cmp), list(_logits_frame(cmp).columns))
        if cmp.logits else "<p>no logits point</p>",
        "<h2>Rules</h2>", _table_html(_rules_frame(cmp), ["pattern", "rtol", "atol", "noise",
                                                          "scale", "stat", "used", "why"]),
        f"<p>rules from {escape(cmp.rules.source)}; relative error floor "
        f"{cmp.rules.rel_floor:g}·max|ref|; top-{cmp.rules.logits.topk}, near ties within "
        f"{cmp.rules.logits.tie_factor:g} allowances.</p>",
        f"<details><summary><b>Every (step, point): {len(df)} rows</b></summary>",
        _table_html(df, FULL), f'<p class="legend">{escape(GROWTH_LEGEND)}</p>', "</details>",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


def markdown(cmp: Comparison, loc=None, info: dict | None = None) -> str:
    df = frame(cmp)
    out = [f"# needle-parity ladder: {cmp.a_label} vs {cmp.b_label}", "",
           ("**PASS**: every point inside its rule." if cmp.passed
            else f"**DIVERGENCE**: first at `{cmp.first.key}`."), ""]
    out += [f"- {k}: {v}" for k, v in (info or {}).items()]
    out += ["", "```", str(cmp), "```", ""]
    if loc is not None:
        out += ["## Locate", "", "```", str(loc), "```", ""]
    out += ["## Per point (worst step)", "",
            to_markdown(summary(df), SUMMARY),
            f"In the CSV (every step and point), {GROWTH_LEGEND}.", "",
            "## Rules", "", to_markdown(_rules_frame(cmp))]
    if cmp.systematic:
        out += ["", "## Systematic errors per point", "",
                to_markdown(systematic_frame(cmp.systematic), SYSTEMATIC_COLUMNS)]
    return "\n".join(out)


def write_report(cmp: Comparison, out_dir, loc=None, info: dict | None = None,
                 stem: str = "ladder", plot_backend="auto", also: dict | None = None) -> dict:
    """Write {stem}.md, {stem}.csv (every row, every column) and {stem}.html; their paths.

    Everything is rendered first and written to temporary files beside the targets, which
    are renamed into place only when all three exist (ladder/engine/atomic.py): a failure (no
    matplotlib for PNG, a full disk, a target that is a directory) leaves no partial or empty
    report behind, and earlier reports of the same stem as they were. `also`: more
    {path: text} (another report's render_report) written in the same all-or-nothing step."""
    from ladder.engine.atomic import write_all
    files, paths = render_report(cmp, out_dir, loc, info, stem, plot_backend)
    os.makedirs(out_dir, exist_ok=True)
    write_all({**files, **(also or {})})
    return paths


def render_report(cmp: Comparison, out_dir, loc=None, info: dict | None = None,
                  stem: str = "ladder", plot_backend="auto") -> tuple:
    """({path: text} of the three files, {ext: path}), nothing written."""
    page = html(cmp, loc, info, plot_backend)
    text = markdown(cmp, loc, info)
    paths = {ext: os.path.join(out_dir, f"{stem}.{ext}") for ext in ("md", "csv", "html")}
    csv = io.StringIO()
    to_csv(frame(cmp), csv)
    return {paths["md"]: text, paths["csv"]: csv.getvalue(), paths["html"]: page}, paths
