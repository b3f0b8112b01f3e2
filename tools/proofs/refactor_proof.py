"""Proof that a refactor of port/ changed no bit: record every output of a fixed, seeded set of
runs as integer views into one safetensors file, then compare two such files with torch.equal.

    PYTHONPATH=. python tools/proofs/refactor_proof.py --out /tmp/proof_before.safetensors
    PYTHONPATH=. python tools/proofs/refactor_proof.py --out /tmp/proof_after.safetensors \
        --compare /tmp/proof_before.safetensors

Recorded, for dense and cq weights on the torch eager, torch --decode graph (CPU body) and
native backends (and triton under TRITON_INTERPRET=1 on a short schedule with --triton):
the logits of every plain step (prefill_batch + step, and step_prefill + step), the state's
k/v/vraw/lanes/hidden/key_ok after the run, a traced prefill_batch (every chunk row), the
probe heads, injection (`step_layer`, decode and prefill positions, given and recomputed
Engram rows, traced), and the traced ladder of ladder.capture.capture_port (check_plain).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch


def ints(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers (floats viewed as same-width ints), contiguous, on CPU."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.float32:
        return t.view(torch.int32).clone()
    if t.dtype == torch.float64:
        return t.view(torch.int64).clone()
    if t.dtype == torch.bool:
        return t.to(torch.uint8).clone()
    return t.clone()


class Rec:
    def __init__(self):
        self.out = {}

    def put(self, key, t):
        if key in self.out:
            raise KeyError(f"duplicate key {key}")
        self.out[key] = ints(t)


class ListTrace:
    """A trace that keeps every call (name, layer, value) in order."""

    def __init__(self, batched=False):
        self.calls = []
        if batched:
            self.batched = True

    def __call__(self, name, layer, values):
        self.calls.append((name, layer, values.detach().clone()))


def put_trace(rec, key, tr):
    for j, (name, layer, v) in enumerate(tr.calls):
        rec.put(f"{key}/{j:04d}.{name}.{layer}", v)


def run_config(rec, params, cfg, weights, backend, decode, tokens, prompt):
    from port import V2Batch, V2Model
    from ladder.sides.capture import BatchRecorder, capture_port  # noqa: F401
    tag = f"{weights}/{backend}/{decode}"
    model = V2Model.from_params(params, cfg, weights, backend=backend, decode=decode)
    # plain: prefill_batch + step
    st = model.make_state()
    lg = model.prefill_batch(tokens[:prompt], st, V2Batch(model, cap=4),
                             torch.empty(cfg.vocab_size))
    rec.put(f"{tag}/plain/prefill_logits", lg)
    for n, t in enumerate(tokens[prompt:]):
        rec.put(f"{tag}/plain/step{n:02d}", model.step(t, st).clone())
    for name in ("k", "v", "vraw", "lanes", "hidden", "key_ok", "logits"):
        rec.put(f"{tag}/plain/state.{name}", getattr(st, name))
    # plain: step_prefill + step with a caller's buffer
    st2 = model.make_state()
    for t in tokens[:prompt]:
        model.step_prefill(t, st2)
    buf = torch.empty(cfg.vocab_size)
    for n, t in enumerate(tokens[prompt:]):
        model.step(t, st2, logits=buf)
        rec.put(f"{tag}/single/step{n:02d}", buf)
    for name in ("k", "v", "vraw", "lanes", "hidden"):
        rec.put(f"{tag}/single/state.{name}", getattr(st2, name))
    # step_traced on its own (decode positions take the backend's body)
    st3 = model.make_state()
    for n, t in enumerate(tokens):
        tr = ListTrace()
        out = model.step_traced(t, st3, None, tr, prefill=n < prompt)
        rec.put(f"{tag}/traced/out{n:02d}", out)
        put_trace(rec, f"{tag}/traced/trace{n:02d}", tr)
    # traced prefill_batch (not on native: refused)
    if backend != "native":
        st4 = model.make_state()
        br = ListTrace(batched=True)
        out = model.prefill_batch(tokens[:prompt], st4, V2Batch(model, cap=4),
                                  torch.empty(cfg.vocab_size), trace=br)
        rec.put(f"{tag}/batch_traced/logits", out)
        put_trace(rec, f"{tag}/batch_traced/trace", br)
    # injection: step_layer at decode and prefill positions
    L = cfg.num_layers
    lanes = torch.randn(cfg.mhc_lanes, cfg.d_model, generator=torch.Generator().manual_seed(3))
    eng = [(torch.randn(cfg.d_model, generator=torch.Generator().manual_seed(10 + s)),
            torch.randn(cfg.d_model, generator=torch.Generator().manual_seed(20 + s)))
           for s in range(cfg.num_sites)]
    for pos in sorted({0, prompt - 1, prompt, st.pos - 1}):
        for i in range(L):
            for prefill in (False, True):
                for e_name, e in (("given", eng), ("state", None)):
                    c = st.clone()
                    tr = ListTrace()
                    got = model.step_layer(i, lanes, c, pos, engram=e, trace=tr,
                                           prefill=prefill)
                    k = f"{tag}/inject/p{pos}.L{i}.{int(prefill)}.{e_name}"
                    rec.put(f"{k}/lanes", got)
                    rec.put(f"{k}/k", c.k)
                    rec.put(f"{k}/v", c.v)
                    put_trace(rec, f"{k}/trace", tr)
    # probe heads
    for head in ("encode_contrastive", "confidence"):
        rec.put(f"{tag}/heads/{head}", getattr(model, head)(tokens[:prompt + 2]))
        rec.put(f"{tag}/heads/{head}_batch",
                getattr(model, head)([tokens[:prompt], [0] + tokens[1:prompt]]))
    rec.put(f"{tag}/heads/confidence_w10", model.confidence(tokens[:prompt + 4], window=10))
    # the traced ladder (with the plain check and the located paths' comparison)
    ladder = capture_port(model, tokens, prompt, check_plain=True)
    for key in sorted(ladder.values):
        rec.put(f"{tag}/ladder/{key}", ladder.values[key])
    rec.put(f"{tag}/ladder_hidden", torch.tensor([len(ladder.hidden)]))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare", default=None, help="a file to compare --out's tensors with")
    ap.add_argument("--triton", action="store_true",
                    help="also the triton backend (TRITON_INTERPRET=1, short schedule)")
    ap.add_argument("--only", default=None, help="run only configs whose tag contains this")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    from safetensors.torch import load_file, save_file
    from reference.config import V2Config
    from reference.params import init_params
    cfg = V2Config.preset("tiny")
    params = init_params(cfg, seed=7, perturbed=True)
    g = torch.Generator().manual_seed(1234)
    tokens = [int(t) for t in torch.randint(1, cfg.vocab_size, (20,), generator=g)]
    prompt = 6
    rec = Rec()
    configs = [(w, b, d, tokens, prompt) for w in ("dense", "cq")
               for b, d in (("torch", "eager"), ("torch", "graph"), ("native", "eager"))]
    if a.triton:
        if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
            sys.exit("--triton on a CPU needs TRITON_INTERPRET=1")
        configs += [(w, "triton", "eager", tokens[:10], 4) for w in ("dense", "cq")]
    for w, b, d, toks, pr in configs:
        if a.only and a.only not in f"{w}/{b}/{d}":
            continue
        print(f"run {w}/{b}/{d} ({len(toks)} tokens)", flush=True)
        run_config(rec, params, cfg, w, b, d, toks, pr)
    save_file(rec.out, a.out)
    print(f"wrote {len(rec.out)} tensors to {a.out}")
    if a.compare:
        old = load_file(a.compare)
        new = rec.out
        missing = sorted(set(old) - set(new))
        extra = sorted(set(new) - set(old))
        if a.only:
            missing = [k for k in missing if a.only in "/".join(k.split("/")[:3])]
        bad = [k for k in sorted(set(old) & set(new))
               if old[k].dtype != new[k].dtype or not torch.equal(old[k], new[k])]
        print(f"compared {len(set(old) & set(new))} tensors: {len(bad)} differ, "
              f"{len(missing)} missing, {len(extra)} extra")
        for k in (bad + missing + extra)[:20]:
            print("  ", k)
        if bad or missing or extra:
            sys.exit(1)
        print("all equal")


if __name__ == "__main__":
    main()
