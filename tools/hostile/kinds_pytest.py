"""The plugin and golden kinds of tools/hostile/hostile_kinds.py: `python -m pytest` with the
needle-parity plugin's options on a one-test file (plugin), and golden trace archives that
`ladder_fixture` reads, corrupted (golden). Each runs as `pytest.main(argv)` in the case's
process, with a hook object that records what ended each test: the plugin's own failure
(pytest.fail, no traceback) is a verdict; any other exception is an escape.

A hostile option must be pytest's usage error (exit 4, an `ERROR:` line) before any test runs.
A hostile golden file must fail its test through the plugin's message ("... cannot be read",
"was recorded on ...", "is a directory", ...), never pass and never raise.
"""
from __future__ import annotations

import json
import os
import re

from hostile_kinds import Case, run_pytest
from kinds_cli import BAD_SPECS, OK_SPECS, TOY, WEIGHT_PAIRS

SCHEDULE = "prompt_len=1, steps=1, check_plain=False, locate=False"
PLUGIN_TEST = f'''import pytest


@pytest.mark.ladder({SCHEDULE})
def test_parity(ladder_check):
    ladder_check()
'''
GOLDEN_TEST = f'''import pytest


@pytest.mark.ladder({SCHEDULE})
def test_golden(ladder_fixture):
    ladder_fixture("g")
'''
FAULT = "rope_pos_plus_1"


def project(d: str, test: str, name: str, ini: list = ()) -> list:
    """The test file and its pytest.ini under `d`: pytest's argv tail that runs them alone."""
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write(test)
    with open(os.path.join(d, "pytest.ini"), "w", encoding="utf-8") as f:
        f.write("[pytest]\n" + "".join(line + "\n" for line in ini))
    return ["-c", os.path.join(d, "pytest.ini"), "--rootdir", d, path]


def make_bases(d: str) -> dict:
    """A rules file, a tiny parameter file, a recording of the plugin's schedule, and a
    golden file the golden test accepts (written by that test's first run)."""
    from ladder.cli.main import main
    from ladder.engine.rules import DEFAULT_RULES, dump_rules
    from reference.config import V2Config
    from reference.params import init_params, save_params
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/rules.toml", "w") as f:
        f.write(dump_rules(DEFAULT_RULES, "toml"))
    cfg = V2Config.preset("tiny")
    save_params(f"{d}/tiny.safetensors", init_params(cfg, 0, perturbed=True), cfg)
    assert main(["dump", "torch", "--out", f"{d}/rec.safetensors", "--prompt-len", "1",
                 "--steps", "1"], out=lambda *a: None) == 0
    g = os.path.join(d, "golden")
    os.makedirs(g)
    first = run_pytest(Case("golden", "base", project(g, GOLDEN_TEST, "test_golden.py"),
                            runner="pytest"), 120)
    golden = os.path.join(g, "test_golden", "g.safetensors")
    assert os.path.isfile(golden), first
    again = run_pytest(Case("golden", "base", project(g, GOLDEN_TEST, "test_golden.py"),
                            runner="pytest"), 120)
    assert again["verdict"] == "accepted legitimately", again
    return {"dir": d, "rules": f"{d}/rules.toml", "params": f"{d}/tiny.safetensors",
            "dump": f"{d}/rec.safetensors", "golden": golden,
            "cact": os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
                os.path.abspath(__file__)))), "tests", "fixtures", "cact_w2.cact")}


# ---------------------------------------------------------------- plugin
def _bad_path(rng, d, what: str) -> str:
    """A path that names no usable file: missing, a directory, a device, empty, a FIFO."""
    r = rng.randrange(6)
    p = os.path.join(d, f"{what}-{r}")
    if r == 0:
        return p                                         # missing
    if r == 1:
        os.makedirs(p)
        return p
    if r == 2:
        os.symlink("/dev/zero", p)
        return p
    if r == 3:
        open(p, "w").close()
        return p
    if r == 4:
        os.mkfifo(p)
        return p
    with open(p, "w") as f:
        f.write("{not a file of this kind")
    return p


