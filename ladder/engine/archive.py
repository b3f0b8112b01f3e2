"""Trace archives: a whole ladder in one safetensors file that any implementation can write.

Why safetensors: every ecosystem a port lives in writes it with its own library (Rust's
`safetensors` crate, C++'s, `safetensors.numpy` from JAX), it holds no code (no pickle), and
its header is plain JSON, so a reader can check every declared size before allocating.

Layout (format "needle-parity-trace", schema_version 2; version 1 is read too, as a float32
producer; README "Bring your own port"):

- one tensor per recorded value, keyed `{step}/{point}` (`prefill/embed`, `decode03/L07.y`),
  point names as the registry spells them (ladder/model/points.py); the leading axis is the
  positions captured: every position of the step (`captured = "all"`) or only its last
  (`"last"`); float32, float64, float16 or bfloat16 (the two halves are widened to float32
  on reading, and the manifest says so), int64 for index points;
- the manifest: one JSON string in the safetensors metadata under `needle_parity_trace`:

      format, schema_version
      producer     {name, version, backend, device, dtype, precision} and keys of the
                   producer's own starting "x-" (any other key is refused); precision (version
                   2) is what the producer computes in, in ladder/model/precision.py's
                   syntax ("bfloat16", "float32,kv=int8", "act=float16,weights=cq,kv=int8"):
                   a side below float32 is judged against a noise floor (docs/precision.md)
      geometry     {d_model, num_heads, num_kv_heads, num_layers, head_dim, mhc_lanes,
                    engram_layers, engram_orders, rope_theta, vocab_size}
      kv_window    the attention window the run used (0: the model's KV budget, as
                   upstream's effective_kv_window; 0 .. 2^31 - 1)
      weights      {source, file, sha256 (of the weights file's bytes), params_sha256}
      schedule     {tokens, prompt_len, steps: [{name, pos, len}]}; when the steps are one
                   run from position 0, prompt_len is the first step's len
      argmax       {step: argmax of its last position's logits}
      captured     "all" | "last"
      points       point names in forward order
      not_emitted  {point (every step) or step/point: why it is absent}
      leading_axis "positions" (default) or "free" (V4.1: the point's own first axis)

The reader refuses anything else with ArchiveError naming the field (or tensor) and the
limit, what a run can use included (MAX_POSITIONS, MAX_CELLS), and a step with no tensor.
The comparison engine needs only `Ladder`; nothing here knows the model.
"""
from __future__ import annotations

import json
import os

import torch

from bounded.io import open_regular
from bounded.safetensors import ST_DTYPES, load_safetensors, read_header, write_safetensors
from bounded.size import DEFAULT_MAX_MEMORY
from ladder.engine.lazy_values import LazyValues
from ladder.engine.steps import CAPTURED, Step, schedule
from ladder.model.precision import FLOAT32, Precision, PrecisionError

FORMAT = "needle-parity-trace"
SCHEMA = 2
SCHEMAS = (1, 2)            # version 1: no producer.precision (a float32 producer)
META_KEY = "needle_parity_trace"
MAX_STEPS = 1 << 16
MAX_POINTS = 1 << 16
# What one run can use, whatever a file declares: positions (a model holds max_seq_len; needle
# v2's is 2048, DeepSeek's longest context 2^20) and (step, point) cells, each a value or a
# "not emitted" entry built before any comparison (shipped: 2048 steps x 550 points = 1.1M).
MAX_POSITIONS = 1 << 20
MAX_CELLS = 1 << 21
MAX_NAME = 200                      # characters of a step or point name
MAX_TOKEN = 1 << 31
PRODUCER_KEYS = ("name", "version", "backend", "device", "dtype", "precision")
FREE_KEY = "x-"                     # producer keys of the producer's own: x-git-sha, ...
# "positions": a value's leading axis is the positions captured (needle v2); "free": the
# producer's own layout (V4.1's points, e.g. the compressed rows a call publishes)
LEADING_AXES = ("positions", "free")
# int64: index points (V4.1's selected rows), compared exactly by the engine
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64)


class ArchiveError(ValueError):
    """A trace archive that is malformed, hostile or inconsistent (names the field)."""


def _argmax(ladder: Ladder) -> dict:
    out = {}
    for st in ladder.steps:
        key = f"{st.name}/logits"
        if key in ladder.values and ladder.values[key].numel():
            out[st.name] = int(torch.argmax(ladder.values[key][-1].reshape(-1)))
    return out


