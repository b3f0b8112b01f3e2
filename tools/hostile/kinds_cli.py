"""The shrink and precision kinds of tools/hostile/hostile_kinds.py: argv for
`ladder.cli.main.main`, each from one seeded rng, with the files it names written under the
case's own directory. `hostile` marks an input that is certainly invalid (it must be refused
with exit 2); an input left unmarked may go either way but must not escape or hang.
"""
from __future__ import annotations

import json
import os

from hostile_kinds import Case

FAST = ["--steps", "1", "--prompt-len", "1", "--no-check-plain"]
FAULT = "rope_pos_plus_1"                     # first touches L03.q at position 0 (tiny)
PLANT = ["--plant", FAULT]
QUICK = ["--max-time", "0.5"]                 # an accepted search stops soon
TOY = "tests.ports.toy_port"


def make_bases(d: str) -> dict:
    """A float32 trace archive and a needle-rs fixture of the tiny model (a second or two)."""
    from ladder.cli.main import main
    os.makedirs(d, exist_ok=True)
    small = ["--prompt-len", "2", "--steps", "1"]
    assert main(["dump", "torch", "--out", f"{d}/torch.safetensors", *small],
                out=lambda *a: None) == 0
    assert main(["regen", "--format", "needle-rs", "--out", f"{d}/nrs", *small],
                out=lambda *a: None) == 0
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return {"dir": d, "archive": f"{d}/torch.safetensors", "needle_rs": f"{d}/nrs",
            "map": os.path.join(root, "ladder", "formats", "maps", "needle-rs.toml"),
            "fixture": os.path.join(root, "tests", "fixtures", "v2_forward_vectors")}


def snapshot(d: str) -> list:
    """What is under `d`: names, kinds, sizes and link targets (what a refusal must keep)."""
    seen = []
    for top, dirs, files in os.walk(d):
        for name in sorted(dirs + files):
            p = os.path.join(top, name)
            kind = "link:" + os.readlink(p) if os.path.islink(p) else \
                "dir" if os.path.isdir(p) else f"file:{os.path.getsize(p)}"
            seen.append((os.path.relpath(p, d), kind))
    return sorted(seen)


def unchanged(d: str):
    before = snapshot(d)

    def check() -> str:
        after = snapshot(d)
        return "" if after == before else \
            f"refused but changed {sorted(set(after) ^ set(before))[:3]}"
    return check


# ---------------------------------------------------------------- shrink
BAD_TIMES = ["-1", "0", "nan", "inf", "-inf", "1e308", "1_0", "\u0661\u0660", "", " 5", "5s",
             "1" * 40, "1e-400", "0x10", "1e6000", "NaN", "\uff11", "1.5.2", "-0"]
OK_TIMES = ["0.5", "1", "2.5e-1", "0.3", "1."]
BAD_POINTS = ["", "L99.q", "x" * 300, "\uff2c03.q", "L03.q\n", "prefill/L03.q", " ", "L03"]
SWEEP_RUN = "python -m ladder run --steps 1 --prompt-len 1 --plant rope_pos_plus_1 " \
            "--no-check-plain"