def _groups(rng, bases, d) -> list:
    """(argv, ini lines, what, hostile) of one option; hostile=None: either way is fine."""
    spec, bad = (rng.choice(BAD_SPECS), True) if rng.random() < 0.6 else \
        (rng.choice(OK_SPECS), False)
    w, wspec, wbad = rng.choice(WEIGHT_PAIRS)
    seed = rng.choice([("3", False), ("-1", None), (str(2 ** 64), True), (str(10 ** 30), True),
                       ("abc", True), ("", True), ("1_0", None), ("\u0663", None)])
    port = rng.choice([("", True), (":", True), ("nope_zz:build", True), ("os:getcwd", True),
                       (f"{TOY}:nope", True), (f"{TOY}:build", False),
                       (f"{TOY}:build_buggy", False), ("a" * 300 + ":b", True)])
    plant = rng.choice([("", True), ("nope", True), (FAULT, False), ("x" * 300, True),
                        ("prefill_batch_only_engram_row", False)])
    out = rng.choice(["", "file", "/dev/null", "under", "long", "new"])
    outs = {"": ("", True), "/dev/null": ("/dev/null", True), "new": (f"{d}/out", False),
            "long": (f"{d}/{'o' * 300}", True), "file": (f"{d}/f", True),
            "under": (f"{d}/f/sub", True)}
    if out in ("file", "under"):
        open(f"{d}/f", "w").close()
    device = rng.choice([("meta", True), ("", True), ("cuda:99", None), ("cpu", False),
                         ("xla", True), ("cpu:0", None)])
    model = rng.choice([(["--ladder-params", bases["params"]], False),
                        (["--ladder-cact", bases["cact"]], False),
                        (["--ladder-params", bases["params"], "--ladder-cact", bases["cact"]],
                         True),
                        (["--ladder-params", _bad_path(rng, d, "params")], True),
                        (["--ladder-cact", _bad_path(rng, d, "cact")], True)])
    rules = rng.choice([(bases["rules"], False), (_bad_path(rng, d, "rules"), True),
                        ("x" * 300, True)])
    dump = rng.choice([(bases["dump"], False), (_bad_path(rng, d, "dump"), True)])
    return [
        (["--ladder-precision", spec], [], f"--ladder-precision {spec[:40]!r}", bad),
        (["--ladder-backend", "native", "--ladder-precision",
          rng.choice(["bfloat16", "float16", "float32,kv=int8", "bfloat16,kv=int8"])], [],
         "--ladder-backend native below float32", True),
        (["--ladder-backend", "triton", "--ladder-precision", spec], [],
         f"--ladder-backend triton --ladder-precision {spec[:30]!r}", True if bad else None),
        (["--ladder-weights", w, "--ladder-precision", wspec], [],
         f"--ladder-weights {w} --ladder-precision {wspec}", wbad),
        (["--ladder-seed", seed[0]], [], f"--ladder-seed {seed[0][:30]!r}", seed[1]),
        (["--ladder-port", port[0]], [], f"--ladder-port {port[0][:40]!r}", port[1]),
        ([], [f"ladder_port = {port[0]}"], f"ini ladder_port = {port[0][:40]!r}",
         port[1] if port[0] else None),
        (["--ladder-plant", plant[0]], [], f"--ladder-plant {plant[0][:30]!r}", plant[1]),
        (["--ladder-plant", FAULT, "--ladder-port", f"{TOY}:build"], [],
         "--ladder-plant beside --ladder-port", True),
        (["--ladder-plant", FAULT], [f"ladder_port = {TOY}:build"],
         "--ladder-plant beside ini ladder_port", True),
        (["--ladder-port", f"{TOY}:build", "--ladder-dump", bases["dump"]], [],
         "--ladder-port beside --ladder-dump", True),
        (["--ladder-regen", "--ladder-regen-all"], [], "--ladder-regen and -all", True),
        (["--ladder-out", outs[out][0], "--ladder-plant", FAULT], [],
         f"--ladder-out {out!r} with a planted fault", outs[out][1]),
        (["--ladder-out", outs[out][0]], [], f"--ladder-out {out!r}", outs[out][1]),
        (["--ladder-device", device[0]], [], f"--ladder-device {device[0]!r}", device[1]),
        (model[0], [], " ".join(os.path.basename(a) if "/" in a else a for a in model[0]),
         model[1]),
        (["--ladder-rules", rules[0]], [], f"--ladder-rules {os.path.basename(rules[0])[:30]}",
         rules[1]),
        ([], [f"ladder_rules = {rules[0]}"], f"ini ladder_rules = "
         f"{os.path.basename(rules[0])[:30]}", rules[1]),
        (["--ladder-dump", dump[0]], [], f"--ladder-dump {os.path.basename(dump[0])}",
         dump[1]),
    ]


