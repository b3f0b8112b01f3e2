"""Issue #16: seeded fuzzing of every input kind. Each mutated file is either accepted or refused
with the reader's own error class; nothing else may escape (no TypeError, KeyError,
RecursionError, OverflowError, MemoryError...).

All cases run in one child process under an address-space limit (2 GiB) and a CPU-time limit,
so a regression that allocates without bound or loops dies there and fails the test; the child
reports per input kind how many cases were accepted, refused, and escaped (with examples).
Fixed seed, a few hundred cases in all."""
from tests import paths
import json
import math
import os
import random
import resource
import struct
import subprocess
import sys

import pytest

ROOT = paths.ROOT
FIXTURES = paths.FIXTURES
SEED = 16
AS_LIMIT = 2 << 30
CPU_LIMIT = 90
COUNTS = {"cact": 70, "params": 70, "rules": 80, "manifest": 50, "tokenizer": 80, "config": 80,
          "v41_fixture": 60}

# Values that break naive readers: huge, negative, wrong type, non-finite, deep.
HOSTILE = [0, -1, 1, 2 ** 31, 2 ** 32 - 1, 2 ** 63, 2 ** 70, 10 ** 30, 1e308, -1e308, 1e-320,
           0.5, "8", "", None, True, [], {}, [1, 2], {"a": 1}, [[[[[[[[1]]]]]]]], "nan",
           2 ** 26, 10 ** 7]


def _hostile(rng):
    return rng.choice(HOSTILE) if rng.random() < 0.9 else rng.randrange(-2 ** 40, 2 ** 40)


def _flip(rng, data: bytes, lo: int, hi: int, n: int) -> bytes:
    b = bytearray(data)
    for _ in range(n):
        b[rng.randrange(lo, min(hi, len(b)))] = rng.randrange(256)
    return bytes(b)


# ---------------------------------------------------------------- the mutations, per kind
def cact_cases(rng, n):
    from reference.cact import DIRECTORY_AT
    base = open(os.path.join(FIXTURES, "cact_w2.cact"), "rb").read()
    for i in range(n):
        r = i % 4
        if r == 0:                               # a header field set to a hostile u32
            b = bytearray(base)
            struct.pack_into("<I", b, 4 * rng.randrange(1, 29), rng.choice(
                [0, 1, 2 ** 31, 2 ** 32 - 1, 2 ** 26, 10 ** 7, rng.randrange(2 ** 32)]))
            yield bytes(b)
        elif r == 1:                             # random bytes in the header and directory
            yield _flip(rng, base, 0, DIRECTORY_AT + 64 * 40, rng.randrange(1, 6))
        elif r == 2:                             # truncated or extended
            cut = rng.randrange(len(base))
            yield base[:cut] if rng.random() < 0.7 else base + bytes(rng.randrange(1, 200))
        else:                                    # random bytes anywhere (blobs included)
            yield _flip(rng, base, 0, len(base), rng.randrange(1, 20))


def params_cases(rng, n, tmp):
    import torch
    from safetensors.torch import save_file
    from reference.config import V2Config
    from reference.params import init_params
    cfg = V2Config.preset("tiny")
    params = init_params(cfg, 0, perturbed=True)
    path = os.path.join(tmp, "base.safetensors")
    save_file(params, path, metadata={"needle_config": cfg.to_json()})
    base = open(path, "rb").read()
    hlen = struct.unpack_from("<Q", base)[0]
    header = json.loads(base[8:8 + hlen])
    for i in range(n):
        r = i % 5
        if r == 0:                               # a needle_config field made hostile
            meta = cfg.to_dict()
            meta[rng.choice(sorted(meta))] = _hostile(rng)
            h = dict(header, __metadata__={"needle_config": json.dumps(meta)})
            raw = json.dumps(h).encode()
            yield struct.pack("<Q", len(raw)) + raw + base[8 + hlen:]
        elif r == 1:                             # a tensor entry's field made hostile
            h = json.loads(json.dumps(header))
            name = rng.choice([k for k in h if k != "__metadata__"])
            h[name][rng.choice(["dtype", "shape", "data_offsets"])] = _hostile(rng)
            raw = json.dumps(h).encode()
            yield struct.pack("<Q", len(raw)) + raw + base[8 + hlen:]
        elif r == 2:                             # random bytes in the header
            yield _flip(rng, base, 0, 8 + hlen, rng.randrange(1, 8))
        elif r == 3:                             # NaN/Inf/int/bool data
            p = dict(params)
            key = rng.choice(sorted(p))
            kind = rng.randrange(3)
            p[key] = (p[key] * float("nan") if kind == 0 else
                      (p[key] > 0) if kind == 1 else p[key].round().to(torch.int32))
            save_file(p, path, metadata={"needle_config": cfg.to_json()})
            yield open(path, "rb").read()
        else:                                    # truncated
            yield base[:rng.randrange(len(base))]


