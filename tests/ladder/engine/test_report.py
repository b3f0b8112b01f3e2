"""Tolerance tables, markdown/CSV/HTML, and the error-growth figure, on small synthetic ladders
whose errors are known by construction."""
import base64
import math
import re
import struct
import xml.etree.ElementTree as ET
import zlib

import pandas as pd
import pytest
import torch

from ladder.engine.compare import compare_ladders
from ladder.engine.plot import growth_matrix, growth_plot
from ladder.engine.report import html, markdown
from ladder.engine.rules import Rule, RuleSet
from ladder.engine.table import COLUMNS, frame, summary, to_csv, to_markdown, to_text
from ladder.engine.trace import Ladder, schedule

RS = RuleSet(rules={"port/*": Rule(1e-3)})
POINTS = ("embed", "L00.x", "L01.x", "L02.x", "logits")


def _pair(errors: dict):
    """Reference values 1.0 everywhere (so allowance = rtol); the candidate is off by
    errors[(step, point)] at its first element."""
    steps = schedule([1, 2, 3, 4], 2)
    ref, cand = {}, {}
    for st in steps:
        for p in POINTS:
            b = torch.ones(len(st.tokens), 8, dtype=torch.float64)
            a = b.clone()
            a[0, 0] += errors.get((st.name, p), 0.0)
            ref[f"{st.name}/{p}"], cand[f"{st.name}/{p}"] = b, a
    return compare_ladders(Ladder(steps, cand, "port"), Ladder(steps, ref, "ref"), RS)


def test_frame_has_one_row_per_step_and_point():
    cmp = _pair({("decode00", "L01.x"): 4e-3, ("decode00", "L00.x"): 1e-4})
    df = frame(cmp)
    assert list(df.columns) == COLUMNS and len(df) == 3 * len(POINTS)
    assert df["first_fail"].sum() == 1
    row = df[df["first_fail"]].iloc[0]
    assert (row["step"], row["point"], bool(row["passed"])) == ("decode00", "L01.x", False)
    assert math.isclose(row["error"], 4.0, rel_tol=1e-9)


def test_growth_is_the_ratio_to_the_same_point_one_layer_earlier():
    cmp = _pair({("prefill", "L00.x"): 1e-4, ("prefill", "L01.x"): 4e-4,
                 ("prefill", "L02.x"): 2e-4})
    df = frame(cmp).set_index(["step", "point"])
    assert math.isclose(df.loc[("prefill", "L01.x"), "growth"], 4.0, rel_tol=1e-6)
    assert math.isclose(df.loc[("prefill", "L02.x"), "growth"], 0.5, rel_tol=1e-6)
    assert math.isnan(df.loc[("prefill", "L00.x"), "growth"])       # no earlier layer
    assert math.isnan(df.loc[("decode00", "L01.x"), "growth"])      # earlier one exact


def test_summary_keeps_each_points_worst_step():
    cmp = _pair({("prefill", "L00.x"): 5e-4, ("decode01", "L00.x"): 2e-3,
                 ("decode00", "logits"): 1e-4})
    s = summary(frame(cmp)).set_index("point")
    assert list(s.index) == list(POINTS)
    assert s.loc["L00.x", "worst_step"] == "decode01" and not s.loc["L00.x", "passed"]
    assert s.loc["L00.x", "failing_steps"] == 1
    assert s.loc["logits", "worst_step"] == "decode00" and s.loc["logits", "passed"]


def test_text_markdown_and_csv(tmp_path):
    cmp = _pair({("decode00", "L01.x"): 4e-3})
    df = frame(cmp)
    text = to_text(summary(df))
    assert text.splitlines()[0].split()[:3] == ["point", "worst", "at"]
    assert len(text.splitlines()) == 2 + len(POINTS) and "FAIL" in text
    md = to_markdown(df.assign(note="a|b"), ["point", "note"])
    assert md.splitlines()[1] == "|---|---|" and "a\\|b" in md
    assert len(md.splitlines()) == 2 + len(df)
    to_csv(df, tmp_path / "t.csv")
    back = pd.read_csv(tmp_path / "t.csv")
    assert back["error"].tolist() == df["error"].tolist()            # repr-exact floats
    assert back["first_fail"].tolist() == df["first_fail"].tolist()