def _keys(argv, ini) -> set:
    keys = {a.split("=")[0] for a in argv if a.startswith("--ladder-")}
    return keys | {"--" + line.split(" =")[0].replace("_", "-") for line in ini}


def plugin_case(rng, bases, d) -> Case:
    groups = _groups(rng, bases, d)
    argv, ini, whats, hostile, taken = [], [], [], False, set()
    for _ in range(rng.choice([1, 1, 2, 2, 3])):
        a, i, what, bad = rng.choice(groups)
        if _keys(a, i) & taken:
            continue                     # one value per option: the hostile one is the one run
        taken |= _keys(a, i)
        argv, ini, whats = argv + a, ini + i, whats + [what]
        hostile = hostile or bool(bad)
    return Case("plugin", "; ".join(whats), argv + project(d, PLUGIN_TEST, "test_parity.py",
                                                           ini), hostile, runner="pytest")


# ---------------------------------------------------------------- golden
def _load(path):
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())


def _save(path, tensors, meta):
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=meta)


def _manifest(path, change):
    from ladder.engine.archive import META_KEY
    tensors, meta = _load(path)
    m = json.loads(meta[META_KEY])
    text = change(m)
    meta[META_KEY] = text if isinstance(text, str) else json.dumps(m)
    _save(path, tensors, meta)


def _content(rng, g) -> tuple:
    """(what, hostile, must_say, quiet_pass, precision flags) after editing the golden `g`."""
    import torch
    from ladder.model.precision import Precision
    r = rng.randrange(12)
    if r == 0:
        spec = rng.choice(BAD_SPECS)
        _manifest(g, lambda m: m["producer"].update(precision=spec))
        return f"declared precision {spec[:40]!r}", True, "cannot be read", "", []
    if r in (1, 2):                      # a declaration against the run's
        decl = rng.choice(["float16", "bfloat16", "float32,kv=int8", "float32"])
        run = rng.choice([None, "bfloat16", "float16"])
        _manifest(g, lambda m: m["producer"].update(precision=decl))
        same = Precision.parse(decl) == Precision.parse(run or "float32")
        said = r"\b" + re.escape(Precision.parse(decl).short().split()[0]) + r"\b"
        return f"declared {decl} under --ladder-precision {run}", not same, "", said, \
            ["--ladder-precision", run] if run else []
    if r == 3:
        key = rng.choice(["precision2", None])
        _manifest(g, lambda m: m["producer"].update(precision2="bfloat16") if key else
                  m["producer"].pop("precision"))
        return f"producer {'precision2' if key else 'without precision'}", True, "", "", []
    tensors, meta = _load(g)
    if r in (4, 5):
        keys = rng.choice([["prefill/logits"], ["decode00/logits"], [rng.choice(sorted(
            tensors))], sorted(tensors)])
        v = rng.choice([float("nan"), float("inf"), -float("inf")])
        for k in keys:
            tensors[k] = torch.full_like(tensors[k], v) if rng.random() < 0.5 else \
                tensors[k].index_fill(-1, torch.tensor([0]), v)
        _save(g, tensors, meta)
        # logits that are not numbers cannot be the argmax the manifest records: "cannot be
        # read" (issue 48); elsewhere a stored value may be a port's recorded NaN, and any of
        # the plugin's own messages will do
        logits = any(k.endswith("/logits") for k in keys)
        return f"{v} in {keys[0] if len(keys) == 1 else 'every tensor'}", True, \
            "cannot be read" if logits else "", "", []
    if r == 6:
        k = rng.choice(sorted(tensors))
        t = tensors[k]
        tensors[k] = rng.choice([t.reshape(-1), t.reshape(1, 1, -1), torch.zeros(1, 1),
                                 torch.cat([t, t], -1), t[..., :-1], torch.zeros(0)])
        _save(g, tensors, meta)
        return f"{k} shape {list(tensors[k].shape)}", True, "", "", []
    if r == 7:
        from ladder.engine.archive import META_KEY
        m = json.loads(meta[META_KEY])
        field, value = rng.choice([("kv_window", 2 ** 40), ("kv_window", -1),
                                   ("tokens", [1] * 1_000_000), ("prompt_len", 2 ** 63),
                                   ("d_model", 2 ** 40), ("num_heads", 8),
                                   ("tokens", [3, 4]), ("params_sha256", "0" * 64),
                                   ("steps", [{"name": f"s{i}", "pos": 0, "len": 1}
                                              for i in range(100_000)])])
        where = m if field == "kv_window" else m["geometry"] if field in (
            "d_model", "num_heads") else m["weights"] if field == "params_sha256" else \
            m["schedule"]
        where[field] = value
        meta[META_KEY] = json.dumps(m)
        _save(g, tensors, meta)
        return f"manifest {field}={str(value)[:30]}", True, "", "", []
    if r == 8:
        k = rng.choice(sorted(tensors))
        scale = rng.choice([1 + 1e-7, 2.0])
        tensors[k] = tensors[k] * scale
        _save(g, tensors, meta)
        return f"{k} x {scale}", False, "", "", []
    from tests.hostile.readers import mutate_safetensors
    from ladder.engine.archive import META_KEY
    data, what, hostile = mutate_safetensors(rng, open(g, "rb").read(),
                                             META_KEY if r == 9 else None)
    with open(g, "wb") as f:
        f.write(data)
    return what, hostile, "", "", []