def manifest_for(ladder: Ladder, *, producer: dict, geometry: dict, kv_window: int,
                 weights: dict, prompt_len: int, not_emitted: dict | None = None,
                 points: list | None = None, leading_axis: str = "positions") -> dict:
    """The manifest of `ladder` (the fields above); `not_emitted` adds to `ladder.hidden`;
    `points` names them for a writer that fills the values later (needle_trace)."""
    points = list(points or [])
    for key in ladder.values:
        p = key.split("/", 1)[1]
        if p not in points:
            points.append(p)
    missing = dict(not_emitted or {})
    missing.update(ladder.hidden)
    return {
        "format": FORMAT, "schema_version": SCHEMA,
        "producer": {**{k: str(producer.get(k, "")) for k in
                        ("name", "version", "backend", "device", "dtype")},
                     "precision": Precision.parse(producer.get("precision", FLOAT32)).text()},
        "geometry": dict(geometry), "kv_window": int(kv_window),
        "weights": {k: weights.get(k) for k in ("source", "file", "sha256", "params_sha256")},
        "schedule": {"tokens": [int(t) for t in ladder.tokens], "prompt_len": int(prompt_len),
                     "steps": [{"name": s.name, "pos": s.pos, "len": len(s.tokens)}
                               for s in ladder.steps]},
        "argmax": _argmax(ladder), "captured": ladder.captured, "points": points,
        "not_emitted": missing, "leading_axis": leading_axis,
    }


def save(ladder: Ladder, path, **manifest) -> str:
    """Write `ladder` to `path` (a temp file renamed into place: all or nothing)."""
    path = os.fspath(path)
    if not path or os.path.basename(path) in ("", ".", ".."):
        raise ArchiveError(f"archive path {path!r} names no file")
    m = manifest_for(ladder, **manifest)
    tensors = {k: v.detach().cpu().contiguous() for k, v in ladder.values.items()}
    import tempfile
    from ladder.engine.atomic import current_umask
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    # A fresh temporary name per writer (two processes saving one path, as xdist workers
    # regenerating one golden file can, must not share it); mkstemp's 0600 widened to what
    # open() would give.
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        os.close(fd)
        write_safetensors(tmp, tensors, metadata={META_KEY: json.dumps(m, sort_keys=True)})
        # mkstemp made the file 0600: widen it to what open() would have given
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def need_field(d, key, kind, where, error=None):
    """d[key] of type `kind` (a bool is no int), or `error` (default ArchiveError) naming it."""
    error = error or ArchiveError
    if not isinstance(d, dict) or key not in d:
        raise error(f"{where}: manifest lacks field {key!r}")
    v = d[key]
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise error(f"{where}: manifest field {key!r} is {type(v).__name__}, needs "
                    f"{getattr(kind, '__name__', str(kind))}")
    return v


_need = need_field


def _name(v, what, where) -> str:
    if not isinstance(v, str) or not 0 < len(v) <= MAX_NAME or "/" in v:
        raise ArchiveError(f"{where}: {what} {str(v)[:40]!r} must be a string of 1..{MAX_NAME} "
                           f"characters without '/'")
    return v


