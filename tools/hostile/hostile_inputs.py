"""Issue #16's (and #24's) hostile input files, each run through the CLI under hard limits,
as a table.

    python tools/hostile/hostile_inputs.py [--only NAME ...] [--pythonpath DIR] [--timeout 60]
                                   [--max-as 4G] [--json OUT]
    python tools/hostile/hostile_inputs.py --readers 150 [--seed 32] [--json OUT]
    python tools/hostile/hostile_inputs.py --kinds shrink,precision,plugin,golden --cases 260

Builds every case of the issue in a temporary directory (a .cact whose header declares a huge
max_seq_len or Engram dilation, links to /dev/zero, FIFOs, a 50,000-level dotted TOML key, an
empty tokenizer piece, NaN / integer / bool parameters, rope_theta <= 0, ...) and runs the
command each one reaches (`python -m ladder run ...` mostly) in a child process with an
address-space limit (--max-as) and a CPU-time limit, so that a regression cannot take a shared
machine down. Reports per case: exit status, wall time, peak resident set (wait4's ru_maxrss),
whether a traceback was printed, and the last line of stderr. The project's contract is exit 2,
one line, no traceback, well under the limits.

--readers N generates N hostile inputs for each reader added since (trace archives and their
manifests, needle-rs fixtures, name maps, sweep grids, result.json / sweep.json for --merge,
--port factories, needle_trace's image; tests/hostile/readers.py) and runs each through the CLI
(in one limited child process per reader): a table of exit 2 clean, accepted legitimately,
judged failing, and what must stay 0: hostile inputs accepted, tracebacks, timeouts.

--kinds K,... --cases N generates N cases of each of issue 48's kinds (shrink's flags and sweep
rows, precision declarations, the pytest plugin's options, golden files;
tools/hostile/hostile_kinds.py) and tabulates them the same way, then lists every escape.

--pythonpath runs the CLI from another source tree (e.g. an export of an older commit) against
the same files: the "before" column of the issue's table.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time

from hostile_kinds import child_limits      # this folder is on sys.path when run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if not os.environ.get("PYTHONPATH"):      # else the tree under test comes from PYTHONPATH
    sys.path.insert(0, ROOT)

CACT = os.path.join(ROOT, "tests", "fixtures", "cact_w2.cact")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "v2_forward_vectors")
LADDER = [sys.executable, "-m", "ladder", "run", "--steps", "2", "--prompt-len", "2",
          "--no-check-plain"]
HEADER_AT = {"kv_window": 12, "max_seq_len": 44, "engram_conv_dilation": 72,
             "engram_orders[1]": 84}


def patched_cact(tmp, name, **fields) -> str:
    data = bytearray(open(CACT, "rb").read())
    for field, value in fields.items():
        struct.pack_into("<I", data, HEADER_AT[field], value)
    path = os.path.join(tmp, name + ".cact")
    open(path, "wb").write(bytes(data))
    return path


def params_file(tmp, name, tensors=None, cfg_json=None, cfg_change=None, header=None) -> str:
    """A parameter safetensors file (tiny preset unless changed); `header` writes raw bytes."""
    import torch
    from safetensors.torch import save_file
    from reference.config import V2Config
    from reference.params import init_params
    path = os.path.join(tmp, name + ".safetensors")
    if header is not None:
        open(path, "wb").write(struct.pack("<Q", len(header)) + header)
        return path
    cfg = V2Config.preset("tiny")
    params = init_params(cfg, 0, perturbed=True)
    for key, fn in (tensors or {}).items():
        params[key] = fn(params[key])
    meta = cfg.to_dict()
    meta.update(cfg_change or {})
    text = cfg_json if cfg_json is not None else json.dumps(meta)
    save_file({k: v.contiguous() for k, v in params.items()}, path,
              metadata={"needle_config": text})
    del torch
    return path


def rules_file(tmp, name, text) -> str:
    path = os.path.join(tmp, name)
    open(path, "w").write(text)
    return path


def link(tmp, name, target) -> str:
    path = os.path.join(tmp, name)
    os.symlink(target, path)
    return path


def fifo(tmp, name) -> str:
    path = os.path.join(tmp, name)
    os.mkfifo(path)
    return path


def fixture_copy(tmp, name, change=None, json_target=None) -> str:
    """A copy of the committed fixture; `change(manifest)` edits it, `json_target` links the
    .json to a device instead."""
    stem = os.path.join(tmp, name)
    os.symlink(FIXTURE + ".safetensors", stem + ".safetensors")
    if json_target:
        os.symlink(json_target, stem + ".json")
        return stem
    m = json.load(open(FIXTURE + ".json"))
    if change:
        change(m)
    open(stem + ".json", "w").write(json.dumps(m))
    return stem


def cases(tmp) -> list:
    """(name, argv) for every case of the issue, in its order."""
    import torch
    from ladder.engine.rules import DEFAULT_RULES
    c = []
    cact = lambda name, **f: LADDER + ["--cact", patched_cact(tmp, name, **f)]
    c.append(("cact max_seq_len=2^26", cact("seq26", max_seq_len=2 ** 26)))
    c.append(("cact max_seq_len=2^28", cact("seq28", max_seq_len=2 ** 28)))
    c.append(("cact Engram dilation 10^7", cact("dil", engram_conv_dilation=10 ** 7,
                                                **{"engram_orders[1]": 10 ** 7})))
    c.append(("params Engram dilation 10^7", LADDER + ["--params", params_file(
        tmp, "dil", cfg_change={"engram_orders": [2, 10 ** 7]})]))
    c.append(("cact max_seq_len=kv_window=2e6", cact("win", max_seq_len=2 * 10 ** 6,
                                                     kv_window=2 * 10 ** 6)))
    c.append(("params max_seq_len=kv_window=2e6", LADDER + ["--params", params_file(
        tmp, "win", cfg_change={"max_seq_len": 2 * 10 ** 6, "kv_window": 2 * 10 ** 6})]))
    c.append(("cact max_seq_len=10^8", cact("seq8", max_seq_len=10 ** 8)))
    c.append(("cact -> /dev/zero", LADDER + ["--cact", link(tmp, "zero.cact", "/dev/zero")]))
    c.append(("cact -> /dev/urandom", LADDER + ["--cact", link(tmp, "rnd.cact", "/dev/urandom")]))
    c.append(("rules -> /dev/zero", LADDER + ["--rules", link(tmp, "zero.toml", "/dev/zero")]))
    c.append(("manifest -> /dev/zero", LADDER + ["--fixture", fixture_copy(
        tmp, "fxzero", json_target="/dev/zero")]))
    c.append(("FIFO --cact", LADDER + ["--cact", fifo(tmp, "f.cact")]))
    c.append(("FIFO --params", LADDER + ["--params", fifo(tmp, "f.safetensors")]))
    c.append(("FIFO --rules", LADDER + ["--rules", fifo(tmp, "f.toml")]))
    c.append(("FIFO --fixture", LADDER + ["--fixture", fixture_copy(
        tmp, "fxfifo", json_target=fifo(tmp, "fifo.json"))]))
    c.append(("directory --params", LADDER + ["--params", tmp]))
    c.append(("rules TOML key 50,000 levels", LADDER + ["--rules", rules_file(
        tmp, "deep.toml", "a" + ".a" * 50000 + " = 1\n")]))
    c.append(("tokenizer empty marker piece", [sys.executable, __file__, "--encode",
                                              empty_piece_cact(tmp)]))
    c.append(("JSON header nesting 10^5", LADDER + ["--params", params_file(
        tmp, "deep", header=b"[" * 100000 + b"]" * 100000)]))
    c.append(("JSON header 5000-digit int", LADDER + ["--params", params_file(
        tmp, "longint", header=b'{"t": {"dtype": "F32", "shape": [' + b"9" * 5000
        + b'], "data_offsets": [0, 0]}}')]))
    c.append(("needle_config not JSON", LADDER + ["--params", params_file(
        tmp, "notjson", cfg_json="{not json")]))
    c.append(('config kv_window="8"', LADDER + ["--params", params_file(
        tmp, "typed", cfg_change={"kv_window": "8"})]))
    d = DEFAULT_RULES.to_dict()
    d["rules"] = [r for r in d["rules"] if not r["pattern"].startswith("arbiter/")]
    c.append(("rules without arbiter/*, --fixture", LADDER + ["--fixture", FIXTURE, "--rules",
                                                             rules_file(tmp, "noarb.json",
                                                                        json.dumps(d))]))
    c.append(("rules rtol = 10**30 (int)", LADDER + ["--rules", rules_file(
        tmp, "bigint.json", '{"rules": {"*": ' + "1" + "0" * 30 + "}}")]))
    c.append(("rules rtol = 1e308", LADDER + ["--rules", rules_file(
        tmp, "huge.json", '{"rules": {"*": 1e308}}')]))
    c.append(("manifest kv_window = 2**70", LADDER + ["--fixture", fixture_copy(
        tmp, "fxwin", change=lambda m: m["schedule"].update(kv_window=2 ** 70))]))
    nan = lambda t: t.index_fill(0, torch.tensor([0]), float("nan"))
    c.append(("params NaN", LADDER + ["--params", params_file(
        tmp, "nan", tensors={"stack/final_norm/scale": nan})]))
    c.append(("params Inf", LADDER + ["--params", params_file(
        tmp, "inf", tensors={"stack/final_norm/scale": lambda t: t + float("inf")})]))
    c.append(("params int64 tensor", LADDER + ["--params", params_file(
        tmp, "int", tensors={"stack/final_norm/scale": lambda t: t.round().long()})]))
    c.append(("params all bool", LADDER + ["--params", params_file(
        tmp, "bool", tensors={k: (lambda t: t > 0) for k in _tiny_keys()})]))
    c.append(("params rope_theta = 0", LADDER + ["--params", params_file(
        tmp, "theta0", cfg_change={"rope_theta": 0.0})]))
    c.append(("params rope_theta = NaN", LADDER + ["--params", params_file(
        tmp, "thetanan", cfg_change={"rope_theta": float("nan")})]))
    c += issue24_cases(tmp)
    c += issue20_cases(tmp)
    c += issue32_cases(tmp)
    c.append(("legit: tiny preset", LADDER))
    c.append(("legit: cact max_seq_len=2^20", cact("seq20", max_seq_len=2 ** 20)))
    return c


V41 = [sys.executable, "-m", "ladder", "run", "--model", "attn_v41"]
REFERENCE = [sys.executable, "-m", "reference", "run", "--steps", "1", "--prompt-len", "1"]


def v41_copy(tmp, name, change) -> str:
    """A copy of the committed V4.1 fixture with `change(manifest)` applied."""
    src = os.path.join(ROOT, "tests", "fixtures", "attn_v41_official")
    stem = os.path.join(tmp, name)
    os.symlink(src + ".safetensors", stem + ".safetensors")
    m = json.load(open(src + ".json"))
    change(m)
    open(stem + ".json", "w").write(json.dumps(m))
    return stem


def issue24_cases(tmp) -> list:
    """Issue #24 section 4: the hostile inputs found that turn."""
    from reference.config import V2Config
    ma = lambda **kw: (lambda m: m["model_args"].update(kw))  # noqa: E731
    c = [("v41 rope_theta=1.0", V41 + ["--fixture", v41_copy(tmp, "v41t", ma(rope_theta=1.0))]),
         ("v41 beta_slow=0", V41 + ["--fixture", v41_copy(tmp, "v41b", ma(beta_slow=0))]),
         ("v41 index_topk=-1", V41 + ["--fixture", v41_copy(tmp, "v41k", ma(index_topk=-1))]),
         ("v41 max_seq_len=2^31-1", V41 + ["--fixture", v41_copy(
             tmp, "v41s", ma(max_seq_len=2 ** 31 - 1))]),
         ("v41 dim=65", V41 + ["--fixture", v41_copy(tmp, "v41d", ma(dim=65))]),
         ("v41 calls=[]", V41 + ["--fixture", v41_copy(tmp, "v41c", lambda m: m.update(
             calls=[]))]),
         ("v41 --max-memory 64K", V41 + ["--max-memory", "64K"]),
         ("safetensors shape [2^64, 0]", LADDER + ["--params", params_file(
             tmp, "dim64", header=b'{"t": {"dtype": "F32", "shape": [18446744073709551616, 0], '
                                  b'"data_offsets": [0, 0]}}')]),
         ("safetensors dtype a list", LADDER + ["--params", params_file(
             tmp, "dtlist", header=b'{"t": {"dtype": ["F32"], "shape": [0], '
                                   b'"data_offsets": [0, 0]}}')]),
         ("safetensors header 10^6 entries", LADDER + ["--params", params_file(
             tmp, "many", header=b"{" + b",".join(
                 b'"t%d":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}' % i
                 for i in range(10 ** 6)) + b"}")]),
         ("manifest 3M nested empty lists", LADDER + ["--fixture", fixture_copy(
             tmp, "fxlists", change=lambda m: m.update(junk=[[]] * 3_000_000))]),
         ("rules 40,000 patterns", LADDER + ["--rules", rules_file(tmp, "many.json", json.dumps(
             {"rules": {**{f"p{i}": 1e-3 for i in range(40000)}, "*": 1e-3}}))]),
         ("rules one 100,000-char pattern", LADDER + ["--rules", rules_file(
             tmp, "long.json", json.dumps({"rules": [{"pattern": "*a" * 50000, "rtol": 1e-3},
                                                     {"pattern": "*", "rtol": 1e-3}]}))]),
         ("regen --out ''", [sys.executable, "-m", "ladder", "regen", "--out", ""]),
         ("--device meta", LADDER + ["--device", "meta"]),
         ("--params ''", LADDER + ["--params", ""]),
         ("config look-alike kv_window", LADDER + ["--params", params_file(
             tmp, "lookalike", cfg_json=V2Config.preset("tiny").to_json().replace(
                 '"kv_window"', '"kv_w\u0456ndow"'))]),
         ("params rope_theta = 1e-30", LADDER + ["--params", params_file(
             tmp, "theta30", cfg_change={"rope_theta": 1e-30})]),
         ("reference --seed 2**64", REFERENCE + ["--seed", str(2 ** 64)]),
         ("reference --save unwritable", REFERENCE + ["--save", "/proc/version"])]
    return c