def test_growth_matrix_groups_points_by_layer():
    cmp = _pair({("decode00", "L01.x"): 4e-3, ("prefill", "embed"): 2e-4})
    steps, cols, vals, first = growth_matrix(frame(cmp))
    assert steps == ["prefill", "decode00", "decode01"]
    assert cols == ["in", "L00", "L01", "L02", "out"]
    assert math.isclose(vals[1][2], 4.0, rel_tol=1e-9)
    assert math.isclose(vals[0][0], 0.2, rel_tol=1e-6)
    assert first == (1, 2)


def test_svg_figure_is_well_formed():
    cmp = _pair({("decode00", "L01.x"): 4e-3})
    mime, data = growth_plot(frame(cmp), backend="svg")
    svg = ET.fromstring(data)
    ns = "{http://www.w3.org/2000/svg}"
    cells = [r for r in svg.iter(ns + "rect") if r.get("height") == "18"]
    assert mime == "image/svg+xml" and len(cells) == 3 * 5 + 1     # cells + the outline
    assert len(list(svg.iter(ns + "polyline"))) == 3 + 1            # one per step + worst


def test_png_figure_when_matplotlib_is_installed():
    pytest.importorskip("matplotlib")
    mime, data = growth_plot(frame(_pair({})), backend="png")
    assert mime == "image/png" and data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and zlib.crc32(data[12:16 + length]) == \
        struct.unpack(">I", data[16 + length:20 + length])[0]


def test_html_and_markdown_reports_are_self_contained():
    cmp = _pair({("decode00", "L01.x"): 4e-3})
    page = html(cmp, info={"model": "synthetic <&>"}, plot_backend="svg")
    assert page.startswith("<!DOCTYPE html>") and "synthetic &lt;&amp;&gt;" in page
    assert not re.search(r'(src|href)="(https?:|//)', page) and "<script" not in page
    assert page.count('<tr class="first">') == 2 and page.count('<tr class="fail">') == 0
    m = re.search(r'src="data:image/svg\+xml;base64,([^"]+)"', page)
    ET.fromstring(base64.b64decode(m.group(1)))
    md = markdown(cmp)
    assert "**DIVERGENCE**: first at `decode00/L01.x`" in md
    assert "| port/* |" in md


def test_svg_subtitle_clears_the_column_labels():
    mime, data = growth_plot(frame(_pair({})), backend="svg", title="t")
    ns = "{http://www.w3.org/2000/svg}"
    texts = list(ET.fromstring(data).iter(ns + "text"))
    sub = next(t for t in texts if t.text.startswith("worst error / allowance"))
    labels = [t for t in texts if t.text == "L00"]
    top_of_labels = min(float(t.get("y")) for t in labels) - 11       # font-size 11
    assert float(sub.get("y")) + 3 <= top_of_labels                   # descenders clear


@pytest.mark.parametrize("where", ["figure", "csv"])
def test_a_failing_report_leaves_no_file_behind(tmp_path, monkeypatch, where):
    import ladder.engine.plot
    import ladder.engine.report

    def boom(*a, **k):
        raise (ImportError if where == "figure" else OSError)("no")
    if where == "figure":       # --plot png without matplotlib: fails while rendering
        monkeypatch.setattr(ladder.engine.plot, "png_matplotlib", boom)
    else:                       # a write error after the markdown is already on disk
        monkeypatch.setattr(ladder.engine.report, "to_csv", boom)
    with pytest.raises((ImportError, OSError)):
        ladder.engine.report.write_report(_pair({}), tmp_path, plot_backend="png")
    assert list(tmp_path.iterdir()) == []


def test_report_explains_growth_and_wraps_long_pre_lines():
    import re
    from ladder.engine.compare import compare_ladders
    from ladder.engine.report import html, markdown
    from tests.captures import clean_port_ladder, reference_ladder
    cmp = compare_ladders(clean_port_ladder(), reference_ladder())
    page, text = html(cmp, plot_backend="svg"), markdown(cmp)
    legend = "growth: max|a-b| at this point over max|a-b| at the same point one layer earlier"
    assert legend in page and legend in text
    pre = re.search(r"pre\{([^}]*)\}", page).group(1)
    assert "white-space:pre-wrap" in pre and "overflow-wrap:anywhere" in pre
