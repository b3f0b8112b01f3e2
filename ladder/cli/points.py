"""`python -m ladder points`: the registry as a writer in another language needs it.

Every point of one forward in forward order, with the shape of one position's value for the
model's geometry (a trace archive stores `{step}/{point}` as `[positions, *shape]`), the
point's scope (once per forward, per Engram site, per layer) and whether the coarse ladder
(needle-rs's) carries it. Only the config is read: `--preset` builds no weights.
"""
from __future__ import annotations

import json


def registry_rows(cfg) -> list:
    """[{index, name, layer, scope, shape, coarse}] in forward order (ladder/model/points.py)."""
    from ladder.model.names import layer_of
    from ladder.model.points import BY_NAME, COARSE, LAYER, SITE, expected
    rows = []
    for i, (name, shape) in enumerate(expected(cfg)):
        layer = layer_of(name)
        base = name if layer is None else name.split(".", 1)[1]
        p = BY_NAME.get(base) or BY_NAME[base.rstrip("0123456789")]     # engram_k0: site 0
        rows.append({"index": i, "name": name, "layer": layer, "scope": p.scope,
                     "shape": list(shape),
                     "coarse": p.scope not in (LAYER, SITE) or base in COARSE})
    return rows


def _config(args):
    from reference.config import V2Config
    if args.params:
        from reference.params import load_params
        return load_params(args.params, max_memory=args.max_memory)[1]
    if args.cact:
        from reference.cact import read_cact
        return read_cact(args.cact, max_memory=args.max_memory).config
    return V2Config.preset(args.preset)


def cmd_points(args, out=print) -> int:
    cfg = _config(args)
    rows = registry_rows(cfg)
    if args.format == "json":
        out(json.dumps({"geometry": _geometry(cfg), "points": rows}, indent=1))
        return 0
    out(f"# {len(rows)} points per forward, forward order; a value is [positions, *shape]")
    out(f"# geometry: " + ", ".join(f"{k}={v}" for k, v in _geometry(cfg).items()))
    out(f"{'index':>5}  {'name':<16} {'scope':<6} {'shape':<14} coarse")
    for r in rows:
        shape = "[" + ", ".join(map(str, r["shape"])) + "]"
        out(f"{r['index']:>5}  {r['name']:<16} {r['scope']:<6} {shape:<14} "
            f"{'yes' if r['coarse'] else ''}")
    return 0


def _geometry(cfg) -> dict:
    from ladder.model.geometry import geometry_of
    return geometry_of(cfg)


def add_parser(sub) -> None:
    p = sub.add_parser("points", help="print the registry: every point's name, shape and "
                                      "scope in forward order, for the model's geometry")
    p.add_argument("--preset", default="tiny", choices=["tiny", "shipped"],
                   help="the built-in model's geometry when neither --params nor --cact is given")
    p.add_argument("--params", help="safetensors parameter file (its config is used)")
    p.add_argument("--cact", help=".cact file (its config is used)")
    p.add_argument("--format", default="text", choices=["text", "json"],
                   help="a table, or JSON with index, name, layer, scope, shape, coarse")
    p.add_argument("--max-memory", type=int, default=None, help="bytes a file may declare (default: 2 GiB)")
