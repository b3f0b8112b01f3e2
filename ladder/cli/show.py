"""The tolerance table printed: what `run` and `compare` show of a comparison."""
from __future__ import annotations

def print_table(cmp, args, out):
    """The tolerance table as `run` prints it: the coarse ladder (plus any failing point), or
    --fine / --per-step."""
    from ladder.engine.table import summary, to_text
    df = cmp.to_frame()
    # The coarse view never hides a failure: a failing point is shown wherever it lies.
    failing = set(df.loc[~df["passed"], "point"])
    if args.per_step:
        shown = df if args.fine else df[df["coarse"] | ~df["passed"]]
    else:
        shown = summary(df if args.fine else df[df["coarse"] | df["point"].isin(failing)])
    out("")
    out(to_text(shown))
    if not args.fine:
        extra = len(failing - set(df.loc[df["coarse"], "point"]))
        unit, left = (("rows", len(df) - len(shown)) if args.per_step else
                      ("points", df["point"].nunique() - shown["point"].nunique()))
        total = len(df) if args.per_step else df["point"].nunique()
        off = f", with {extra} failing point{'s' * (extra != 1)} off it" if extra else ""
        if not left:
            out(f"(coarse ladder{off}: all {total} {unit} shown)")
            return
        rest = "the other one passes" if left == 1 else f"the other {left} pass"
        more = "--fine shows every point" + ("" if args.per_step else ", --per-step every step")
        out(f"(coarse ladder{off}: {total - left} of {total} {unit} shown; {rest}; {more})")