def issue32_cases(tmp) -> list:
    """Issue 32: the six left from the last round (the 1M-position geometry is accepted: it
    must finish well inside the timeout)."""
    ma = lambda **kw: (lambda m: m["model_args"].update(kw))  # noqa: E731
    v41 = lambda name, **kw: V41 + ["--fixture", v41_copy(tmp, name, ma(**kw))]  # noqa: E731
    return [("v41 compress_ratios 10^9", v41("v41r", compress_ratios=[0, 0, 10 ** 9, 2, 1, 1,
                                                                      1, 1])),
            ("v41 max_seq_len=1048576 (accepted)", v41("v41m", max_seq_len=1048576)),
            ("params pad_token_id=-5", LADDER + ["--params", params_file(
                tmp, "pad5", cfg_change={"pad_token_id": -5})]),
            ("params pad_token_id=-2147483647", LADDER + ["--params", params_file(
                tmp, "padmin", cfg_change={"pad_token_id": -2147483647})]),
            ("v41 original_seq_len=0", v41("v41o", original_seq_len=0)),
            ("v41 beta_slow=10^9", v41("v41b9", beta_slow=10 ** 9)),
            ("--bits-map fullwidth key", LADDER + ["--weights", "cq", "--bits-map",
                                                   "\uff45mbedding=4,default=2"]),
            ("--plant ''", LADDER + ["--plant", ""])]


