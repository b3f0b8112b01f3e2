"""Forward-parity fixtures: a reference ladder frozen as safetensors + a JSON manifest.

The ladder is the reference run in float64 (the arbiter) rounded once to float32. float32
results depend on which BLAS kernel a CPU picks, so a float32 fixture would not regenerate
byte for byte on another machine; float64 rounded to float32 does (a float64 difference of
1e-16 relative almost never crosses a float32 rounding boundary), and it is the better
yardstick besides: both the port and the float32 reference are judged against it.

Manifest: schema_version, generator, torch_version, config (geometry), params (source, seed,
sha256), seed, schedule (prompt_len, tokens, kv_window, steps), ladder_order, per-tensor
sha256. Reading checks every field and names the one that is wrong; the safetensors framing
is checked before anything is allocated (reference.params.read_safetensors_header), and
every tensor against its sha256.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import torch

from reference.config import MAX_INT, ConfigError, V2Config
from reference.memory_budget import check_memory
from reference.params import ParamsError, init_params, load_safetensors
from bounded.io import parse_json, read_capped
from ladder.engine.trace import Ladder, schedule

SCHEMA = 1
# The generator's name as every fixture records it. The script has since moved to
# tools/fixtures/; the recorded name stays, so the committed fixture keeps its bytes.
GENERATOR = "tools/gen_v2_forward_parity.py"
VALUES = "reference.decode.forward_cached on float64 parameters, rounded to float32"
MAX_MANIFEST = 64 * 1024 * 1024
SEED_MAX = 2 ** 63 - 1              # torch.Generator.manual_seed's range
FIXTURE_NAME = "v2_forward_vectors"
DEFAULT_STEM = os.path.join("tests", "fixtures", FIXTURE_NAME)     # relative to the repository


def _repo_fixtures():
    """The checkout's tests/fixtures/ (absolute), or None for an installed copy: found beside
    this package only when the directory above it is this project's source tree."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    here = os.path.join(root, "tests", "fixtures")
    return here if os.path.isfile(os.path.join(root, "pyproject.toml")) and \
        os.path.isdir(here) else None


REPO_FIXTURES = _repo_fixtures()


def default_stem():
    """Where `regen` writes by default: the checkout's fixture, whatever the working
    directory (None for an installed copy, which has no tests/)."""
    return os.path.join(REPO_FIXTURES, FIXTURE_NAME) if REPO_FIXTURES else None


def bare_stem(stem) -> str:
    """The stem of a fixture named by its stem or by either of its files."""
    stem = os.fspath(stem)
    for ext in (".safetensors", ".json"):
        if stem.endswith(ext):
            stem = stem[:-len(ext)]
    return stem


def find_stem(stem):
    """A fixture stem as given (relative to the working directory), else the same name in the
    checkout's tests/fixtures/; None when neither has both files."""
    stem = bare_stem(stem)
    tries = [stem] + ([os.path.join(REPO_FIXTURES, os.path.basename(stem))]
                      if REPO_FIXTURES else [])
    for cand in tries:
        if all(os.path.isfile(cand + ext) for ext in (".json", ".safetensors")):
            return cand
    return None


class FixtureError(ValueError):
    """A fixture that is malformed, corrupt, stale, or made for another model (names the field)."""


def _raw(t: torch.Tensor) -> bytes:
    # Flattened first: a "contiguous" tensor may still carry an odd stride on a size-1 axis,
    # which view(uint8) refuses; the flat copy has stride 1 and the same C-order bytes.
    flat = t.detach().cpu().reshape(-1).contiguous()
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def tensor_sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(_raw(t)).hexdigest()