def rules_cases(rng, n):
    from ladder.engine.rules import DEFAULT_RULES, dump_rules
    toml, js = dump_rules(DEFAULT_RULES, "toml"), dump_rules(DEFAULT_RULES, "json")
    fields = ["rtol", "atol", "scale", "stat", "why", "pattern", "topk", "tie_factor"]
    for i in range(n):
        r = i % 4
        if r == 0:                               # structured: a field made hostile
            d = json.loads(js)
            target = d["rules"][rng.randrange(len(d["rules"]))] if rng.random() < 0.7 else \
                d["logits"]
            target[rng.choice(fields)] = _hostile(rng)
            if rng.random() < 0.2:
                d["rules"] = d["rules"][:rng.randrange(len(d["rules"]))]
            yield ".json", json.dumps(d).encode()
        elif r == 1:                             # random bytes in the TOML dump
            yield ".toml", _flip(rng, toml.encode(), 0, len(toml), rng.randrange(1, 10))
        elif r == 2:                             # deep keys, deep arrays, long numbers
            depth = rng.choice([10, 40, 100, 5000])
            yield ".toml", rng.choice([
                ("a" + ".a" * depth + " = 1\n").encode(),
                (f"[rules]\nx = " + "[" * depth + "]" * depth + "\n").encode(),
                (f"rel_floor = {'9' * depth}\n").encode(),
                ("x = " + "{a = " * depth + "1" + "}" * depth + "\n").encode()])
        else:
            yield ".json", _flip(rng, js.encode(), 0, len(js), rng.randrange(1, 10))


def manifest_cases(rng, n):
    base = json.load(open(os.path.join(FIXTURES, "v2_forward_vectors.json")))
    for i in range(n):
        m = json.loads(json.dumps(base))
        spot = rng.choice(["top", "schedule", "config", "params"])
        d = m if spot == "top" else m[spot]
        d[rng.choice(sorted(d))] = _hostile(rng)
        yield json.dumps(m).encode()


def tokenizer_cases(rng, n):
    from reference.tokenizer import CHAT_MARKERS, Tokenizer
    pieces = ["<pad>", "</s>", "<s>", "<unk>", *CHAT_MARKERS] + \
        [f"<0x{b:02X}>" for b in range(256)] + ["\u2581", "a", "b", "ab", "\u2581a", "ba"]
    types = [2, 2, 2, 1] + [3] * len(CHAT_MARKERS) + [4] * 256 + [0] * 6
    blob = Tokenizer(pieces, [float(-i) for i in range(len(pieces))], types).to_blob()
    empty = _emptied(blob, len(pieces))
    for i in range(n):
        r = i % 4
        if r == 0:
            yield _flip(rng, blob, 0, 60, rng.randrange(1, 4))
        elif r == 3:                             # one piece emptied (a marker: encode looped)
            yield empty(rng.randrange(len(pieces)) if rng.random() < 0.5
                        else rng.randrange(4, 4 + len(CHAT_MARKERS)))
        elif r == 1:
            yield _flip(rng, blob, 0, len(blob), rng.randrange(1, 12))
        else:
            yield blob[:rng.randrange(len(blob))]


def _emptied(blob: bytes, n: int):
    """index -> the blob with piece `index`'s text removed and its length set to 0."""
    from reference.tokenizer import _HEAD, _REC
    starts, off = [], _HEAD.size
    for _ in range(n):
        starts.append(off)
        off += _REC.size + _REC.unpack_from(blob, off)[2]

    def empty(i):
        score, kind, length = _REC.unpack_from(blob, starts[i])
        return blob[:starts[i]] + _REC.pack(score, kind, 0) + blob[starts[i] + _REC.size + length:]
    return empty


def config_cases(rng, n):
    from reference.config import V2Config
    base = V2Config.preset("tiny").to_dict()
    for i in range(n):
        d = dict(base)
        for _ in range(rng.randrange(1, 3)):
            d[rng.choice(sorted(d))] = _hostile(rng)
        text = json.dumps(d)
        if i % 4 == 3:
            text = text[:rng.randrange(len(text))]
        yield text


def v41_fixture_cases(rng, n):
    """(manifest bytes, safetensors bytes) of the V4.1 fixture, one of the two made hostile."""
    stem = os.path.join(FIXTURES, "attn_v41_official")
    man = json.load(open(stem + ".json"))
    st = open(stem + ".safetensors", "rb").read()
    hlen = struct.unpack_from("<Q", st)[0]
    for i in range(n):
        r = i % 4
        if r == 0:                               # a manifest field made hostile
            m = json.loads(json.dumps(man))
            spot = rng.choice(["top", "model_args", "official", "call"])
            d = m if spot == "top" else m["calls"][rng.randrange(len(m["calls"]))] \
                if spot == "call" else m[spot]
            d[rng.choice(sorted(d))] = _hostile(rng)
            yield json.dumps(m).encode(), st
        elif r == 1:                             # random bytes in the manifest
            raw = json.dumps(man).encode()
            yield _flip(rng, raw, 0, len(raw), rng.randrange(1, 8)), st
        elif r == 2:                             # random bytes in the safetensors header
            yield json.dumps(man).encode(), _flip(rng, st, 0, 8 + hlen, rng.randrange(1, 8))
        else:                                    # truncated safetensors
            yield json.dumps(man).encode(), st[:rng.randrange(len(st))]