def _shrink_out(rng, d) -> tuple:
    """(path, hostile, extra argv) for --out."""
    f = os.path.join(d, "f")
    with open(f, "w") as fh:
        fh.write("x")
    rep = os.path.join(d, "repro")
    os.makedirs(rep)
    r = rng.randrange(13)
    if r == 0:
        return "", True, []
    if r == 1:
        return f, True, []
    if r == 2:
        os.symlink(os.path.join(d, "nowhere"), os.path.join(d, "dangling"))
        return os.path.join(d, "dangling"), True, []
    if r == 3:
        return os.path.join(f, "sub"), True, []
    if r == 4:
        return os.path.join(d, "d" * rng.choice([256, 300, 4000])), True, []
    if r == 5:
        return rng.choice(["/dev/null", "/proc/version", "/dev/zero"]), True, []
    if r == 6:
        os.symlink(rep, os.path.join(d, "dirlink"))
        return os.path.join(d, "dirlink"), True, []
    name = rng.choice(["test_shrunk_divergence.py", "README.md", "pytest.ini",
                       "model.safetensors"])
    if r == 7:                                   # a reproducer there: kept unless --force
        with open(os.path.join(rep, name), "w") as fh:
            fh.write("mine")
        return rep, True, []
    if r == 8:                                   # a link there: never replaced, even forced
        os.symlink(f, os.path.join(rep, name))
        return rep, True, rng.choice([[], ["--force"]])
    if r == 9:
        with open(os.path.join(rep, name), "w") as fh:
            fh.write("mine")
        return rep, False, ["--force"]
    if r == 10:
        os.makedirs(os.path.join(rep, name))     # a directory where a file goes
        return rep, True, rng.choice([[], ["--force"]])
    return os.path.join(d, rng.choice(["new", "a/b/c", "repro"])), False, []


def _sweep_dir(rng, d, run, raw=None) -> tuple:
    """DIR and CASE of a sweep holding one row whose result.json's `run` is `run`."""
    sw = os.path.join(d, "sw")
    case = os.path.join(sw, "cases", "c0000-tiny")
    os.makedirs(case)
    text = raw if raw is not None else json.dumps({"run": run, "passed": False})
    with open(os.path.join(case, "result.json"), "w", encoding="utf-8") as f:
        f.write(text)
    return sw, rng.choice(["c0000", "c0000-tiny"])


def _hostile_run(rng) -> tuple:
    """(run string, what, hostile) for a sweep row."""
    head = "python -m ladder run"
    r = rng.randrange(16)
    if r == 0:
        q = rng.choice(["'", '"'])
        cut = rng.randrange(len(SWEEP_RUN) + 1)
        return SWEEP_RUN[:cut] + q + SWEEP_RUN[cut:], "unbalanced quote", True
    if r == 1:
        return SWEEP_RUN + rng.choice([" \\", "\\"]), "trailing backslash", True
    if r == 2:
        n = rng.choice([33, 65, 500, 10_000, 100_000])
        flag = rng.choice(["--no-check-plain", "--steps 1", "--fine", "-x"])
        words = n * len(flag.split())              # a row holds at most 64 (shrink.py)
        return f"{head} " + " ".join([flag] * n), f"{n} x {flag}", words > 64 or flag == "-x"
    if r == 3:
        return rng.choice([f"{head} --help", f"{head} -h", f"{head} --steps 1 --he",
                           f"{head} --h"]), "help inside", True
    if r == 4:
        return rng.choice(["python -m ladder runx --steps 1", "python -m ladder locate",
                           "python -m ladder", "", "python -m ladder shrink --steps 1",
                           "python -m ladder run\u00a0--steps 1", "python3 -m ladder run",
                           "python -m  ladder   run --steps 1 --plant x;rm -rf /"]), \
            "not `run`", True
    if r == 5:
        own = rng.choice(["--point L03.q", "--poi L03.q", "--verdict own", "--verd own",
                          "--out=o", "--ou o", "--from-sweep a b", "--from a b",
                          "--max-time 5", "--max 5", "--force", "--for", "--point=",
                          "--out ''"])
        return f"{SWEEP_RUN} {own}", f"shrink's own flag {own}", True
    if r == 6:
        return f"{SWEEP_RUN} --port {TOY}:build", "--port beside --plant", True
    if r == 7:
        bad = rng.choice(["--bogus", "--steps x", "--window -1", f"--seed {2 ** 64}",
                          "--prompt-len 0", "--dump /dev/zero", "--fixture x",
                          "--model attn_v41"])
        return f"{SWEEP_RUN} {bad}", "bad run flag", True
    if r == 8:
        return SWEEP_RUN + " --steps " + rng.choice(["1000000", "100000", "0"]), \
            "many steps", False
    if r == 9:
        return SWEEP_RUN.replace(FAULT, rng.choice(["ro\x00pe", "", "\uff52ope",
                                                    "x" * 300])), "odd fault", True
    if r == 10:
        return "x" * rng.choice([4097, 100_000]), "long", True
    legit = rng.choice([SWEEP_RUN, SWEEP_RUN.replace(" ", "  "), SWEEP_RUN + " --seed 3",
                        f"'python' -m ladder run --steps 1 --prompt-len 1 --plant '{FAULT}' "
                        f"--no-check-plain"])
    return legit, "legit row", False