def params_sha256(params: dict) -> str:
    """One digest over every parameter: name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(params):
        t = params[name]
        h.update(f"{name}|{t.dtype}|{list(t.shape)}|".encode())
        h.update(_raw(t))
    return h.hexdigest()


def seeded_tokens(cfg: V2Config, n: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, cfg.vocab_size, (n,), generator=g).tolist()


@dataclass
class Fixture:
    cfg: V2Config
    manifest: dict
    ladder: Ladder
    path: str

    @property
    def tokens(self) -> list:
        return list(self.manifest["schedule"]["tokens"])

    @property
    def prompt_len(self) -> int:
        return self.manifest["schedule"]["prompt_len"]

    @property
    def window(self) -> int:
        return self.manifest["schedule"]["kv_window"]

    def __repr__(self):
        return (f"Fixture({self.path}: {self.cfg.num_layers} layers, d={self.cfg.d_model}, "
                f"{len(self.tokens)} positions, {len(self.ladder)} points)")


def build(params, cfg: V2Config, tokens, prompt_len: int, *, params_source: dict, seed: int,
          window=None, rules=None, progress=None) -> tuple:
    """(tensors, manifest), or FixtureError/TraceError before anything exists to write.

    Checks: the traced float64 run equals the plain one bit for bit; the float32 reference
    agrees with the float64 arbiter under the `arbiter/*` rules."""
    from ladder.sides.capture import capture_reference
    from ladder.engine.compare import compare_ladders
    from ladder.engine.rules import DEFAULT_RULES
    win = cfg.kv_window if window is None else int(window)
    p64 = {k: v.double() for k, v in params.items()}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)               # one reduction order, whatever the machine
    try:
        lad64 = capture_reference(p64, cfg, tokens, prompt_len, window=win, check_plain=True,
                                  progress=progress, label="reference float64")
        lad32 = capture_reference(params, cfg, tokens, prompt_len, window=win,
                                  check_plain=True, progress=progress, label="reference float32")
    finally:
        torch.set_num_threads(threads)
    arb = Ladder(lad64.steps, {k: v.float() for k, v in lad64.values.items()}, "fixture")
    cmp = compare_ladders(lad32, arb, rules or DEFAULT_RULES, prefix="arbiter")
    if not cmp.passed:
        raise FixtureError(f"the float32 reference disagrees with the float64 arbiter at "
                           f"{cmp.first.key} (err {cmp.first.error:.3g} of allowance); "
                           f"nothing written")
    tensors = {"tokens": torch.tensor([int(t) for t in tokens], dtype=torch.int64)}
    tensors.update({f"ladder/{k}": v.contiguous() for k, v in arb.values.items()})
    manifest = {
        "schema_version": SCHEMA, "generator": GENERATOR,
        "kind": "needle-parity forward-parity fixture",
        "values": VALUES,
        "torch_version": torch.__version__.split("+")[0],
        "config": cfg.to_dict(), "params": params_source, "seed": int(seed),
        "schedule": {"prompt_len": int(prompt_len), "kv_window": win,
                     "tokens": [int(t) for t in tokens],
                     "steps": [{"name": s.name, "pos": s.pos, "len": len(s.tokens)}
                               for s in arb.steps]},
        "ladder_order": list(arb.values),
        "sha256": {k: tensor_sha256(v) for k, v in sorted(tensors.items())},
    }
    return tensors, manifest


def write(stem, tensors: dict, manifest: dict) -> tuple:
    """Write {stem}.safetensors and {stem}.json, both or neither (ladder/engine/atomic.py: temp files
    renamed into place together; a full disk raises OutputError and leaves nothing)."""
    from safetensors.torch import save
    from ladder.engine.atomic import write_all
    st_path, js_path = f"{stem}.safetensors", f"{stem}.json"
    os.makedirs(os.path.dirname(os.path.abspath(st_path)), exist_ok=True)
    # One metadata key: safetensors keeps metadata in a hash map, so several keys could be
    # written in any order and the bytes would change between runs.
    meta = {"needle_fixture": f"schema {SCHEMA}; manifest: the .json of the same stem"}
    blob = save({k: v for k, v in sorted(tensors.items())}, metadata=meta)
    write_all({st_path: blob, js_path: json.dumps(manifest, indent=1, sort_keys=True) + "\n"})
    return st_path, js_path


def _short(v) -> str:
    s = json.dumps(v, sort_keys=True)
    return s if len(s) <= 40 else s[:37] + "..."


# The inputs first: the field that says why, before the fields that follow from it.
_FIELD_ORDER = ("schema_version", "generator", "values", "torch_version", "config", "params",
                "seed", "schedule")


def _field_diff(a, b, path: str):
    """The first (dotted) manifest field where `a` (the file) and `b` (regenerated) differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        rank = lambda k: (_FIELD_ORDER.index(k) if not path and k in _FIELD_ORDER else
                          len(_FIELD_ORDER), k)
        for k in sorted(set(a) | set(b), key=rank):
            sub = f"{path}.{k}" if path else k
            if (k in a) != (k in b):
                return f"field {sub} is only in the {'file' if k in a else 'regeneration'}"
            d = _field_diff(a[k], b[k], sub)
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"field {path}: {len(a)} entries in the file, {len(b)} regenerated"
        return next((d for i, (x, y) in enumerate(zip(a, b))
                     if (d := _field_diff(x, y, f"{path}[{i}]"))), None)
    if a == b and type(a) is type(b):
        return None
    return f"field {path}: {_short(a)} in the file, {_short(b)} regenerated"