COMPARE = [sys.executable, "-m", "ladder", "compare"]


def _archive(tmp, name, manifest_change=None, tensors=None, raw=None) -> str:
    """A trace archive of one prefill position of the tiny model's embed, its manifest edited."""
    from safetensors.torch import save_file
    import torch
    path = os.path.join(tmp, name + ".safetensors")
    if raw is not None:
        with open(path, "wb") as f:
            f.write(raw)
        return path
    m = {"format": "needle-parity-trace", "schema_version": 1, "producer": {}, "geometry": {},
         "kv_window": 8, "weights": {}, "argmax": {}, "captured": "all", "points": ["embed"],
         "not_emitted": {}, "schedule": {"tokens": [5], "prompt_len": 1,
                                         "steps": [{"name": "prefill", "pos": 0, "len": 1}]}}
    if manifest_change:
        manifest_change(m)
    save_file(tensors or {"prefill/embed": torch.zeros(1, 48)}, path,
              metadata={"needle_parity_trace": json.dumps(m)})
    return path


def _needle_rs(tmp, name, change) -> str:
    stem = os.path.join(tmp, name)
    m = {"blob_index": {"prefill/embed": {"offset": 0, "shape": [48]}},
         "steps": [{"name": "prefill", "pos": 0, "tokens": [5],
                    "blobs": {"embed": "prefill/embed"}, "argmax": 0}],
         "geometry": {"d_model": 48, "num_heads": 4, "num_kv_heads": 2, "num_layers": 6,
                      "head_dim": 12, "mhc_lanes": 4, "engram_layers": [1, 4],
                      "engram_orders": [2, 3], "rope_theta": 10000.0, "vocab_size": 256},
         "kv_window": 8, "prompt_ids": [5]}
    blob = b"\0" * (4 * 48)
    m, blob = change(m, blob)
    with open(stem + ".json", "w") as f:
        json.dump(m, f)
    with open(stem + ".f32", "wb") as f:
        f.write(blob)
    return stem


