"""The pytest plugin's end-of-session lines, from each check's JSON-able summary (Verdict.summary
plus kind, name and test), so that checks run in other processes (pytest-xdist workers) count."""
from __future__ import annotations


def _frac(x) -> float:
    return float("inf") if x == "unbounded" else float(x)


def summary_lines(checks: list) -> list:
    n, failing = len(checks), [c for c in checks if not c["passed"]]
    tests = len({c["test"] for c in checks})
    points = sum(int(c["points"]) for c in checks)
    out = [f"{n} ladder case{'s' * (n != 1)} in {tests} test{'s' * (tests != 1)}: "
           f"{points:,} points compared, {len(failing)} case{'s' * (len(failing) != 1)} "
           f"failing"]
    # a comparison against a golden file this session rewrote judged the old file: not counted
    judged = [c for c in checks if c["worst_point"] is not None and not c.get("regenerated")]
    if judged:
        w = max(judged, key=lambda c: _frac(c["worst_fraction"]))
        frac = w["worst_fraction"]
        text = frac if isinstance(frac, str) else f"{frac:.3g}"
        out.append(f"worst fraction of allowance: {text} at {w['worst_point']} ({w['test']}"
                   + (f", fixture {w['name']}" if w["name"] else "") + ")")
    low = [c for c in judged if c.get("precision") and c.get("worst_noise_ratio") is not None]
    if low:                # checks judged against a noise floor (docs/precision.md)
        w = max(low, key=lambda c: c["worst_noise_ratio"])
        out.append(f"{len(low)} case{'s' * (len(low) != 1)} judged at a precision against a "
                   f"noise floor: worst {w['worst_noise_ratio']:.3g}x floor at "
                   f"{w['worst_point']} ({w['precision']}; {w['test']})")
    tested = sum(int(c.get("systematic_tested") or 0) for c in judged)
    if tested:             # systematic statistics (docs/precision.md, "Systematic errors")
        found = [(c, s) for c in judged for s in c.get("systematic") or []]
        fails = sum(s["status"] == "FAIL" for _, s in found)
        out.append(f"systematic: {tested:,} points tested for a scale, a bias, a rounding "
                   f"direction or an iteration count; {fails} failing, {len(found) - fails} "
                   f"finding{'s' * (len(found) - fails != 1)} below the margin")
        for c, s in [f for f in found if f[1]["status"] == "finding"][:5]:
            sc = s["scale"]
            out.append(f"  finding: {s['kind']} at {s['point']} ({c['test']}): scale "
                       f"1{sc['value']:+.3g} +- {sc['se']:.2g}, margin {sc['margin']:.2g}"
                       if sc["value"] is not None and sc["se"] is not None else
                       f"  finding: {s['kind']} at {s['point']} ({c['test']})")
    for c in failing:
        what = f"fixture {c['name']}" if c["kind"] == "fixture" else c["label"]
        verdict = " (own error, or inherited from an unrecorded input)" \
            if c["verdict"] == "undecided" else f" ({c['verdict']} error)" if c["verdict"] else ""
        if c["first_divergence"] is not None:
            out.append(f"FAILED {c['test']} [{what}]: first divergence "
                       f"{c['first_divergence']}{verdict}")
        else:
            out.append(f"FAILED {c['test']} [{what}]: {c.get('why') or 'no divergence'}")
    return out


def golden_lines(written: list) -> list:
    """One line per golden fixture the session wrote (created or regenerated)."""
    return [f"golden fixture {w['action']}: {w['path']} ({w['test']})" for w in written]