def first_difference(stem, fresh) -> str | None:
    """Where the fixture at `stem` differs from the freshly written one at `fresh`: the first
    manifest field (sha256 last), else the first tensor, else the bytes; None when both files
    are byte-identical."""
    from reference.memory_budget import DEFAULT_MAX_MEMORY
    files = {ext: [read_capped(f"{s}{ext}", DEFAULT_MAX_MEMORY, FixtureError, "fixture file")
                   if os.path.isfile(f"{s}{ext}") else None for s in (stem, fresh)]
             for ext in (".json", ".safetensors")}
    for ext, (old, _) in files.items():
        if old is None:
            return f"{stem}{ext} does not exist"
    if all(old == new for old, new in files.values()):
        return None
    try:
        m_old = parse_json(files[".json"][0], f"{stem}.json", FixtureError)
    except FixtureError as e:
        return f"{stem}.json is not a readable manifest ({e})"
    m_new = json.loads(files[".json"][1])
    strip = lambda m: {k: v for k, v in m.items() if k != "sha256"} if isinstance(m, dict) else m
    d = _field_diff(strip(m_old), strip(m_new), "")
    if d:
        return f"manifest {d}"
    try:
        t_old, _ = load_safetensors(f"{stem}.safetensors")
    except ParamsError as e:
        return f"{stem}.safetensors is not readable ({e})"
    t_new, _ = load_safetensors(f"{fresh}.safetensors")
    for name in sorted(set(t_old) | set(t_new)):
        if (name in t_old) != (name in t_new):
            return f"tensor {name!r} is only in the {'file' if name in t_old else 'regeneration'}"
        a, b = t_old[name], t_new[name]
        if a.dtype != b.dtype or a.shape != b.shape or _raw(a) != _raw(b):
            return f"tensor {name!r} differs"
    d = _field_diff(m_old.get("sha256") if isinstance(m_old, dict) else None,
                    m_new.get("sha256"), "sha256")
    if d:
        return f"manifest {d}"
    which = [ext for ext, (old, new) in files.items() if old != new]
    return (f"{stem}{which[0]}: same manifest fields and tensors, other bytes (the "
            f"{'JSON formatting' if which[0] == '.json' else 'safetensors framing or metadata'})")


def _need(m: dict, key: str, kind, where: str):
    from ladder.engine.archive import need_field
    return need_field(m, key, kind, where, FixtureError)


def _bounded(m: dict, key: str, lo: int, hi: int, where: str) -> int:
    v = _need(m, key, int, where)
    if not lo <= v <= hi:
        shown = str(v) if len(str(v)) <= 40 else f"{str(v)[:37]}..."
        raise FixtureError(f"{where}: manifest field {key}={shown} outside {lo}..{hi}")
    return v


def read_manifest(path) -> dict:
    """The manifest JSON: a regular file of at most MAX_MANIFEST bytes, bounded parse, every
    field typed (and the integers in range) before anything uses it."""
    path = os.fspath(path)
    raw = read_capped(path, MAX_MANIFEST, FixtureError, "manifest")
    m = parse_json(raw, path, FixtureError)
    if not isinstance(m, dict):
        raise FixtureError(f"{path}: manifest must be a JSON object")
    version = _need(m, "schema_version", int, path)
    if version != SCHEMA:
        raise FixtureError(f"{path}: field schema_version={version}; this reader knows {SCHEMA}")
    for key, kind in (("generator", str), ("torch_version", str), ("config", dict),
                      ("params", dict), ("seed", int), ("schedule", dict),
                      ("ladder_order", list), ("sha256", dict)):
        _need(m, key, kind, path)
    sch = m["schedule"]
    for key, kind in (("prompt_len", int), ("kv_window", int), ("tokens", list),
                      ("steps", list)):
        _need(sch, key, kind, f"{path}: schedule")
    # Ranges a run can honour; the config-dependent ones (window, length) are checked in load.
    _bounded(m, "seed", 0, SEED_MAX, path)
    _bounded(sch, "prompt_len", 1, MAX_INT, f"{path}: schedule")
    _bounded(sch, "kv_window", 0, MAX_INT, f"{path}: schedule")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in sch["tokens"]):
        raise FixtureError(f"{path}: field schedule.tokens must hold integers")
    return m


