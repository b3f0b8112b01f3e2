"""A sweep's report, and `sweep --merge DIR...` joining the directories of its shards.

    report.json   every row (by case index), the counts and what is missing: the data
    report.csv    one line per case: its settings, status, worst point, first divergence,
                  and one column per layer (its worst fraction of allowance)
    report.md     pass/fail per case, the worst points across the grid, the first
                  divergences by point
    report.html   the same, self-contained, with a heat map: one row per case, one column
                  per layer (and embed/final), each cell coloured by its worst fraction of
                  allowance (green within half the allowance, yellow near it, red past it)

Merging refuses directories of different grids (grid_sha256, naming both) and two
directories whose rows for one case disagree (in anything but what the run environment sets:
sweep_row.RUN_ENV, and the thread count in `port`); missing cases are an error
unless --allow-partial, and are listed in the report either way.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import time
from html import escape

from ladder.sweep import pooled
from ladder.sweep.grid import MAX_CASES, SweepError
from ladder.sweep.row import WHOLE, frac_key, run_env_free

MAX_MANIFEST = 64 << 20          # sweep.json holds every case id: ~20 bytes a case
_CASE_ID = re.compile(r"c\d{4,}-[0-9a-f]{8}")       # sweep_grid.case_id; also a directory name


def _manifest_field(p: str, m: dict, field: str, ok, what: str):
    if field not in m:
        raise SweepError(f"{p}: sweep manifest field {field!r} is missing")
    if not ok(m[field]):
        raise SweepError(f"{p}: sweep manifest field {field!r} = "
                         f"{json.dumps(m[field], default=str)[:60]}: must be {what}")


def read_manifest(d: str) -> dict:
    """DIR/sweep.json, every field the sweep and the merge read checked (SweepError naming
    the file and the field): it may come from another machine, or have been edited."""
    from bounded.io import load_json
    from ladder.sweep.grid import FORMAT, SCHEMA, parse_shard
    p = os.path.join(d, "sweep.json")
    if os.path.islink(p) or not os.path.isfile(p):
        raise SweepError(f"{d}: no sweep.json (a regular file), so not a sweep directory "
                         f"(sweep GRID.toml --out {d} makes one)")
    m = load_json(p, MAX_MANIFEST, SweepError, "sweep manifest")
    if not isinstance(m, dict):
        raise SweepError(f"{p}: not a needle-parity sweep manifest (a JSON object)")

    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    def is_shard(v):
        try:
            return isinstance(v, str) and bool(parse_shard(v))
        except SweepError:
            return False
    for field, ok, what in (
            ("format", lambda v: v == FORMAT, json.dumps(FORMAT)),
            ("schema_version", lambda v: is_int(v) and v == SCHEMA, f"{SCHEMA}"),
            ("name", lambda v: isinstance(v, str), "a string"),
            ("grid_file", lambda v: isinstance(v, str), "a string"),
            ("grid", lambda v: isinstance(v, dict), "an object (the grid's tables)"),
            ("files", lambda v: isinstance(v, dict) and
             all(isinstance(x, str) for x in (*v, *v.values())), "an object of strings"),
            ("grid_sha256", lambda v: isinstance(v, str) and
             re.fullmatch(r"[0-9a-f]{64}", v) is not None, "64 hex digits"),
            ("shard", is_shard, "K/N with 1 <= K <= N"),
            ("cases", lambda v: is_int(v) and 1 <= v <= MAX_CASES,
             f"an integer from 1 to {MAX_CASES}"),
            ("case_ids", lambda v: isinstance(v, list) and len(v) == m["cases"] and
             all(isinstance(c, str) and _CASE_ID.fullmatch(c) for c in v) and
             len(set(v)) == len(v),
             f"a list of {m.get('cases')} distinct case ids (c0007-1a2b3c4d)")):
        _manifest_field(p, m, field, ok, what)
    return m


def read_rows(d: str, manifest: dict) -> list:
    """The finished rows of a sweep directory (a case dir without result.json: not done),
    each checked (sweep_row.check_row); anything else under cases/ is refused."""
    from ladder.sweep.row import check_row, read_result
    root, rows = os.path.join(d, "cases"), []
    index = {c: i for i, c in enumerate(manifest["case_ids"])}
    if os.path.islink(root):
        raise SweepError(f"{root}: a symbolic link; a sweep's cases/ is its own directory")
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        p = os.path.join(root, name, "result.json")
        if not os.path.lexists(p) and not os.path.islink(os.path.dirname(p)):
            continue
        if name not in index:
            raise SweepError(f"{p}: case {name} is not a case of this grid "
                             f"({manifest['grid_file']})")
        row = check_row(read_result(p), p)
        if row["id"] != name or row["index"] != index[name]:
            raise SweepError(f"{p}: field 'id'/'index' = {row['id']}/{row['index']}: not the "
                             f"row of case {name} (index {index[name]})")
        rows.append(row)
    return rows


def cmd_merge(args, out) -> int:
    dirs = args.merge
    first = read_manifest(dirs[0])
    rows, source = {}, {}
    for d in dirs:
        m = read_manifest(d) if d != dirs[0] else first
        if m["grid_sha256"] != first["grid_sha256"]:
            raise SweepError(f"sweep --merge: {d} holds grid {m['grid_sha256'][:16]} "
                             f"({m.get('grid_file')}), {dirs[0]} holds "
                             f"{first['grid_sha256'][:16]} ({first.get('grid_file')}): not "
                             f"shards of one grid")
        for row in read_rows(d, m):
            prev = rows.get(row["id"])
            a, b = (run_env_free(r) for r in (prev, row)) if prev else (None, None)
            if prev is not None and a != b:
                field = next(k for k in row if a.get(k) != b.get(k))
                raise SweepError(f"sweep --merge: case {row['id']} differs between "
                                 f"{source[row['id']]} and {d} (field {field!r}: "
                                 f"{json.dumps(prev.get(field))[:80]} vs "
                                 f"{json.dumps(row.get(field))[:80]})")
            rows.setdefault(row["id"], row)         # the first directory's, as `source`
            source.setdefault(row["id"], d)
    ids = first["case_ids"]
    missing = [i for i in ids if i not in rows]
    if missing and not args.allow_partial:
        raise SweepError(f"sweep --merge: {len(missing)} of {len(ids)} cases have no result "
                         f"in {', '.join(dirs)} (first: {', '.join(missing[:5])}); run or "
                         f"resume their shards, or give --allow-partial")
    manifest = dict(first, shard="merged", merged_from=list(dirs))
    paths = write_report(args.out, manifest, list(rows.values()), ids)
    return summarize(manifest, list(rows.values()), ids, paths, out)


def _text(v) -> str:
    if v is None:
        return ""
    if v == "unbounded" or isinstance(v, str):
        return v
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _columns(rows: list) -> tuple:
    keys, layers = [], []
    for r in rows:
        keys += [k for k in r["settings"] if k not in keys]
        layers += [k for k in r.get("layers") or {} if k not in layers]
    layers = sorted(k for k in layers if k != WHOLE) + ([WHOLE] if WHOLE in layers else [])
    varying = [k for k in keys if len({json.dumps(r["settings"].get(k)) for r in rows}) > 1]
    return keys, varying or keys, layers


def _flat(row: dict, keys: list, layers: list) -> dict:
    w, f, lg = row.get("worst") or {}, row.get("first_divergence") or {}, row.get("logits") or {}
    d = {"id": row["id"], "index": row["index"]}
    d.update({k: _text(row["settings"].get(k)) for k in keys})
    d.update(status=row["status"], points=row.get("points"), failing=row.get("failing"),
             worst_step=w.get("step"), worst_point=w.get("point"),
             worst_error=w.get("error"), first_step=f.get("step"), first_point=f.get("point"),
             first_position=f.get("position"), first_kind=f.get("kind"),
             argmax_agree=lg.get("argmax_agree"), logits_positions=lg.get("positions"))
    d.update({layer: (row.get("layers") or {}).get(layer) for layer in layers})
    d.update(archive=(row.get("archive") or {}).get("path"),
             seconds=(row.get("timing") or {}).get("seconds"), message=row.get("message"))
    return d


class Progress:
    """One stderr line per finished case: done/total, the case, rate and ETA (this run's
    cases only; those done earlier are counted as done, not timed)."""

    def __init__(self, total: int, done: int, stream):
        self.total, self.done, self.ran, self.stream = total, done, 0, stream
        self.t0 = time.perf_counter()

    def __call__(self, row: dict) -> None:
        self.done += 1
        self.ran += 1
        dt = time.perf_counter() - self.t0
        rate = self.ran / dt if dt > 0 else 0.0
        eta = (self.total - self.done) / rate if rate else 0.0
        w = row.get("worst") or {}
        err = w.get("error")
        what = (f"worst {err:.3g}" if isinstance(err, float) else f"worst {err}") + \
            f" at {w['step']}/{w['point']}" if w else row.get("message")
        self.stream.write(f"sweep [{self.done:{len(str(self.total))}d}/{self.total}] "
                          f"{row['id']} {row['status']:5s} {row['timing']['seconds']:.2f} s "
                          f"({str(what)[:80]}) | {rate * 60:.1f} cases/min, ETA {eta:.0f} s\n")
        self.stream.flush()


def counts(rows: list) -> dict:
    c = {"pass": 0, "fail": 0, "error": 0}
    for r in rows:
        c[r["status"]] = c.get(r["status"], 0) + 1
    return c


def _worst_points(rows: list, n: int = 10) -> list:
    have = [r for r in rows if r.get("worst")]
    return sorted(have, key=lambda r: (-frac_key(r["worst"]["error"]), r["index"]))[:n]


def _first_by_point(rows: list) -> list:
    by = {}
    for r in rows:
        f = r.get("first_divergence")
        if f:
            key = f"{f.get('step')}/{f.get('point')}" if f.get("point") else f["kind"]
            by.setdefault(key, []).append(r["id"])
    return sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def _title(manifest: dict, rows: list, expected: list) -> list:
    c = counts(rows)
    shard = manifest.get("shard")
    return [f"sweep {manifest['name']} ({manifest.get('grid_file')}, grid sha256 "
            f"{manifest['grid_sha256'][:16]}): {manifest['cases']} cases"
            + ("" if shard in ("1/1", None) else f"; this report: {shard} "
               f"({len(expected)} cases)"),
            f"{c['pass']} pass, {c['fail']} fail, {c['error']} error, "
            f"{len(expected) - len(rows)} missing"]


def markdown(manifest: dict, rows: list, expected: list) -> str:
    keys, varying, layers = _columns(rows)
    t = _title(manifest, rows, expected)
    out = [f"# {t[0]}", "", t[1], ""]
    if manifest.get("merged_from"):
        out += ["Merged from: " + ", ".join(f"`{d}`" for d in manifest["merged_from"]), ""]
    fixed = {k: rows[0]["settings"].get(k) for k in keys if k not in varying} if rows else {}
    if fixed:
        out += ["Every case: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in fixed.items()),
                ""]
    cols = ["id", *varying, "status", "worst", "first divergence", "verdict"]
    out += ["## Cases", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        w, f = r.get("worst") or {}, r.get("first_divergence") or {}
        cells = [r["id"], *(_text(r["settings"].get(k)) for k in varying), r["status"],
                 f"{_text(w.get('error'))} at {w.get('step')}/{w.get('point')}" if w else "",
                 f"{f.get('step')}/{f.get('point')} pos {f.get('position')} ({f.get('kind')})"
                 if f.get("point") else f.get("kind", "") or (r.get("message") or ""),
                 (f.get("verdict") or "")[:160]]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in map(str, cells)) + " |")
    out += ["", "## Worst points across the grid", "",
            "| case | status | step/point | layer | position | error of allowance | x floor |",
            "|---|---|---|---|---|---|---|"]
    for r in _worst_points(rows):
        w = r["worst"]
        out.append(f"| {r['id']} | {r['status']} | {w['step']}/{w['point']} | "
                   f"{_text(w.get('layer'))} | {w.get('position')} | {_text(w['error'])} | "
                   f"{_text(w.get('noise_ratio'))} |")
    firsts = _first_by_point(rows)
    if firsts:
        out += ["", "## First divergences by point", "", "| first divergence | cases |",
                "|---|---|"]
        out += [f"| {k} | {len(v)}: {', '.join(v[:8])}{' ...' * (len(v) > 8)} |"
                for k, v in firsts]
    errors = [r for r in rows if r["status"] == "error"]
    if errors:
        out += ["", "## Errors", ""] + [f"- {r['id']}: {r.get('message')}" for r in errors]
    out += pooled.markdown(pooled.pool(rows))
    missing = [i for i in expected if i not in {r["id"] for r in rows}]
    if missing:
        out += ["", f"## Missing ({len(missing)})", "", ", ".join(missing)]
    return "\n".join(out) + "\n"


def to_csv(rows: list) -> str:
    keys, _, layers = _columns(rows)
    flat = [_flat(r, keys, layers) for r in rows]
    buf = io.StringIO()
    fields = list(flat[0]) if flat else ["id"]
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for d in flat:
        w.writerow({k: "" if v is None else v for k, v in d.items()})
    return buf.getvalue()


def colour(v) -> tuple:
    """(background, text colour) for a worst fraction of allowance: green (0) to yellow (1)
    inside the allowance, orange to red over three decades past it, dark red unbounded."""
    if v is None:
        return "#e0e0e0", "#555"
    f = frac_key(v)
    if math.isinf(f):
        return "#6b0000", "#fff"
    if f <= 1:
        return f"hsl({120 - 60 * max(f, 0.0):.0f}, 65%, 72%)", "#000"
    t = min(1.0, math.log10(f) / 3)
    return f"hsl({30 - 30 * t:.0f}, 85%, {62 - 22 * t:.0f}%)", "#000" if t < 0.5 else "#fff"


CSS = ("body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin:.5em 0}"
       "td,th{border:1px solid #bbb;padding:2px 6px;font-size:12px;text-align:left}"
       "td.h{text-align:right;font-family:monospace}th.v{writing-mode:vertical-rl}"
       ".pass{color:#070}.fail{color:#b00;font-weight:bold}.error{color:#850}")


def _cells(line: str) -> list:
    """The cells of a markdown table row, '\\|' read back as '|'."""
    body = line.strip()[1:-1].replace("\\|", "\x00")
    return [c.strip().replace("\x00", "|") for c in body.split("|")]


def markdown_html(md: str) -> str:
    """The report's markdown sections as HTML: headings, tables, lists and paragraphs (the
    subset markdown() writes), every text escaped."""
    out, lines, i = [], md.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            out.append(f"<h3>{escape(line[3:])}</h3>")
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(lines[i])
                i += 1
            head, body = _cells(rows[0]), [_cells(r) for r in rows[2:]]
            out.append("<table><tr>" + "".join(f"<th>{escape(c)}</th>" for c in head)
                       + "</tr>" + "".join("<tr>" + "".join(f"<td>{escape(c)}</td>"
                                                              for c in r) + "</tr>"
                                           for r in body) + "</table>")
            continue
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{escape(lines[i][2:])}</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
            continue
        elif line.strip():
            out.append(f"<p>{escape(line)}</p>")
        i += 1
    return "\n".join(out)


def html(manifest: dict, rows: list, expected: list) -> str:
    keys, varying, layers = _columns(rows)
    t = _title(manifest, rows, expected)
    out = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
           f"<title>{escape(t[0])}</title><style>{CSS}</style></head><body>",
           f"<h1>{escape(t[0])}</h1><p>{escape(t[1])}</p>",
           "<h2>Worst fraction of allowance per case and layer</h2>",
           "<p>Each cell: the largest rule error in that layer over every step, as a fraction "
           "of its allowance (a point passes at &le; 1). Legend: "
           + " ".join(f"<span style='background:{colour(v)[0]};color:{colour(v)[1]};padding:"
                      f"0 4px'>{escape(_text(v))}</span>"
                      for v in (0.0, 0.5, 1.0, 10.0, 1000.0, "unbounded"))
           + " <span style='background:#e0e0e0;padding:0 4px'>no value</span></p>",
           "<table><tr><th>case</th>" + "".join(f"<th>{escape(k)}</th>" for k in varying)
           + "<th>status</th>" + "".join(f"<th class='v'>{escape(x)}</th>" for x in layers)
           + "<th>first divergence</th></tr>"]
    for r in rows:
        f = r.get("first_divergence") or {}
        first = (f"{f.get('step')}/{f.get('point')} pos {f.get('position')} ({f.get('kind')})"
                 if f.get("point") else f.get("kind") or r.get("message") or "")
        cells = []
        for x in layers:
            v = (r.get("layers") or {}).get(x)
            bg, fg = colour(v)
            cells.append(f"<td class='h' style='background:{bg};color:{fg}'>"
                         f"{escape(_text(v))}</td>")
        out.append(f"<tr><td>{escape(r['id'])}</td>"
                   + "".join(f"<td>{escape(_text(r['settings'].get(k)))}</td>" for k in varying)
                   + f"<td class='{escape(r['status'])}'>{escape(r['status'])}</td>"
                   + "".join(cells) + f"<td title='{escape(f.get('verdict') or '')}'>"
                   f"{escape(first[:120])}</td></tr>")
    out.append("</table>")
    md = markdown(manifest, rows, expected)
    out.append("<h2>Details</h2>" + markdown_html(md[md.index("## Worst points"):]))
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write_report(d: str, manifest: dict, rows: list, expected: list) -> dict:
    """report.json, .csv, .md and .html in directory `d`, all or none (ladder/engine/atomic.py)."""
    from ladder.engine.atomic import write_all
    order = {i: n for n, i in enumerate(expected)}
    rows = sorted(rows, key=lambda r: order.get(r["id"], len(order)))
    have = {r["id"] for r in rows}
    data = {"format": "needle-parity-sweep-report", "name": manifest["name"],
            "grid_sha256": manifest["grid_sha256"], "shard": manifest.get("shard"),
            "cases": manifest["cases"], "expected": len(expected), "counts": counts(rows),
            "missing": [i for i in expected if i not in have],
            # the per-position sums stay in each case's result.json; the report holds the pools
            "systematic_pooled": pooled.to_json(pooled.pool(rows)),
            "rows": [{k: v for k, v in r.items() if k != "systematic"} for r in rows]}
    os.makedirs(d, exist_ok=True)
    paths = {ext: os.path.join(d, f"report.{ext}") for ext in ("json", "csv", "md", "html")}
    write_all({paths["json"]: json.dumps(data, indent=1) + "\n", paths["csv"]: to_csv(rows),
               paths["md"]: markdown(manifest, rows, expected),
               paths["html"]: html(manifest, rows, expected)})
    return paths


def summarize(manifest: dict, rows: list, expected: list, paths: dict, out,
              ran_now=None) -> int:
    """The closing lines; the exit status: 2 if a case errored, 1 if one failed or a pool of
    cases fails by its systematic statistics (pooled.py), else 0."""
    for line in _title(manifest, rows, expected):
        out(line)
    if ran_now is not None:
        out(f"ran {len(ran_now)} case{'s' * (len(ran_now) != 1)} now, "
            f"{len(rows) - len(ran_now)} had results already")
    bad = [r for r in sorted(rows, key=lambda r: r["index"]) if r["status"] != "pass"]
    for r in bad[:20]:
        if True:
            f = r.get("first_divergence") or {}
            where = f"{f.get('step')}/{f.get('point')} ({f.get('kind')})" if f.get("point") \
                else (r.get("message") or "")[:160]
            out(f"  {r['status']}: {r['id']} {where}")
    if len(bad) > 20:
        out(f"  ... and {len(bad) - 20} more (report.md lists every case)")
    pools = pooled.pool(rows)
    for line in pooled.summary_lines(pools):
        out(line)
    out("report: " + ", ".join(paths[e] for e in ("md", "csv", "html", "json")))
    c = counts(rows)
    # a pool's material systematic error fails the sweep: every case may pass on its own
    return 2 if c["error"] else 1 if c["fail"] or any(g["failing"] for g in pools) else 0