def issue20_cases(tmp) -> list:
    """Issue #20: the archives, needle-rs fixtures and name maps `ladder compare` reads."""
    c = [("archive header length past the file", COMPARE + [_archive(
             tmp, "ahl", raw=struct.pack("<Q", 10 ** 12) + b"{}"), "reference"]),
         ("archive schema_version 3", COMPARE + [_archive(
             tmp, "asv", lambda m: m.update(schema_version=3)), "reference"]),
         ("archive 10^6 steps", COMPARE + [_archive(
             tmp, "ast", lambda m: m["schedule"].update(steps=[{"name": f"s{i}", "pos": 0,
                                                                "len": 1}
                                                               for i in range(10 ** 6)])),
             "reference"]),
         ("archive tensor of another step", COMPARE + [_archive(
             tmp, "aos", tensors={"decode00/embed": __import__("torch").zeros(1, 48)}),
             "reference"]),
         ("needle-rs offset past the values", COMPARE + [_needle_rs(
             tmp, "nro", lambda m, b: (m["blob_index"]["prefill/embed"].update(offset=10 ** 6)
                                       or m, b)), "reference"]),
         ("needle-rs values not whole floats", COMPARE + [_needle_rs(
             tmp, "nrf", lambda m, b: (m, b + b"\0")), "reference"]),
         ("needle-rs geometry num_layers a string", COMPARE + [_needle_rs(
             tmp, "nrg", lambda m, b: (m["geometry"].update(num_layers="6") or m, b)),
             "reference"]),
         ("name map unknown table", COMPARE + [
             os.path.join(ROOT, "tests", "fixtures", "upstream_v2.safetensors"), "reference",
             "--map", rules_file(tmp, "bad-map.toml", '[map]\nname = "x"\n[renames]\n')]),
         ("compare side a FIFO", COMPARE + [fifo(tmp, "side.safetensors"), "reference"])]
    return c


