"""Name maps: another implementation's names and layout, mapped onto the point registry.

A small TOML file (the shipped ones: ladder/formats/maps/needle-rs.toml, ladder/formats/maps/upstream-jax.toml):

    [map]
    name = "needle-rs"
    captured = "last"          # "all": every position of a step; "last": its last only
    prefix = ""                # their keys are "{prefix}{step}/{point}"
    batch_row = -1             # >= 0: values carry a batch axis first; keep this row
    reshape = "registry"       # flat <-> shaped: reshape to the registry's shape when the
                               # element counts agree ("none": shapes must already agree)
    precision = "float32"      # what they compute in (docs/precision.md); below float32 the
                               # files are judged against a noise floor
    [steps]
    prefill = "prefill"        # their name of the prompt step
    decode = "decode{i}"       # their name of decode step i (0-based): "decode{i:02d}" pads

    [[points]]                 # their names -> the registry's, in forward order
    theirs = "L{layer}.{name}" # {layer}: digits; {name}: one of `names`
    ours = "L{layer}.{name}"
    names = ["hpre", "u"]
    positions_axis = 0         # the positions' axis after the batch row is taken

    [[ignored]]                # names they write that carry nothing new (never compared)
    theirs = ["L*.x_in"]
    why = "..."

    [[not_emitted]]            # registry points they do not write: "not compared", with why
    points = ["L*.nx"]         # fnmatch on the registry's names; {last} = the last layer
    why = "..."

A name of theirs that no `points` or `ignored` entry covers is an error naming it: a map never
drops a value silently. The file is read through the project's bounded TOML reader.
"""
from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field

from ladder.model.names import TraceError

MAX_MAP_FILE = 256 * 1024
MAX_ENTRIES = 256
MAX_PATTERN = 200
MAPS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "maps")
SHIPPED = ("needle-rs", "upstream-jax")


class NameMapError(ValueError):
    """A name map that is malformed, or a name it does not cover (names it)."""


@dataclass
class PointRule:
    theirs: str
    ours: str
    names: tuple
    positions_axis: int = 0
    regex: re.Pattern = field(default=None, repr=False)


@dataclass
class NameMap:
    name: str
    captured: str = "all"
    prefix: str = ""
    tokens: str = "tokens"          # the key of the token ids, in files that carry them
    batch_row: int = -1
    reshape: str = "registry"
    prefill: str = "prefill"
    decode: str = "decode{i}"
    points: list = field(default_factory=list)
    ignored: list = field(default_factory=list)        # (patterns, why)
    not_emitted: list = field(default_factory=list)    # (patterns, why)
    source: str = ""
    precision: object = None        # ladder.model.precision.Precision, when the map declares one

    def step_of(self, theirs: str):
        """("prefill", None) or ("decode", i) for their step name; None if it is neither."""
        if theirs == self.prefill:
            return "prefill", None
        m = _step_regex(self.decode).fullmatch(theirs)
        if m is None:
            return None
        return "decode", int(m.group("i"))

    def point_of(self, theirs: str):
        """(registry name, rule) for their point name; (None, why) when it is ignored;
        NameMapError when the map does not cover it."""
        for rule in self.points:
            m = rule.regex.fullmatch(theirs)
            if m is not None:
                d = m.groupdict()
                ours = rule.ours
                if "layer" in d:
                    ours = ours.replace("{layer}", f"{int(d['layer']):02d}")
                if "name" in d:
                    ours = ours.replace("{name}", d["name"])
                return ours, rule
        for patterns, why in self.ignored:
            if any(fnmatch.fnmatchcase(theirs, p) for p in patterns):
                return None, why
        raise NameMapError(f"name map {self.name!r} ({self.source}) does not cover the point "
                           f"{theirs!r}: add it to [[points]] or [[ignored]]")

    def why_not_emitted(self, ours: str, num_layers: int):
        last = f"{num_layers - 1:02d}"
        for patterns, why in self.not_emitted:
            if any(fnmatch.fnmatchcase(ours, p.replace("{last}", last)) for p in patterns):
                return why
        return None