def load(stem, max_memory: int | None = None) -> Fixture:
    """Read and verify a fixture (FixtureError names what is wrong). Its geometry is checked
    against the memory budget (`max_memory`) before its tensors are read."""
    stem = os.fspath(stem)
    for ext in (".safetensors", ".json"):
        if stem.endswith(ext):
            stem = stem[:-len(ext)]
    js, st = f"{stem}.json", f"{stem}.safetensors"
    m = read_manifest(js)
    # Its role: the reference's values, as regen writes them; any other recording (another
    # generator, or a port's run) cannot stand in for the reference.
    for key, want in (("generator", GENERATOR), ("values", VALUES)):
        got = _need(m, key, str, js)
        if got != want:
            shown = json.dumps(got) if len(got) <= 100 else json.dumps(got[:97] + "...")
            raise FixtureError(f"{js}: field {key}={shown}, needs {want!r}: this fixture "
                               f"was not written by the reference's generator, so it cannot "
                               f"stand in for the reference (make one with `python -m ladder "
                               f"regen --out STEM`)")
    try:
        cfg = V2Config.from_file_fields(m["config"], None)
    except (ConfigError, TypeError, ValueError) as e:
        raise FixtureError(f"{js}: field config: {e}") from None
    check_memory(cfg, max_memory, f"{js}: field config", error=FixtureError)
    sch = m["schedule"]
    if len(sch["tokens"]) > cfg.max_seq_len:
        raise FixtureError(f"{js}: field schedule.tokens holds {len(sch['tokens'])} positions, "
                           f"more than max_seq_len={cfg.max_seq_len}")
    if sch["kv_window"] > cfg.max_seq_len:
        raise FixtureError(f"{js}: field schedule.kv_window={sch['kv_window']} exceeds "
                           f"max_seq_len={cfg.max_seq_len}")
    bad = [t for t in sch["tokens"] if not 0 <= t < cfg.vocab_size]
    if bad:
        raise FixtureError(f"{js}: field schedule.tokens holds id {bad[0]} outside "
                           f"0..vocab_size-1={cfg.vocab_size - 1}")
    try:
        steps = schedule(sch["tokens"], sch["prompt_len"])
    except ValueError as e:
        raise FixtureError(f"{js}: field schedule.prompt_len: {e}") from None
    want = [{"name": s.name, "pos": s.pos, "len": len(s.tokens)} for s in steps]
    if sch["steps"] != want:
        raise FixtureError(f"{js}: field schedule.steps does not match prompt_len and tokens")
    try:
        tensors, _ = load_safetensors(st, max_memory)   # framing checked before allocating
    except ParamsError as e:
        raise FixtureError(str(e)) from None
    names = set(tensors)
    if names != set(m["sha256"]):
        extra = sorted(names ^ set(m["sha256"]))[0]
        raise FixtureError(f"{st}: tensor {extra!r} is in only one of the file and the "
                           f"manifest's field sha256")
    order = m["ladder_order"]
    if {f"ladder/{k}" for k in order} | {"tokens"} != names or len(set(order)) != len(order):
        raise FixtureError(f"{js}: field ladder_order does not list the file's ladder tensors "
                           f"exactly once each")
    for name in sorted(tensors):
        if tensor_sha256(tensors[name]) != m["sha256"][name]:
            raise FixtureError(f"{st}: tensor {name!r} does not match its sha256 in {js}")
    if tensors["tokens"].tolist() != sch["tokens"]:
        raise FixtureError(f"{st}: tensor 'tokens' differs from field schedule.tokens")
    by_name = {s.name: s for s in steps}
    for key in order:
        step = key.split("/", 1)[0]
        t = tensors[f"ladder/{key}"]
        if step not in by_name or t.dtype != torch.float32 or t.dim() < 1 \
                or t.shape[0] != len(by_name[step].tokens):
            raise FixtureError(f"{st}: tensor 'ladder/{key}' is {t.dtype} {list(t.shape)}; "
                               f"needs float32 with a leading axis of its step's positions")
    ladder = Ladder(steps, {k: tensors[f"ladder/{k}"] for k in order}, "fixture")
    return Fixture(cfg, m, ladder, stem)


def check_geometry(fx: Fixture, cfg: V2Config) -> None:
    """Refuse a model whose config differs from the fixture's, naming the fields."""
    diff = fx.cfg.geometry_diff(cfg)
    if diff:
        f = diff[0]
        more = f" (and {', '.join(diff[1:])})" if diff[1:] else ""
        raise FixtureError(f"fixture {fx.path} was made for another geometry: field {f} is "
                           f"{getattr(fx.cfg, f)!r} in the fixture, {getattr(cfg, f)!r} in the "
                           f"model{more}")


def fixture_params(fx: Fixture, params=None) -> dict:
    """The fixture's parameters: rebuilt from the seed (source "init"), or the given dict,
    checked against the recorded digest either way."""
    src = fx.manifest["params"]
    if params is None:
        if src.get("source") != "init":
            raise FixtureError(f"{fx.path}: parameters came from {src.get('source')!r} "
                               f"{src.get('file', '')}; pass that file (--params / --cact)")
        _bounded(src, "seed", 0, SEED_MAX, f"{fx.path}.json: params")
        _need(src, "perturbed", bool, f"{fx.path}.json: params")
        params = init_params(fx.cfg, src["seed"], perturbed=src["perturbed"])
    digest = params_sha256(params)
    if digest != src.get("sha256"):
        raise FixtureError(f"{fx.path}: parameters' sha256 {digest[:12]}… differs from the "
                           f"manifest's params.sha256 {str(src.get('sha256'))[:12]}…: the "
                           f"parameters (or their initialisation) changed; regenerate")
    return params