def _tiny_keys():
    from reference.config import V2Config
    from reference.params import param_shapes
    return list(param_shapes(V2Config.preset("tiny")))


def empty_piece_blob(blob: bytes, index: int) -> bytes:
    """A tokenizer blob with piece `index` emptied (its length set to 0, its text removed)."""
    from reference.tokenizer import _HEAD, _REC
    off = _HEAD.size
    for _ in range(index):
        off += _REC.size + _REC.unpack_from(blob, off)[2]
    score, kind, length = _REC.unpack_from(blob, off)
    return blob[:off] + _REC.pack(score, kind, 0) + blob[off + _REC.size + length:]


def empty_piece_cact(tmp) -> str:
    """A tiny .cact whose tokenizer's USER_DEFINED piece 4 is empty (framing otherwise valid)."""
    from reference.cact import _RECORD, DIRECTORY_AT, build_cact
    from reference.config import V2Config
    from reference.params import init_params
    from reference.tokenizer import Tokenizer
    cfg = V2Config.preset("tiny")
    pieces = ["<pad>", "</s>", "<s>", "<unk>", "<m>"] + [f"p{i}" for i in range(cfg.vocab_size - 5)]
    tok = Tokenizer(pieces, [0.0] * len(pieces), [2, 2, 2, 1, 3] + [0] * (len(pieces) - 5))
    f = build_cact(init_params(cfg, 0), cfg, tokenizer=tok)
    data, slot = f.to_bytes(), f.slots[-1]
    blob = empty_piece_blob(tok.to_blob(), 4)
    at = DIRECTORY_AT + _RECORD.size * slot.index + 28          # the RAW slot's nbytes
    data = data[:at] + struct.pack("<Q", len(blob)) + data[at + 8:slot.offset] + blob
    path = os.path.join(tmp, "emptypiece.cact")
    open(path, "wb").write(data)
    return path


def _encode(path) -> int:
    """Read a .cact and encode with its tokenizer: exit 2 and one line if the reader refuses."""
    from reference.cact import read_cact
    try:
        f = read_cact(path)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f.tokenizer.encode("hello <m> world"))
    return 0