def parse_manifest(text, where: str) -> dict:
    """The manifest's JSON, every field typed and bounded; steps checked against the tokens."""
    from bounded.io import parse_json      # the project's bounded JSON reader
    m = parse_json(text, f"{where}: metadata {META_KEY}", ArchiveError)
    if not isinstance(m, dict):
        raise ArchiveError(f"{where}: manifest must be a JSON object")
    if m.get("format") != FORMAT:
        raise ArchiveError(f"{where}: field format={str(m.get('format'))[:40]!r}; this reader "
                           f"knows {FORMAT!r}")
    if _need(m, "schema_version", int, where) not in SCHEMAS:
        raise ArchiveError(f"{where}: field schema_version={m['schema_version']}; this reader "
                           f"knows {', '.join(map(str, SCHEMAS))}")
    for key, kind in (("producer", dict), ("geometry", dict), ("kv_window", int),
                      ("weights", dict), ("schedule", dict), ("argmax", dict),
                      ("captured", str), ("points", list), ("not_emitted", dict)):
        _need(m, key, kind, where)
    for k, v in m["producer"].items():
        if k not in PRODUCER_KEYS and not str(k).startswith(FREE_KEY):
            # a misspelt key (precision2) would leave the side judged at float32 in silence
            raise ArchiveError(f"{where}: field producer.{str(k)[:40]} is not a producer field "
                               f"(known: {', '.join(PRODUCER_KEYS)}; a key of your own starts "
                               f"with {FREE_KEY!r})")
        if not (v is None or isinstance(v, str)):      # printed as the side's label
            raise ArchiveError(f"{where}: field producer.{str(k)[:40]} must be a string, not "
                               f"{type(v).__name__}")
    prec = m["producer"].get("precision")
    if m["schema_version"] >= 2 and prec is None:
        raise ArchiveError(f"{where}: field producer.precision is missing; schema_version 2 "
                           f"declares what the producer computes in (e.g. \"float32\", "
                           f"\"bfloat16,kv=int8\")")
    try:
        m["precision"] = FLOAT32 if prec is None else Precision.parse(prec)
    except PrecisionError as e:
        raise ArchiveError(f"{where}: field producer.precision: {e}") from None
    if m["captured"] not in CAPTURED:
        raise ArchiveError(f"{where}: field captured={m['captured'][:20]!r}; one of {CAPTURED}")
    m.setdefault("leading_axis", "positions")
    if m["leading_axis"] not in LEADING_AXES:
        raise ArchiveError(f"{where}: field leading_axis={str(m['leading_axis'])[:20]!r}; one "
                           f"of {LEADING_AXES}")
    sch = m["schedule"]
    tokens = _need(sch, "tokens", list, f"{where}: schedule")
    if len(tokens) > MAX_POSITIONS:
        raise ArchiveError(f"{where}: field schedule.tokens holds {len(tokens)} ids; limit "
                           f"{MAX_POSITIONS} positions (MAX_POSITIONS)")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < MAX_TOKEN
               for t in tokens):
        raise ArchiveError(f"{where}: field schedule.tokens must hold integers in "
                           f"0..{MAX_TOKEN - 1}")
    prompt_len = _need(sch, "prompt_len", int, f"{where}: schedule")
    if not 0 <= prompt_len <= len(tokens):
        raise ArchiveError(f"{where}: field schedule.prompt_len={prompt_len} outside "
                           f"0..{len(tokens)} (the tokens)")
    if not 0 <= m["kv_window"] < MAX_TOKEN:
        raise ArchiveError(f"{where}: field kv_window={m['kv_window']} outside "
                           f"0..{MAX_TOKEN - 1} (0: the model's KV budget)")
    steps = _need(sch, "steps", list, f"{where}: schedule")
    if not 1 <= len(steps) <= MAX_STEPS:
        raise ArchiveError(f"{where}: field schedule.steps holds {len(steps)} steps; needs "
                           f"1..{MAX_STEPS}")
    # A step takes the next `len` tokens; its first position is `pos` (a run restarted at 0,
    # as V4.1's scenarios are, has steps that do not continue one another).
    out, used = [], 0
    for i, s in enumerate(steps):
        at = f"{where}: schedule.steps[{i}]"
        name = _name(_need(s, "name", str, at), "step name", at)
        pos = _need(s, "pos", int, at)
        if not 0 <= pos < MAX_POSITIONS:
            raise ArchiveError(f"{at}: field pos={pos} outside 0..{MAX_POSITIONS - 1} "
                               f"(MAX_POSITIONS)")
        n = _need(s, "len", int, at)
        if not 1 <= n <= len(tokens) - used:
            raise ArchiveError(f"{at}: field len={n} must lie in 1..{len(tokens) - used} "
                               f"(the tokens left)")
        if pos + n > MAX_POSITIONS:
            raise ArchiveError(f"{at}: field pos={pos} + len={n} runs past position "
                               f"{MAX_POSITIONS - 1} (MAX_POSITIONS)")
        out.append(Step(name, pos, tuple(tokens[used:used + n])))
        used += n
    if used != len(tokens) or len({s.name for s in out}) != len(out):
        raise ArchiveError(f"{where}: field schedule.steps must cover the {len(tokens)} tokens "
                           f"once, with distinct names")
    one_run = all(s.pos == (0 if i == 0 else out[i - 1].pos + len(out[i - 1].tokens))
                  for i, s in enumerate(out))
    if one_run and prompt_len != len(out[0].tokens):
        # one run from position 0: its first step is the prompt, and the reference replays
        # the schedule from prompt_len
        raise ArchiveError(f"{where}: field schedule.prompt_len={prompt_len} contradicts "
                           f"schedule.steps[0] ({out[0].name!r}, {len(out[0].tokens)} tokens "
                           f"from position 0): a run's first step is its prompt")
    if len(m["points"]) > MAX_POINTS:
        raise ArchiveError(f"{where}: field points must list at most {MAX_POINTS} distinct names")
    for p in m["points"]:                    # each a name before the set below hashes them
        _name(p, "point name", f"{where}: points")
    if len(set(m["points"])) != len(m["points"]):
        raise ArchiveError(f"{where}: field points must list at most {MAX_POINTS} distinct names")
    for k, why in m["not_emitted"].items():
        if not isinstance(why, str):
            raise ArchiveError(f"{where}: field not_emitted[{k[:40]!r}] must be a string")
    # a step-free not_emitted entry stands for that point at every step (read() expands it)
    per_step = len(m["points"]) + sum("/" not in k for k in m["not_emitted"])
    cells = len(out) * per_step + len(m["not_emitted"])
    if cells > MAX_CELLS:
        raise ArchiveError(f"{where}: fields schedule.steps ({len(out)}) x points and "
                           f"not_emitted ({per_step}) declare {cells} (step, point) cells; "
                           f"limit {MAX_CELLS} (MAX_CELLS)")
    m["_steps"] = out
    return m