# ---------------------------------------------------------------- the child
def child(tmp: str) -> dict:
    import torch
    from ladder.sides import fixtures
    from ladder.engine.rules import RulesError, load_rules
    from ladder.v41.sides import V41FixtureError
    from reference.cact import CactFormatError, parse_cact
    from reference.config import ConfigError, V2Config
    from reference.memory_budget import check_memory
    from reference.params import ParamsError, load_params
    from reference.tokenizer import Tokenizer, TokenizerFormatError
    torch.set_num_threads(1)
    rng = random.Random(SEED)
    budget = 256 << 20
    fx = os.path.join(FIXTURES, "v2_forward_vectors")
    os.symlink(fx + ".safetensors", os.path.join(tmp, "fx.safetensors"))

    def write(name, data):
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def cfg_from_json(text):
        return check_memory(V2Config.from_json(text), budget)

    # What an accepted file guarantees (a violation is reported like an escaped exception).
    def cact_ok(d):
        assert check_memory(parse_cact(d, "fuzz.cact", budget).config, budget) <= budget

    def params_ok(d):
        params, cfg = load_params(write("p.safetensors", d), max_memory=budget)
        assert all(t.dtype.is_floating_point and bool(torch.isfinite(t).all())
                   for t in params.values()), "accepted non-float or non-finite parameters"
        assert math.isfinite(cfg.rope_theta) and cfg.rope_theta > 0

    def rules_ok(d):
        rs = load_rules(write("r" + d[0], d[1]))
        for side in ("port", "arbiter"):
            rule = rs.for_point(f"{side}/L00.u")
            assert rule.rtol <= 1e3 and rule.atol <= 1e3, rule

    def manifest_ok(d):
        write("fx.json", d)
        f = fixtures.load(os.path.join(tmp, "fx"), budget)
        assert 0 <= f.window <= f.cfg.max_seq_len and len(f.tokens) <= f.cfg.max_seq_len

    def v41_ok(pair):
        from ladder.v41.sides import load_fixture
        write("v41.json", pair[0])
        write("v41.safetensors", pair[1])
        load_fixture(os.path.join(tmp, "v41"))

    def tok(blob):
        t = Tokenizer.from_blob(blob)
        t.decode(t.encode("ab a<|im_start|>b \u00e9 <think>x</think>"))   # must terminate

    kinds = {
        "cact": (cact_ok, CactFormatError, cact_cases(rng, COUNTS["cact"])),
        "params": (params_ok, (ParamsError, ConfigError), params_cases(rng, COUNTS["params"], tmp)),
        "rules": (rules_ok, RulesError, rules_cases(rng, COUNTS["rules"])),
        "manifest": (manifest_ok, fixtures.FixtureError, manifest_cases(rng, COUNTS["manifest"])),
        "tokenizer": (tok, TokenizerFormatError, tokenizer_cases(rng, COUNTS["tokenizer"])),
        "config": (cfg_from_json, ConfigError, config_cases(rng, COUNTS["config"])),
        "v41_fixture": (v41_ok, V41FixtureError, v41_fixture_cases(rng, COUNTS["v41_fixture"])),
    }
    report = {}
    for kind, (read, errors, cases) in kinds.items():
        r = report[kind] = {"accepted": 0, "refused": 0, "escaped": []}
        for data in cases:
            try:
                read(data)
                r["accepted"] += 1
            except errors:
                r["refused"] += 1
            except Exception as e:                       # noqa: BLE001 - the finding
                r["escaped"].append(f"{type(e).__name__}: {str(e)[:200]}")
    return report


@pytest.fixture(scope="module")
def fuzz_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")

    def limits():
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
        resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT, CPU_LIMIT))

    r = subprocess.run([sys.executable, os.path.abspath(__file__), str(tmp)], cwd=ROOT,
                       capture_output=True, text=True, timeout=3 * CPU_LIMIT, preexec_fn=limits,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, f"fuzz child died (rc {r.returncode}): {r.stderr[-3000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", sorted(COUNTS))
def test_fuzzed_inputs_are_accepted_or_refused_with_the_project_error(fuzz_report, kind):
    r = fuzz_report[kind]
    assert r["accepted"] + r["refused"] + len(r["escaped"]) == COUNTS[kind]
    assert not r["escaped"], r["escaped"][:5]
    assert r["refused"] >= COUNTS[kind] // 4        # the mutations do reach the checks


if __name__ == "__main__":
    print(json.dumps(child(sys.argv[1])))