def run(argv, env, timeout: float, max_as: int) -> dict:
    t0 = time.perf_counter()
    # `python -m` puts the working directory first on sys.path: run in the tree under test.
    p = subprocess.Popen(argv, cwd=env["PYTHONPATH"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, preexec_fn=child_limits(max_as, int(timeout) + 30),
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
        timed_out = True
    wall = time.perf_counter() - t0
    # Popen reaped the child; RUSAGE_CHILDREN's max is monotone, so run cases one per process
    # (main() does) or read it right after each: here it is the max so far.
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    err = err.decode("utf-8", "replace")
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    return {"rc": "timeout" if timed_out else p.returncode, "seconds": round(wall, 2),
            "peak_rss_mb": round(rss), "traceback": "Traceback" in err,
            "stderr_lines": len(lines), "last": lines[-1][:160] if lines else ""}


# ---------------------------------------------------------------- --readers: generated cases
VERDICTS = ("exit 2 clean", "accepted legitimately", "judged failing", "hostile accepted",
            "traceback", "timeout")


def _one_reader_case(case, ladder, timeout: float) -> str:
    """Which of VERDICTS one generated case earns through the CLI (in this process)."""
    import contextlib
    import io
    import signal

    def expired(signum, frame):
        raise TimeoutError
    signal.signal(signal.SIGALRM, expired)
    signal.alarm(max(1, int(timeout)))
    err = io.StringIO()
    try:
        if not case.argv:                    # needle_trace's image: the program itself
            try:
                case.read()
                rc, text = 0, ""
            except case.errors as e:
                rc, text = 2, f"error: {e}\n"
        else:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                rc = ladder(case.argv, out=lambda *a: None)
            text = err.getvalue()
    except TimeoutError:
        return "timeout"
    except BaseException:                    # noqa: BLE001  anything escaping the CLI
        return "traceback"
    finally:
        signal.alarm(0)
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("building ")]
    if rc == 2:
        clean = len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in text
        return "exit 2 clean" if clean else "traceback"
    if rc not in (0, 1):
        return "traceback"
    if rc == 1 and case.errors and "Diverged" in {e.__name__ for e in case.errors}:
        return "judged failing"              # a spoiled port, captured and judged
    if case.hostile:
        return "hostile accepted"
    return "accepted legitimately" if rc == 0 else "judged failing"


def reader_child(name: str, n: int, seed: int, timeout: float) -> int:
    """`n` generated cases of reader `name` (tests/hostile/readers.py), each through the CLI in
    this process; one JSON line of counts, with the kinds of any bad verdict."""
    import random
    import shutil
    sys.path[:0] = [ROOT]
    from tests.hostile import readers as hr
    from ladder.cli.main import main as ladder
    counts = {"reader": name, "cases": 0, **{v: 0 for v in VERDICTS}, "bad": {}}
    with tempfile.TemporaryDirectory() as tmp:
        bases = hr.make_bases(os.path.join(tmp, "bases"))
        rng = random.Random(f"{seed}:{name}")
        for i in range(n):
            d = os.path.join(tmp, f"c{i}")
            os.makedirs(d)
            sys.path.insert(0, d)            # a --port case's module
            case = hr.READERS[name](rng, bases, d)
            verdict = _one_reader_case(case, ladder, timeout)
            sys.path.remove(d)
            counts["cases"] += 1
            counts[verdict] += 1
            if verdict in ("hostile accepted", "traceback", "timeout"):
                counts["bad"].setdefault(verdict, []).append(case.kind[:80])
            shutil.rmtree(d, ignore_errors=True)
    print(json.dumps(counts))
    return 0


def readers_report(n: int, seed: int, timeout: float, max_as: int, as_json: str | None) -> int:
    sys.path[:0] = [ROOT]
    from tests.hostile import readers as hr
    rows = []
    print(f"{n} generated cases per reader, seed {seed}, through the CLI; --max-as per reader")
    print("| reader | cases | " + " | ".join(VERDICTS) + " | seconds |")
    print("|---|---|" + "---|" * len(VERDICTS) + "---|")
    for name in hr.READERS:
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, __file__, "--reader-child", name, "--readers",
                              str(n), "--seed", str(seed), "--timeout", str(timeout)],
                             capture_output=True, text=True, cwd=ROOT,
                             env=dict(os.environ, PYTHONPATH=ROOT),
                             preexec_fn=child_limits(max_as, int(n * timeout) + 300))
        try:
            r = json.loads(res.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            r = {"reader": name, "cases": 0, **{v: 0 for v in VERDICTS},
                 "bad": {"harness": res.stderr.strip().splitlines()[-3:]}}
        r["seconds"] = round(time.perf_counter() - t0, 1)
        rows.append(r)
        print(f"| {name} | {r['cases']} | " + " | ".join(str(r[v]) for v in VERDICTS)
              + f" | {r['seconds']} |", flush=True)
        for verdict, kinds in r["bad"].items():
            print(f"|  {verdict}: {', '.join(map(str, kinds[:5]))} |")
    total = {v: sum(r[v] for r in rows) for v in ("cases",) + VERDICTS}
    print(f"| all | {total['cases']} | " + " | ".join(str(total[v]) for v in VERDICTS) + " | |")
    if as_json:
        with open(as_json, "w") as f:
            json.dump(rows, f, indent=1)
    bad = total["hostile accepted"] + total["traceback"] + total["timeout"]
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", help="substrings of case names to run")
    ap.add_argument("--pythonpath", default=ROOT, help="source tree the CLI runs from")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--max-as", default="4G", help="address-space limit per case")
    ap.add_argument("--one", help=argparse.SUPPRESS)      # internal: run one case, print JSON
    ap.add_argument("--encode", help=argparse.SUPPRESS)   # internal: the tokenizer case
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--readers", type=int, metavar="N", help="instead: N generated cases per "
                    "reader added since issue 16 (tests/hostile/readers.py), a table per reader")
    ap.add_argument("--seed", type=int, default=32, help="the generators' seed (--readers and --kinds)")
    ap.add_argument("--reader-child", help=argparse.SUPPRESS)   # internal: one reader's cases
    ap.add_argument("--kinds", help="instead: issue 48's generated kinds, comma-separated "
                    "(shrink, precision, plugin, golden; tools/hostile/hostile_kinds.py)")
    ap.add_argument("--cases", type=int, default=260, help="--kinds: cases per kind")
    ap.add_argument("--kind-child", help=argparse.SUPPRESS)     # internal: one kind's cases
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.kinds or args.kind_child:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import hostile_kinds as hk
        if args.kind_child:
            return hk.child(args.kind_child, args.cases, args.seed, args.timeout, args.start)
        kinds = args.kinds.split(",")
        if not set(kinds) <= set(hk.KINDS):
            ap.error(f"--kinds {args.kinds}: each one of {', '.join(hk.KINDS)}")
        from reference.memory_budget import parse_size
        return hk.report(kinds, args.cases, args.seed, args.timeout, parse_size(args.max_as),
                         os.path.abspath(__file__), args.json)
    if args.encode:
        return _encode(args.encode)
    from reference.memory_budget import parse_size
    if args.reader_child:
        return reader_child(args.reader_child, args.readers, args.seed, args.timeout)
    if args.readers:
        return readers_report(args.readers, args.seed, args.timeout, parse_size(args.max_as),
                              args.json)
    env = dict(os.environ, PYTHONPATH=args.pythonpath)
    with tempfile.TemporaryDirectory() as tmp:
        todo = cases(tmp)
        if args.one is not None:
            name, cmd = todo[int(args.one)]
            print(json.dumps(run(cmd, env, args.timeout, parse_size(args.max_as))))
            return 0
        rows = []
        print("| case | exit | seconds | peak RSS MB | traceback | stderr (last line) |")
        print("|---|---|---|---|---|---|")
        for i, (name, _) in enumerate(todo):
            if args.only and not any(s in name for s in args.only):
                continue
            # One wrapper process per case so that RUSAGE_CHILDREN is that case's alone.
            res = subprocess.run([sys.executable, __file__, "--one", str(i), "--pythonpath",
                                  args.pythonpath, "--timeout", str(args.timeout), "--max-as",
                                  args.max_as], capture_output=True, text=True, cwd=ROOT)
            try:
                r = json.loads(res.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                r = {"rc": "harness", "seconds": 0, "peak_rss_mb": 0, "traceback": True,
                     "last": res.stderr.strip().splitlines()[-1:]}
            rows.append({"case": name, **r})
            print(f"| {name} | {r['rc']} | {r['seconds']} | {r['peak_rss_mb']} | "
                  f"{'yes' if r['traceback'] else 'no'} | {str(r['last'])[:110]} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
