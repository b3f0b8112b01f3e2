"""One tolerance rule and a set of them: the types the rule tables are written in.

A `Rule` bounds |a - b| per point (docs/rules.md); `LogitsRule` holds the logits checks;
`RuleSet` bundles point rules (pattern -> Rule, first match wins) with those checks and the
relative-error floor; `CountBound` bounds a count of tolerated events. The tables themselves
are in rule_tables.py; reading and writing rules files in rules.py.
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import asdict, dataclass, field

import torch

SCALES = ("maxabs", "elementwise")
STATS = ("max", "p99")
MAX_RULES_FILE = 1024 * 1024        # a rules file is a few hundred bytes; refuse anything huge
# Largest rtol/atol/tie_factor: 1000 already passes any comparison, and a bound keeps the KL
# bound (allowance^2 / 2, in float64) finite for every float32 logit scale.
MAX_TOLERANCE = 1e3
MAX_RULES = 512      # patterns in one rules file (the defaults have a few dozen)
MAX_PATTERN = 256    # characters in one pattern (a point name is under 64)
COMPARED_SIDES = ("port", "arbiter")   # point-name prefixes the ladder compares (compare.py)
V41_SIDES = ("v41_official", "v41_port")  # the same for --model attn_v41 (ladder/v41/cli.py)


class RulesError(ValueError):
    """A rule or rules file that cannot be used (names the field, its value and the limit)."""


class UncoveredPointError(RulesError, KeyError):
    """No pattern matches a point (a KeyError for callers that look rules up like a dict)."""

    __str__ = ValueError.__str__


def _finite_nonneg(owner: str, name: str, value, limit: float = MAX_TOLERANCE) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not (isinstance(value, float) or abs(value) <= 2 ** 53) \
            or not math.isfinite(value) or not 0 <= value <= limit:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise RulesError(f"{owner}: field {name}={shown} must be a finite number in "
                         f"0..{limit:g}")
    return float(value)


def by_position(t):
    """[S, ...] -> [S, N] (N may be 0: a point with no values at some step, e.g. no rows yet)."""
    n = 1
    for d in t.shape[1:]:
        n *= d
    return t.reshape(t.shape[0], n)


_by_position = by_position


@dataclass(frozen=True)
class Rule:
    rtol: float
    atol: float = 0.0
    scale: str = "maxabs"          # "maxabs" | "elementwise"
    why: str = ""
    stat: str = "max"              # "max" | "p99"
    floor: float = 0.0             # the allowance never drops below this (zero references)
    exact: bool = False            # equality only (index tensors): any difference fails
    # noise units: the allowance is at least `noise` x the noise floor's own error at the
    # position (docs/precision.md); needs a noise-floor ladder beside the reference
    noise: float = 0.0

    def __post_init__(self):
        _finite_nonneg("Rule", "rtol", self.rtol)
        _finite_nonneg("Rule", "atol", self.atol)
        _finite_nonneg("Rule", "floor", self.floor)
        _finite_nonneg("Rule", "noise", self.noise)
        if not isinstance(self.exact, bool):
            raise RulesError(f"Rule: field exact={self.exact!r} must be true or false")
        if self.exact and self.noise:
            raise RulesError(f"Rule: an exact rule allows nothing; noise={self.noise} must be 0")
        if self.exact and (self.rtol or self.atol):
            raise RulesError(f"Rule: an exact rule allows nothing; rtol={self.rtol} and "
                             f"atol={self.atol} must be 0")
        if self.exact and self.floor:
            raise RulesError(f"Rule: an exact rule allows nothing; floor={self.floor} must be 0")
        if self.scale not in SCALES:
            raise RulesError(f"Rule: field scale={self.scale!r} must be one of {SCALES}")
        if self.stat not in STATS:
            raise RulesError(f"Rule: field stat={self.stat!r} must be one of {STATS}")

    def allowance(self, scale):
        """atol + rtol·scale, never below `floor` (scale: a float or a float64 tensor)."""
        allow = self.atol + self.rtol * scale
        if isinstance(allow, torch.Tensor):
            return allow.clamp_min(self.floor)
        return max(allow, self.floor)

    def ratios(self, a, b):
        """|a - b| / allowance per element, float64 (inf where the allowance is 0 and a != b)."""
        a, b = a.double(), b.double()
        diff = (a - b).abs()
        if self.scale == "maxabs":
            allow = self.allowance(float(b.abs().max()) if b.numel() else 0.0)
            allow = torch.full_like(diff, allow)
        else:
            allow = self.allowance(b.abs())
        return torch.where(allow > 0, diff / allow.clamp_min(1e-300),
                           torch.where(diff == 0, 0.0, float("inf")))

    def error(self, a, b) -> float:
        """The statistic this rule bounds, as a fraction of its allowance (pass: <= 1)."""
        if self.exact:
            return 0.0 if torch.equal(a, b) else float("inf")
        a, b = a.double(), b.double()
        if not torch.isfinite(a).all() or not torch.isfinite(b).all():
            return float("inf")
        if not b.numel():
            return 0.0
        if self.stat == "max" and self.scale == "maxabs":
            diff = (a - b).abs()
            allow = self.allowance(float(b.abs().max()))
            worst = float(diff.max())
            return worst / allow if allow > 0 else (0.0 if worst == 0 else float("inf"))
        r = self.ratios(a, b).reshape(-1)
        if self.stat == "p99":
            return float(torch.quantile(r, 0.99)) if r.numel() > 1 else float(r.max())
        return float(r.max())

    def check(self, a, b) -> bool:
        return self.error(a, b) <= 1.0

    def position_ratios(self, a, b, units=None):
        """`ratios` of each slice a[j], b[j] along the leading (position) axis, as [S, N];
        every element of a slice holding a NaN/Inf reads inf, as `error` does. A noise-unit
        rule also allows `noise` x units[j] at position j (noise_units, float64 [S])."""
        if self.exact:            # compared in their own dtype: no rounding through float64
            a, b = _by_position(a), _by_position(b)
            return torch.where(a == b, 0.0, float("inf")).double()
        a, b = _by_position(a.double()), _by_position(b.double())
        diff = (a - b).abs()
        if self.scale == "maxabs":
            top = b.abs().amax(1, keepdim=True) if b.shape[1] else b.new_zeros(b.shape[0], 1)
            allow = self.allowance(top).expand_as(diff)
        else:
            allow = self.allowance(b.abs())
        if self.noise:
            if units is None:
                raise RulesError(f"a noise-unit rule ({self.describe()}) needs the noise-floor "
                                 f"reference: declare the side's precision (--port-precision)")
            allow = torch.maximum(allow, self.noise * units.to(allow.dtype)[:, None])
        r = torch.where(allow > 0, diff / allow.clamp_min(1e-300),
                        torch.where(diff == 0, 0.0, float("inf")))
        finite = (torch.isfinite(a) & torch.isfinite(b)).all(1, keepdim=True)
        return torch.where(finite, r, float("inf"))

    def position_errors(self, a, b, ratios=None, units=None):
        """[error(a[j], b[j]) for each position j] in one vectorised pass, as a list
        (`ratios`: position_ratios(a, b) when the caller already has them)."""
        r = self.position_ratios(a, b, units) if ratios is None else ratios
        if not r.shape[1]:
            return [0.0] * r.shape[0]
        if self.stat == "p99" and r.shape[1] > 1:
            return torch.quantile(r, 0.99, dim=1).tolist()
        return r.amax(1).tolist()

    def describe(self) -> str:
        if self.exact:
            return "exact (torch.equal)"
        s = f"{self.noise:g}x floor, " if self.noise else ""
        s += f"rtol {self.rtol:.1e}"
        if self.atol:
            s += f" atol {self.atol:.1e}"
        if self.floor:
            s += f" floor {self.floor:.0e}"
        return s + f" {self.scale}" + ("" if self.stat == "max" else f" {self.stat}")


def noise_units(floor, b, unit_eps: float = 0.0, prior: float = 0.0):
    """The noise unit at each position [S] (float64): the largest max |floor - b| the noise
    floor has shown at this point up to and including the position (`prior`: its largest
    before this step), and never less than `unit_eps` x max |b|, one rounding of the floor's
    dtype. A running maximum because the floor's error at one position is one sample of the
    drift an honest implementation shows there: a point of four elements (hpost) lands near
    the truth by chance, and a port that lands farther is no less honest. `floor`, `b`:
    [S, ...] (the floor in any float dtype)."""
    f, r = _by_position(floor.double()), _by_position(b.double())
    if not r.shape[1]:
        return r.new_full((r.shape[0],), float(prior))
    d = (f - r).abs()
    d = torch.where(torch.isfinite(d), d, torch.zeros_like(d)).amax(1)
    d = torch.cummax(d.clamp_min(float(prior)), 0).values
    return torch.maximum(d, unit_eps * r.abs().amax(1))


@dataclass(frozen=True)
class LogitsRule:
    """Extra checks on logits. A near tie: two ids whose reference logits differ by at most
    `tie_factor` allowances of the logits rule (each side may move by one allowance, so
    their order can legitimately swap). KL(ref || port) needs no constant of its own: when
    every logit is within the allowance A, Hoeffding's lemma bounds it by A²/2 nats."""
    topk: int = 5
    tie_factor: float = 2.0
    why: str = "two sides each within one allowance can swap ids closer than two allowances"

    def __post_init__(self):
        if isinstance(self.topk, bool) or not isinstance(self.topk, int) \
                or not 1 <= self.topk <= 1 << 20:
            shown = repr(self.topk) if len(repr(self.topk)) <= 40 else repr(self.topk)[:37] + "..."
            raise RulesError(f"LogitsRule: field topk={shown} must be an integer in "
                             f"1..{1 << 20}")
        _finite_nonneg("LogitsRule", "tie_factor", self.tie_factor)