def _listing(names, most: int = 6) -> str:
    names = list(names)
    more = f", ... ({len(names)} in all)" if len(names) > most else ""
    return ", ".join(repr(n) for n in names[:most]) + more


def _bad_key(where, key, step, point, by_step, order) -> str:
    """Which half of a tensor's '{step}/{point}' key is wrong, with the allowed values."""
    if "/" not in key:
        return (f"{where}: tensor {key[:80]!r} is not '{{step}}/{{point}}' (no '/'); steps: "
                f"{_listing(by_step)}")
    if step not in by_step:
        return (f"{where}: tensor {key[:80]!r}: step {step[:40]!r} is not one of "
                f"schedule.steps' names ({_listing(by_step)})")
    return (f"{where}: tensor {key[:80]!r}: point {point[:60]!r} is not one of field points "
            f"({_listing(order)})")


def _canonical_step_names(steps, infos, m):
    """Steps are matched by position and tokens, not by spelling: an archive whose schedule
    is one prefill then one-token decode steps, named otherwise (`decode0` for `decode00`),
    is read under the names our side uses (trace.schedule), and the renaming is recorded in
    the manifest (`renamed_steps`, theirs -> ours) for the CLI to print."""
    from ladder.model.names import TraceError
    tokens = [t for s in steps for t in s.tokens]
    try:
        ours = schedule(tokens, m["schedule"]["prompt_len"])
    except TraceError:                   # prompt_len outside the tokens: not this layout
        return steps, infos, {}
    if [(s.pos, s.tokens) for s in ours] != [(s.pos, s.tokens) for s in steps] or \
            all(a.name == b.name for a, b in zip(steps, ours)):
        return steps, infos, {}
    rename = {a.name: b.name for a, b in zip(steps, ours) if a.name != b.name}
    new_infos = {}
    for key, info in infos.items():
        step, _, point = key.partition("/")
        new_infos[f"{rename.get(step, step)}/{point}"] = info
    not_emitted = {}
    for k, why in m["not_emitted"].items():
        step, sep, point = k.partition("/")
        not_emitted[f"{rename.get(step, step)}/{point}" if sep else k] = why
    m["not_emitted"] = not_emitted
    m["argmax"] = {rename.get(k, k): v for k, v in m["argmax"].items()}
    return ours, new_infos, rename


