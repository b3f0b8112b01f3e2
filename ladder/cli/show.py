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
        out(f"(coarse ladder" + (f" + {extra} failing point{'s' * (extra != 1)} off it"
                                 if extra else "") +
            f"; {left} of {len(df) if args.per_step else df['point'].nunique()} {unit} not "
            f"shown, all passing: --fine shows them, --per-step every step)")