def _from_sweep(rng, d) -> tuple:
    r = rng.randrange(10)
    if r < 6:
        run, what, hostile = _hostile_run(rng)
        sw, case = _sweep_dir(rng, d, run)
        more = QUICK if not hostile else rng.choice([[], QUICK])
        if not hostile and rng.random() < 0.2:           # outer run flags beside the row's
            more = more + PLANT
            what, hostile = what + " + outer --plant", True
        return ["shrink", "--from-sweep", sw, case, *more], f"row run {what}: {run[:70]!r}", \
            hostile
    if r == 6:
        raw = rng.choice(['{"run": 5}', '{"run": null}', '{}', '[]', '{"run": ["python"]}',
                          "{not json", "", '{"run": "a", "run": "b"}', "[" * 5000,
                          json.dumps({"run": SWEEP_RUN, "x": "y" * (2 << 20)}),
                          json.dumps({"run": SWEEP_RUN, "x": "y" * (17 << 20)})])
        sw, case = _sweep_dir(rng, d, None, raw)
        # a row of 2 MB is under the 16 MB a result.json may hold (ladder/sweep/row.py)
        big = f"{len(raw) >> 20} MB " if len(raw) > 1 << 20 else ""
        return ["shrink", "--from-sweep", sw, case, *QUICK], \
            f"result.json {big}{raw[:40]!r}", len(raw) < 1 << 20 or len(raw) > 16 << 20
    sw, case = _sweep_dir(rng, d, SWEEP_RUN)
    if r == 7:
        os.makedirs(os.path.join(sw, "cases", "c0000-other"))
        return ["shrink", "--from-sweep", sw, "c0000"], "two cases match", True
    if r == 8:
        case = rng.choice(["c9999", "", "-", "c0000-tiny/..", "../sw", "*", "c0000-tiny\n"])
        return ["shrink", "--from-sweep", sw, case], f"case {case!r}", True
    where = rng.choice([os.path.join(d, "nope"), os.path.join(sw, "cases", "c0000-tiny",
                                                            "result.json"), "/dev/null", ""])
    return ["shrink", "--from-sweep", where, case], f"sweep dir {where[-30:]!r}", True


def shrink_case(rng, bases, d) -> Case:
    r = rng.random()
    if r < 0.14:
        bad = rng.random() < 0.75
        v = rng.choice(BAD_TIMES if bad else OK_TIMES)
        return Case("shrink", f"--max-time {v!r}", ["shrink", *FAST, *PLANT, "--max-time", v],
                    bad)
    if r < 0.22:
        v = rng.choice(BAD_POINTS + ["L03.q", "L00.q"])
        return Case("shrink", f"--point {v[:40]!r}", ["shrink", *FAST, *PLANT, *QUICK,
                                                      "--point", v], v not in ("L03.q",
                                                                               "L00.q"))
    if r < 0.44:
        path, hostile, more = _shrink_out(rng, d)
        return Case("shrink", f"--out {os.path.relpath(path, d) if path.startswith(d) else path!r}"
                    f"{' ' + ' '.join(more) if more else ''}",
                    ["shrink", *FAST, *PLANT, *QUICK, "--out", path, *more], hostile,
                    after=unchanged(d) if hostile else None)
    if r < 0.80:
        argv, what, hostile = _from_sweep(rng, d)
        return Case("shrink", "--from-sweep " + what, argv, hostile,
                    after=unchanged(d) if hostile else None)
    pairs = [(["--port", f"{TOY}:build", *PLANT], True),
             (["--port", f"{TOY}:build_buggy", *PLANT], True),
             (["--plant", ""], True), (["--plant", "nope"], True), (["--port", ""], True),
             (["--port", "os:getcwd"], True), (["--port", f"{TOY}:build_buggy", "--window",
                                                "4"], True),
             (["--port", f"{TOY}:build_buggy"], False), (["--dump", bases["archive"]], True),
             (["--fixture", bases["fixture"]], True), (["--model", "attn_v41"], True),
             (["--window", "-1", *PLANT], True), (["--window", str(10 ** 9), *PLANT], True),
             (["--prompt-len", "0", *PLANT], True), (["--seed", str(2 ** 64), *PLANT], True),
             (["--bits-map", "\uff45mbedding=4", "--weights", "cq", *PLANT], True),
             (["--verdict", "own", *PLANT], False), (["--verdict", "path", *PLANT], False),
             (["--window", "0", *PLANT], False), ([*PLANT, "--port-precision", "bfloat16"],
                                                  False)]
    more, hostile = rng.choice(pairs)
    return Case("shrink", " ".join(more)[:120], ["shrink", *FAST, *QUICK, *more], hostile)