def read(path, max_memory: int | None = None, lazy: bool = False) -> tuple:
    """A trace archive as the fields of a Ladder (steps, values, label, hidden, captured,
    meta): `Ladder.load` builds it; `meta` holds the manifest. The file is framed and every
    tensor's size checked against the memory budget before anything is allocated. `lazy`: the
    values stay in the file and are read step by step as they are used (LazyValues)."""
    where = os.fspath(path)
    budget = DEFAULT_MAX_MEMORY if max_memory is None else max_memory
    tensors, f = None, None
    try:
        if lazy:
            f, size = open_regular(path, budget, ArchiveError, "trace archive")
            header, data_start = read_header(f, size, where, ArchiveError)
            meta = dict(header.get("__metadata__", {}))
            infos = {k: (ST_DTYPES[v["dtype"]][0], list(v["shape"]), *v["data_offsets"])
                     for k, v in header.items() if k != "__metadata__"}
        else:
            tensors, meta = load_safetensors(path, budget, error=ArchiveError)
            infos = {k: (t.dtype, list(t.shape), 0, 0) for k, t in tensors.items()}
    except ArchiveError:
        if f is not None:
            f.close()
        raise
    try:
        return _assemble(where, meta, infos, tensors, f, data_start if lazy else 0, lazy)
    except BaseException:
        if f is not None:         # a refused file leaves no open handle behind
            f.close()
        raise


def _assemble(where, meta, infos, tensors, f, data_start, lazy) -> tuple:
    """read()'s manifest checked against the file's tensors, and the Ladder's fields."""
    if META_KEY not in meta:
        raise ArchiveError(f"{where}: safetensors metadata lacks {META_KEY!r}: not a "
                           f"needle-parity trace archive")
    m = parse_manifest(meta[META_KEY], where)
    steps = m.pop("_steps")
    by_step = {s.name: s for s in steps}
    order = {p: i for i, p in enumerate(m["points"])}
    for key in infos:
        step, _, point = key.partition("/")
        if step not in by_step or point not in order:
            raise ArchiveError(_bad_key(where, key, step, point, by_step, order))
    steps, infos, m["renamed_steps"] = _canonical_step_names(steps, infos, m)
    keys, upcast = [], []
    for st in steps:
        rows = 1 if m["captured"] == "last" else len(st.tokens)
        for point in m["points"]:
            key = f"{st.name}/{point}"
            if key not in infos:
                continue
            dtype, shape = infos[key][:2]
            free = m["leading_axis"] == "free"
            if dtype not in _DTYPES:
                raise ArchiveError(f"{where}: tensor {key!r} is {dtype}; needs float32, "
                                   f"float64, float16, bfloat16 or int64")
            if len(shape) < 1 or (shape[0] != rows and not free):
                # say which: a step's positions, or "last" that a writer forgot to state
                held = "no axis" if not shape else f"a leading axis of {shape[0]}"
                raise ArchiveError(
                    f"{where}: tensor {key!r} has shape {shape} ({held}); field captured="
                    f"{m['captured']!r} needs a leading axis of {rows} position(s) for step "
                    f"{st.name!r}" + (" (its last position only: captured=\"last\")"
                                      if m["captured"] == "last" else
                                      "; a last-position-only dump says captured=\"last\""
                                      if shape and shape[0] == 1 else ""))
            if dtype in (torch.float16, torch.bfloat16):
                upcast.append(key)
            keys.append(key)
    hidden = {}
    for k, why in m["not_emitted"].items():
        if "/" in k:
            hidden[k] = why
        else:
            hidden.update({f"{s.name}/{k}": why for s in steps if f"{s.name}/{k}" not in infos})
    held = {k.partition("/")[0] for k in keys}
    for i, st in enumerate(steps):
        # a listed step with no tensor and no declaration is a file a writer cut short, not a
        # port whose every point diverges
        if st.name not in held and any(f"{st.name}/{p}" not in hidden for p in m["points"]):
            name = {b: a for a, b in m["renamed_steps"].items()}.get(st.name, st.name)
            raise ArchiveError(f"{where}: schedule.steps[{i}] {name!r} has none of its tensors "
                               f"(no '{name}/...' key of the {len(m['points'])} in field "
                               f"points, and not_emitted does not declare them)")
    if lazy:
        values = LazyValues(f, where, infos, data_start, keys, error=ArchiveError)
    else:
        values = {k: tensors[k].float() if k in upcast else tensors[k] for k in keys}
    m["upcast"] = upcast
    prod = m["producer"]
    label = " ".join(x for x in (prod.get("name"), prod.get("backend")) if x) or where
    return steps, values, label, hidden, m["captured"], m
