"""`dump` and `compare` with `--model attn_v41`: the DeepSeek-V4.1 attention through the same
trace archives and the same comparison as needle v2.

A V4.1 ladder is one step per call of the fixture (`{call}/L{layer:02d}.{point}`, ladder/v41/sides.py
`to_ladder`), so an archive of it is an archive like any other: the calls as steps (each at its
own start position), float points as float32, index points as int64. A side is an archive,
`official` (DeepSeek's own recordings in the fixture), `reference` (reference/v41), or the port
(`torch`, `triton`), the last three run live over the fixture's calls from its recorded inputs.
"""
from __future__ import annotations

import hashlib
import json
import os

LIVE = ("official", "reference", "torch", "triton")


def _side(spec, args, man, rec, w):
    from ladder.v41.sides import run_side, to_ladder
    calls = man["calls"]
    if spec == "official":
        return to_ladder(rec, calls, "official")
    if spec == "reference":
        from reference.v41.attn import AttnV41
        return to_ladder(run_side(AttnV41(man["model_args"], w), man, rec), calls, "reference")
    if spec in ("torch", "triton"):
        from port.v41.attn import AttnV41
        port = AttnV41(man["model_args"], w, backend=spec, device=args.device)
        return to_ladder(run_side(port, man, rec), calls, f"port ({spec}, eager, {args.device})")
    from ladder.engine.trace import Ladder
    return Ladder.load(spec, args.max_memory, lazy=True)


def _geometry(man) -> dict:
    digest = hashlib.sha256(json.dumps(man["model_args"], sort_keys=True).encode()).hexdigest()
    return {"model": "attn_v41", "model_args_sha256": digest}


def _fixture(args):
    from ladder.v41.sides import DEFAULT_STEM, load_fixture
    stem = args.fixture or DEFAULT_STEM
    return (stem, *load_fixture(stem, args.max_memory))


def cmd_dump(args, out=print) -> int:
    from ladder.sides.model_input import LadderInputError
    if args.side not in LIVE:
        raise LadderInputError(f"dump {args.side} --model attn_v41: one of {', '.join(LIVE)}")
    stem, man, rec, w = _fixture(args)
    lad = _side(args.side, args, man, rec, w)
    path = lad.save(args.out, producer={"name": "needle-parity attn_v41", "version": "",
                                        "backend": args.side, "device": args.device,
                                        "dtype": "float32"},
                    geometry=_geometry(man), kv_window=0,
                    weights={"source": "attn_v41 fixture", "file": os.path.basename(stem)},
                    prompt_len=0, leading_axis="free")
    out(f"dump attn_v41 {args.side}: {len(lad.steps)} calls, {len(lad)} values")
    out(f"wrote {path} ({os.path.getsize(path)} bytes)")
    return 0


def cmd_compare(args, out=print) -> int:
    from ladder.sides.model_input import LadderInputError
    from ladder.engine.compare import compare_ladders
    from ladder.engine.rules import V41_RULESET, V41_SIDES, load_rules
    from ladder.engine.table import summary, to_text
    stem, man, rec, w = _fixture(args)
    specs = [args.a, args.b or "reference"]
    a, b = (_side(s, args, man, rec, w) for s in specs)
    for spec, lad in zip(specs, (a, b)):
        geo = (lad.meta or {}).get("geometry")
        if geo and geo != _geometry(man):
            raise LadderInputError(f"compare: {spec} was recorded on other model_args "
                                   f"(geometry {geo}) than the fixture {stem}")
    rules = load_rules(args.rules, V41_SIDES) if args.rules else V41_RULESET
    side = "v41_official" if specs[1] == "official" else "v41_port"
    cmp = compare_ladders(a, b, rules, prefix=side, a_label=f"{specs[0]} ({a.label})",
                          b_label=f"{specs[1]} ({b.label})")
    out(f"needle-parity compare, model attn_v41 (fixture {os.path.basename(stem)}): "
        f"{cmp.a_label} vs {cmp.b_label}, rules {side}/*")
    df = cmp.to_frame()
    out("")
    out(to_text(df if args.per_step else summary(df)))
    out("")
    out(str(cmp))
    return 0 if cmp.passed else 1