# A position whose reference slice is exactly 0 has no scale of its own: Engram keys and
# values at position 0, where no n-gram is complete, are exact zeros on both sides. Without a
# floor its allowance is 0 and any difference reads as an infinite error. ZERO_FLOOR is 170x
# below the smallest allowance a nonzero ladder point gets on tiny (3e-5 x max|attn_out| =
# 1.7e-6), so it decides only such slices, and there a port value v reads v / ZERO_FLOOR.
ZERO_FLOOR = 1e-8
ZERO_WHY = "; floor: a zero reference slice (Engram at position 0) keeps a finite error"


# Reported by compare.py: relative error |a-b| / max(|b|, REL_FLOOR·max|b|), so elements near
# a zero crossing do not read as huge relative errors. A report metric, never a pass criterion.
REL_FLOOR = 1e-3


@dataclass(frozen=True)
class RuleSet:
    """Point rules (pattern -> Rule, first match wins), the logits checks, the rel floor."""
    rules: dict                     # pattern -> Rule, first match wins
    logits: LogitsRule = field(default_factory=LogitsRule)
    rel_floor: float = REL_FLOOR
    source: str = "ladder/engine/rule_tables.py"

    def __post_init__(self):
        _finite_nonneg("RuleSet", "rel_floor", self.rel_floor, 1.0)
        if not self.rules:
            raise RulesError("RuleSet: field rules is empty; give at least a catch-all '*'")

    def pattern_for(self, name: str) -> str:
        for pattern in self.rules:
            if fnmatch.fnmatchcase(name, pattern):
                return pattern
        raise UncoveredPointError(f"no tolerance rule matches {name!r}; patterns: "
                                  f"{list(self.rules)}")

    def check_covers(self, sides=COMPARED_SIDES):
        """Refuse a rule set under which some point of a compared side has no rule: each side
        needs a catch-all (e.g. 'port/*'), so every point, including ones added later, has one."""
        for side in sides:
            probe = f"{side}/\x00any point"
            if not any(fnmatch.fnmatchcase(probe, p) for p in self.rules):
                raise RulesError(f"{self.source}: no rule covers every {side}/ point; add a "
                                 f"catch-all pattern such as '{side}/*' (or '*') after the "
                                 f"specific ones")

    def for_point(self, name: str) -> Rule:
        return self.rules[self.pattern_for(name)]

    def to_dict(self) -> dict:
        return {"rel_floor": self.rel_floor, "logits": asdict(self.logits),
                "rules": [{"pattern": p, **asdict(r)} for p, r in self.rules.items()]}


@dataclass(frozen=True)
class CountBound:
    """At most fraction·n of n compared units may show a tolerated event (a count bound)."""
    fraction: float
    why: str = ""

    def __post_init__(self):
        if _finite_nonneg("CountBound", "fraction", self.fraction) > 1:
            raise RulesError(f"CountBound: field fraction={self.fraction!r} must be <= 1")

    def allows(self, count: int, n: int) -> bool:
        return count <= self.fraction * n