def _step_regex(pattern: str) -> re.Pattern:
    i = pattern.find("{i")
    j = pattern.find("}", i)
    if i < 0 or j < 0:
        raise NameMapError(f"[steps] decode={pattern!r} must contain {{i}} (the step index)")
    return re.compile(re.escape(pattern[:i]) + r"(?P<i>\d{1,6})" + re.escape(pattern[j + 1:]))


def _point_regex(theirs: str, names: tuple) -> re.Pattern:
    out, rest = "", theirs
    while rest:
        k = min([x for x in (rest.find("{layer}"), rest.find("{name}")) if x >= 0], default=-1)
        if k < 0:
            out += re.escape(rest)
            break
        out += re.escape(rest[:k])
        if rest.startswith("{layer}", k):
            out += r"(?P<layer>\d{1,2})"
            rest = rest[k + len("{layer}"):]
        else:
            out += "(?P<name>" + "|".join(re.escape(n) for n in names) + ")"
            rest = rest[k + len("{name}"):]
    return re.compile(out)


def _str(d, key, where, default=None) -> str:
    v = d.get(key, default)
    if not isinstance(v, str) or len(v) > MAX_PATTERN:
        raise NameMapError(f"{where}: field {key} must be a string of at most {MAX_PATTERN} "
                           f"characters")
    return v


def _patterns(v, where) -> tuple:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or len(v) > MAX_ENTRIES or \
            not all(isinstance(p, str) and 0 < len(p) <= MAX_PATTERN for p in v):
        raise NameMapError(f"{where} must be a list of 1..{MAX_ENTRIES} strings of at most "
                           f"{MAX_PATTERN} characters")
    return tuple(v)


_DTYPE_WORD = re.compile(r"[A-Za-z0-9]{1,16}")


def _precision(spec, where: str):
    """The map's precision: a declaration string, or a table whose every field is one dtype
    word (a table value "bfloat16,kv=int8" would carry a second declaration in one field).
    Every refusal names the map file, the cache-wider-than-activations one included (the
    precision module raises that one without knowing where the declaration came from)."""
    from ladder.model.precision import Precision, PrecisionError
    if isinstance(spec, dict):
        for key, v in spec.items():
            if not isinstance(v, str) or not _DTYPE_WORD.fullmatch(v):
                raise NameMapError(f"{where}: field {str(key)[:40]}={repr(v)[:40]} must be "
                                   f"one dtype word (e.g. \"bfloat16\", \"int8\"); write the "
                                   f"other parts as their own fields")
    try:
        return Precision.parse(spec, where)
    except PrecisionError as e:
        msg = str(e)
        if not msg.startswith(where):
            msg = f"{where}: {msg.removeprefix('precision: ')}"
        raise NameMapError(msg) from None


