"""When a stored ladder stands in for the reference and a point fails: is the file wrong?

A golden file (`ladder_fixture`) or a fixture (`run --fixture`) is trusted as the reference.
If it was written from a buggy port, or the reference changed after it was stored, the fixed
port fails against it and the layer split would blame the port ("inherited" or "own") for an
error that is the file's. So on a failure the reference is recomputed on the stored schedule
and the stored values are themselves compared with it under the same rules:

- stored agrees with the reference: the port is what diverges; the usual verdict stands;
- stored disagrees: the file is stale; said first, with where it disagrees, and then whether
  the port matches the recomputed reference (then only the file needs regenerating).
"""
from __future__ import annotations

from dataclasses import dataclass

from ladder.engine.compare import Comparison, compare_ladders


@dataclass
class StandInCheck:
    what: str                    # "golden file x.safetensors", "fixture tests/fixtures/fx"
    stored: Comparison           # the stored ladder against the recomputed reference
    port: Comparison             # the port against the recomputed reference
    regen: str                   # how to regenerate the file

    @property
    def stale(self) -> bool:
        return not self.stored.passed

    def message(self) -> str:
        f = self.stored.first
        lines = [f"the stored {self.what} disagrees with the reference at {f.key} "
                 f"({f.error:.3g} of its allowance, recomputed now on the stored schedule): "
                 f"regenerate it ({self.regen})"]
        if self.port.passed:
            lines.append("the port matches the recomputed reference at every point: the "
                         "file is what is wrong, not the port")
        else:
            p = self.port.first
            lines.append(f"the port also diverges from the recomputed reference: first at "
                         f"{p.key} ({p.error:.3g} of its allowance)")
        return "\n".join(lines)


def check_stand_in(stored, port, reference, rules, what: str, regen: str) -> StandInCheck:
    """`stored` and the port's ladder, each against the recomputed `reference`."""
    on_stored = compare_ladders(stored, reference, rules, prefix="port", a_label=what,
                                b_label=reference.label, keep="summary")
    on_port = compare_ladders(port, reference, rules, prefix="port", a_label=port.label,
                              b_label=reference.label, keep="summary")
    return StandInCheck(what, on_stored, on_port, regen)