def _path_kind(p: str) -> str:
    return "link" if os.path.islink(p) else "dir" if os.path.isdir(p) else \
        "file" if os.path.isfile(p) else "other" if os.path.lexists(p) else "none"


def golden_case(rng, bases, d) -> Case:
    import shutil
    g = os.path.join(d, "test_golden", "g.safetensors")
    os.makedirs(os.path.dirname(g))
    regen = rng.choice([[]] * 6 + [["--ladder-regen"], ["--ladder-regen-all"]])
    after, quiet, more = None, "", []
    if rng.random() < 0.2:                          # the path itself
        r = rng.randrange(7)
        if r == 0:
            os.symlink(bases["golden"], g)
        elif r == 1:
            os.symlink(rng.choice(["/dev/zero", "/dev/null", os.path.join(d, "nowhere")]), g)
        elif r == 2:
            os.makedirs(g)
        elif r == 3:
            os.mkfifo(g)
        elif r == 4:
            os.symlink(os.path.dirname(g), g)
        else:
            open(g, "w").close()                   # empty: a regular file, unreadable
        kind = _path_kind(g)
        what, hostile = f"golden path: {kind}" + (f" -> {os.readlink(g)[-20:]}"
                                                  if kind == "link" else ""), True
        if kind == "file":
            hostile = not regen or regen == ["--ladder-regen"]
        elif rng.random() < 0.5:
            regen = regen or ["--ladder-regen"]
        after = (lambda: "" if _path_kind(g) == kind else
                 f"the {kind} at the golden path was replaced ({_path_kind(g)})")
        must = ""
    elif rng.random() < 0.05:
        what, hostile, must = "no golden file", False, ""
    else:
        shutil.copy(bases["golden"], g)
        what, hostile, must, quiet, more = _content(rng, g)
        if regen == ["--ladder-regen-all"]:
            hostile = False                        # rewritten and passing: as documented
        elif regen:
            must = ""                              # rewritten and failing: any plugin message
    argv = regen + more + project(d, GOLDEN_TEST, "test_golden.py")
    return Case("golden", f"{what}{' ' + ' '.join(regen) if regen else ''}",
                argv, hostile, runner="pytest", must_say=must, after=after,
                quiet_pass=quiet, extra={"refused_by_failure": True})