# ---------------------------------------------------------------- precision
BAD_SPECS = ["garbage", "", "float64", "bfloat16,kv=float32", "kv=int8,bfloat16",
             "bfloat16,extra=1", "b" * 300, "bf\u0131oat16", "bfloat16,kv=int8,kv=int8",
             "act=bfloat16,act=float16", "activations=bfloat16,act=bfloat16", "bfloat16,",
             ",bfloat16", " ", "int8", "weights=int8", "kv=cq", "bfloat16;kv=int8",
             "bfloat16 kv=int8", "act=bfloat16=float16", "=bfloat16", "act=", "bfloat16\x00",
             "'bfloat16'", '{"activations":"bfloat16"}', "float32,kv=bfloat16,", "\uff42f16",
             "float16,kv=float32", "act=float32,weights=float32,kv=float32,act=float32"]
OK_SPECS = ["float32", "bfloat16", "float16", "bf16", "fp16", "float32,kv=int8",
            "bfloat16,kv=int8", "act=bfloat16,weights=float32,kv=bfloat16", "f32",
            " bfloat16 ", "act=float16,kv=int8"]
# --weights beside a spec's weights part: which pairs contradict each other
WEIGHT_PAIRS = [("cq", "act=bfloat16,weights=float32", True), ("dense", "weights=cq", True),
                ("cq", "weights=bfloat16", True), ("dense", "act=bfloat16,weights=cq", True),
                ("dense", "act=bfloat16,weights=float32", False),
                ("cq", "act=bfloat16,weights=cq", False), ("cq", "bfloat16", False),
                ("cq", "float32,weights=cq,kv=int8", False)]
MAP_VALUES = [('"bfloat16"', False), ('"float32,kv=int8"', False), ('"bf16"', False),
              ('{activations = "bfloat16"}', False), ('{activations = "bfloat16,kv=int8"}', True),
              ('{activations = "float16", kv = "float32"}', True), ('{act = "bfloat16"}', False),
              ('{activations = "bfloat16", weights = "cq,kv=int8"}', True),
              ('"garbage"', True), ('""', True), ("1", True), ("[]", True),
              ('["bfloat16"]', True), ('"' + "b" * 300 + '"', True), ('"\u0431float16"', True),
              ('{activations = 1}', True), ('{kv = "int8"}', False), ("bfloat16", True),
              ('"float16,kv=float32"', True), ('{}', False)]


def _spec(rng) -> tuple:
    bad = rng.random() < 0.6
    return rng.choice(BAD_SPECS if bad else OK_SPECS), bad