def from_dict(data: dict, source: str = "<dict>") -> NameMap:
    if not isinstance(data, dict) or not isinstance(data.get("map"), dict):
        raise NameMapError(f"{source}: a name map needs a [map] table")
    known = {"map", "steps", "points", "ignored", "not_emitted"}
    extra = sorted(set(data) - known)
    if extra:
        raise NameMapError(f"{source}: unknown table {extra[0]!r}; known: {sorted(known)}")
    head, steps = data["map"], data.get("steps", {})
    for key in head:
        if key not in ("name", "captured", "prefix", "batch_row", "reshape", "describes",
                       "tokens", "precision"):
            raise NameMapError(f"{source}: [map] has unknown field {key!r}")
    nm = NameMap(name=_str(head, "name", f"{source}: [map]"), source=source)
    nm.captured = _str(head, "captured", f"{source}: [map]", "all")
    if nm.captured not in ("all", "last"):
        raise NameMapError(f"{source}: [map] captured={nm.captured!r}; one of 'all', 'last'")
    nm.prefix = _str(head, "prefix", f"{source}: [map]", "")
    nm.tokens = _str(head, "tokens", f"{source}: [map]", "tokens")
    if "precision" in head:
        nm.precision = _precision(head["precision"], f"{source}: [map] precision")
    row = head.get("batch_row", -1)
    if isinstance(row, bool) or not isinstance(row, int) or not -1 <= row < 1 << 16:
        raise NameMapError(f"{source}: [map] batch_row={row!r} must be an integer in -1..65535")
    nm.batch_row = row
    nm.reshape = _str(head, "reshape", f"{source}: [map]", "registry")
    if nm.reshape not in ("registry", "none"):
        raise NameMapError(f"{source}: [map] reshape={nm.reshape!r}; one of 'registry', 'none'")
    if not isinstance(steps, dict) or set(steps) - {"prefill", "decode"}:
        raise NameMapError(f"{source}: [steps] holds only prefill and decode")
    nm.prefill = _str(steps, "prefill", f"{source}: [steps]", "prefill")
    nm.decode = _str(steps, "decode", f"{source}: [steps]", "decode{i}")
    _step_regex(nm.decode)
    for key in ("points", "ignored", "not_emitted"):
        v = data.get(key, [])
        if not isinstance(v, list) or len(v) > MAX_ENTRIES or not all(isinstance(e, dict)
                                                                      for e in v):
            raise NameMapError(f"{source}: [[{key}]] must be at most {MAX_ENTRIES} tables")
    for i, e in enumerate(data.get("points", [])):
        where = f"{source}: [[points]] #{i + 1}"
        names = _patterns(e.get("names", ["-"]), f"{where} field names")
        axis = e.get("positions_axis", 0)
        if isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis <= 7:
            raise NameMapError(f"{where}: field positions_axis={axis!r} must be 0..7")
        theirs, ours = _str(e, "theirs", where), _str(e, "ours", where)
        nm.points.append(PointRule(theirs, ours, names, axis, _point_regex(theirs, names)))
    for key, dest, pkey in (("ignored", nm.ignored, "theirs"),
                            ("not_emitted", nm.not_emitted, "points")):
        for i, e in enumerate(data.get(key, [])):
            where = f"{source}: [[{key}]] #{i + 1}"
            dest.append((_patterns(e.get(pkey), f"{where} field {pkey}"), _str(e, "why", where)))
    return nm


def load_map(spec) -> NameMap:
    """A shipped map by name (`needle-rs`, `upstream-jax`) or a TOML file."""
    from bounded.io import parse_toml, read_capped
    spec = os.fspath(spec)
    path = os.path.join(MAPS_DIR, f"{spec}.toml") if spec in SHIPPED else spec
    raw = read_capped(path, MAX_MAP_FILE, NameMapError, "name map")
    return from_dict(parse_toml(raw, path, NameMapError), path)


def registry_shape(point: str, geometry):
    """The registry's one-position shape of `point` for this geometry (None if unknown)."""
    from ladder.model.names import layer_of
    from ladder.model.points import BY_NAME
    layer = layer_of(point)
    base = point.split(".", 1)[1] if layer is not None else point.rstrip("0123456789")
    p = BY_NAME.get(base) or BY_NAME.get(point)
    return None if p is None else tuple(p.shape(geometry))


def shape_value(value, point: str, geometry, nm: NameMap, where: str):
    """`value` [P, ...] reshaped to the registry's [P, *shape] (flat <-> shaped)."""
    if geometry is None or nm.reshape == "none":
        return value
    want = registry_shape(point, geometry)
    if want is None:
        return value
    n = 1
    for d in want:
        n *= d
    if tuple(value.shape[1:]) == want:
        return value
    if value[0].numel() != n:
        raise TraceError(f"{where}: {point} holds {list(value.shape[1:])} per position, the "
                         f"registry's {list(want)} ({n} values)")
    return value.reshape(value.shape[0], *want)
