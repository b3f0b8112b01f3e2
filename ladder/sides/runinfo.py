"""What a ladder run ran: one description of the port side, printed in every header and report.

A number is only worth rerunning when the reader knows what produced it, so each run names its
backend, decode mode, weight form, device and thread count, and the KV state the port stepped
on: the one `make_state()` gives users (full causal where the config has no window), or the
`--window` override, said as such.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PortRun:
    backend: str
    decode: str
    weights: str
    device: str
    threads: str
    ring: int                    # KV slots of the state the port steps on
    window: int                  # its attention window (0: full causal)
    state: str                   # how that state was made
    precision: str = ""          # below float32: what it computes in (port/precision.py)

    def label(self) -> str:
        """Short form for the comparison's first line."""
        at = f", {self.precision}" if self.precision else ""
        return (f"port ({self.backend}, {self.decode}, {self.weights}, {self.device}, "
                f"{self.threads}{at})")

    def lines(self) -> list:
        at = f", precision {self.precision}" if self.precision else ""
        return [f"port: backend {self.backend}, decode {self.decode}, weights {self.weights}, "
                f"device {self.device}, {self.threads}{at}",
                f"port state: {self.state}"]

    def as_info(self) -> dict:
        at = f", precision {self.precision}" if self.precision else ""
        return {"port": f"backend {self.backend}, decode {self.decode}, weights "
                        f"{self.weights}, device {self.device}, {self.threads}{at}",
                "port state": self.state}


def thread_count(model) -> str:
    """The threads that compute the port's products: torch's pool, or the C step's own."""
    impl = getattr(model, "impl", None)
    n, who = impl.threads() if impl is not None else (torch.get_num_threads(), "torch")
    return f"{n} {who} thread{'' if n == 1 else 's'}"


def port_state_window(model, override):
    """(ring, window, description) of the state the ladder steps the port on: make_state()
    unless `override` (the --window value, or a fixture's recorded window) is given."""
    made = model.make_state()
    how = "make_state_full_causal()" if model.cfg.kv_window == 0 else "make_state()"
    if override is None:
        return made.ring, made.window, f"{how}: ring {made.ring}, window {made.window}"
    return made.ring, int(override), (f"window {override} (overrides {how}'s window "
                                       f"{made.window}; ring {made.ring})")


def describe_port(model, weights: str, device, override=None) -> PortRun:
    ring, window, how = port_state_window(model, override)
    p = getattr(model, "precision", None)
    at = "" if p is None or p.is_float32 else \
        p.activations + ("" if p.kv == p.activations else f" kv {p.kv}")
    return PortRun(model.backend, model.decode, weights, str(device), thread_count(model),
                   ring, window, how, at)


def graph_verdict(model, checked: bool) -> str:
    """What `--decode graph` was held to ("" for eager). The ladder records the traced eager
    step; the graph step (host prep + device body, a CUDA graph replay on CUDA) is the plain
    run that `capture_port(check_plain=True)` compares with it bit for bit, and a difference
    stops the run there, naming the point where the traced body parts (PathError, exit 1)."""
    if not model.impl.graph_capture:
        return ""
    if model.make_state().window == 0:
        return ("decode graph: not exercised: make_state() is full causal and the graph step "
                "needs a windowed ring (every step ran eagerly)")
    if not checked:
        return "decode graph: NOT checked against the eager step (--no-check-plain)"
    how = "CUDA graph replay" if model.device.type == "cuda" else "body run eagerly on CPU"
    return (f"decode graph: graph step ({how}) == traced eager step at every decode step "
            f"(logits and caches, torch.equal)")