def _archive_with(base, d, change) -> str:
    """The base archive with its manifest text changed by `change(manifest) -> text`."""
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    from tests.hostile.readers import st_join, st_parts
    from ladder.engine.archive import META_KEY
    header, body = st_parts(open(base, "rb").read())
    header["__metadata__"][META_KEY] = change(json.loads(header["__metadata__"][META_KEY]))
    p = os.path.join(d, "a.safetensors")
    with open(p, "wb") as f:
        f.write(st_join(json.dumps(header), body))
    return p


def _producer(rng) -> tuple:
    """(change, what, hostile) of an archive's producer.precision."""
    r = rng.randrange(8)
    if r < 3:
        spec, bad = _spec(rng)
        return (lambda m: _dump_with(m, precision=spec)), f"producer.precision={spec[:40]!r}", bad
    if r == 3:
        v = rng.choice([5, [], True, {"activations": "bfloat16,kv=int8"},
                        {"activations": "bfloat16"}])
        return (lambda m: _dump_with(m, precision=v)), f"producer.precision={v!r}", \
            not isinstance(v, dict) or "," in str(v)
    if r == 4:
        key = rng.choice(["precision2", "Precision", "pr\u0435cision", "precision "])
        return (lambda m: _dump_with(m, **{key: "bfloat16"})), f"producer key {key!r}", True
    if r == 5:
        return (lambda m: _dump_with(m, precision=None)), "schema 2 without precision", True
    if r == 6:
        return (lambda m: json.dumps(m).replace('"precision": ', '"precision": "bfloat16", '
                                                '"precision": ', 1)), "duplicated key", True
    v = rng.choice(["bfloat16", "float32", None])
    return (lambda m: _dump_with(m, schema=1, precision=v)), f"schema 1, precision={v!r}", False


def _dump_with(m, schema=None, **producer) -> str:
    for k, v in producer.items():
        if v is None:
            m["producer"].pop(k, None)
        else:
            m["producer"][k] = v
    if schema is not None:
        m["schema_version"] = schema
    return json.dumps(m)


def precision_case(rng, bases, d) -> Case:
    r = rng.random()
    run = ["run", *FAST]
    if r < 0.3:
        spec, bad = _spec(rng)
        return Case("precision", f"run --port-precision {spec[:60]!r}",
                    run + ["--port-precision", spec], bad)
    if r < 0.42:
        w, spec, bad = rng.choice(WEIGHT_PAIRS)
        return Case("precision", f"run --weights {w} --port-precision {spec!r}",
                    run + ["--weights", w, "--port-precision", spec], bad)
    if r < 0.5:
        backend = rng.choice(["native", "triton"])
        spec = rng.choice(["bfloat16", "float16", "bfloat16,kv=int8", "float32,kv=int8"]
                          if backend == "native" else BAD_SPECS)
        return Case("precision", f"run --backend {backend} --port-precision {spec[:40]!r}",
                    run + ["--backend", backend, "--port-precision", spec], True)
    if r < 0.62:
        spec, bad = _spec(rng)
        side = rng.choice([["torch"], ["torch", "reference"], [bases["archive"]]])
        return Case("precision", f"compare {os.path.basename(side[0])} --port-precision "
                    f"{spec[:50]!r}", ["compare", *side, "--port-precision", spec]
                    + (["--steps", "1", "--prompt-len", "1"] if side[0] == "torch" else []), bad)
    if r < 0.82:
        change, what, bad = _producer(rng)
        p = _archive_with(bases["archive"], d, change)
        more = rng.choice([[], [], ["--port-precision", "bfloat16"]])
        return Case("precision", f"archive {what}{' ' + ' '.join(more) if more else ''}",
                    ["compare", p, *more], bad)
    value, bad = rng.choice(MAP_VALUES)
    text = open(bases["map"], encoding="utf-8").read()
    text = text.replace("[map]\n", f"[map]\nprecision = {value}\n", 1)
    p = os.path.join(d, "my-map.toml")
    with open(p, "w", encoding="utf-8") as f:
        f.write(text)
    return Case("precision", f"name map precision = {value[:50]}",
                ["compare", bases["needle_rs"], "--map", p], bad,
                must_say="my-map.toml")
