"""Run DeepSeek's own V4.1 `inference/model.py` on a tiny seeded model and record its attention.

    python tools/gen_v41_attn_fixture.py --ref DIR [--out tests/fixtures/attn_v41_official]
    python tools/gen_v41_attn_fixture.py --ref DIR --check     # regenerate, compare, write nothing

DIR holds the official `inference/model.py` of deepseek-ai/DeepSeek-V4.1-Flash at revision
dba1be0a40aa45a94ad051997016db3960a90277 (DIR/inference/model.py or DIR/model.py); any other
file is refused by its sha256. With --accept-vendored-ttmetal DIR may instead hold the copy
vendored in tenstorrent/tt-metal (702412b8..., models/demos/deepseek_v3_d_p/reference/
deepseek_v41/model.py): its provenance header is dropped and its four import lines restored,
and the result must then hash to the official sha256 (recorded, with the vendored file's own).

The official file runs unmodified, on CPU, under bf16 default dtype with bf16 weights, with
our stand-ins (tools/v41_kernel_standins.py) installed as its `kernel` module and empty
stand-ins for `engram`, `vision` and `image_processor` (the tiny model has no Engram layers and
no vision tower). The whole Transformer runs (hyper-connections, MoE), so every layer's
attention input is the real normed collapsed stream; hooks record per call and layer the input
`x` and the trace points (qr, q, kv, window_idxs, latent, index_q, compressed_rows, topk_idxs,
o, o_rot, og, out). Only outputs are written: the attention weights, the recordings and a JSON
manifest. The official code never enters the repository.

Regeneration is byte-identical: one thread, deterministic algorithms, fixed seeds, sorted JSON
keys and nothing time- or machine-dependent in the manifest (the run time is printed, not
recorded). `--check` proves it: it regenerates into a temporary directory and compares both
files byte for byte with the existing --out pair, exit 0 when identical, 1 naming the first
differing file (tests/test_gen_v41_fixture.py tests the comparison; the suite cannot run the
official code itself).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import time
import types

import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import v41_kernel_standins  # noqa: E402

from reference.v41.config import V41Args, weight_names  # noqa: E402

REVISION = "dba1be0a40aa45a94ad051997016db3960a90277"
OFFICIAL_SHA256 = "4e9ae23620edc8028ccc5d5fef552ab7fdc7dcd6f79608754fe9f67644056f65"
TTMETAL_COMMIT = "702412b85f1b8d93a8e87fe0584fa165766f38ce"
VENDORED_HEADER_LINES = 9
VENDORED_IMPORTS = {                       # the tt-metal copy's package-relative imports
    "from .engram import": "from engram import",
    "from .image_processor import": "from image_processor import",
    "from .kernel_cpu import (": "from kernel import (",
    "from .vision import": "from vision import",
}
SEED = 20261130
# spec §8: every class (window; ratio-2 kv+index source and reuse; ratio-1 kv+index+candidate
# source, reuse, a re-index source behind the candidate filter, reuse)
MODEL_ARGS = dict(
    max_batch_size=1, max_seq_len=64, dtype="bf16", expert_dtype=None, vocab_size=256, dim=64,
    moe_inter_dim=32, n_layers=8, n_heads=4, n_routed_experts=4, n_activated_experts=2,
    q_lora_rank=16, head_dim=32, rope_head_dim=8, norm_eps=1e-20, o_groups=2, o_lora_rank=16,
    window_size=8, compress_ratios=(0, 0, 2, 2, 1, 1, 1, 1), kv_source_layers=(2, 4),
    index_source_layers=(2, 4, 6), compress_rope_theta=40000.0, original_seq_len=32,
    rope_theta=10000.0, rope_factor=2.0, beta_fast=32, beta_slow=1, index_n_heads=2,
    index_head_dim=32, index_topk=6, candidate_source_layer=4, candidate_topk_blocks=3,
    candidate_block_size=2, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6)
# (name, prefill length, last decode position): wraps at 8, 16, 24; ratio-2 groups complete at
# every odd position; selections grow past index_topk so decode padding shrinks to zero
SCENARIOS = (("p1", 1, 19), ("p3", 3, 9), ("p8", 8, 11), ("p13", 13, 26))


class FixtureSourceError(ValueError):
    """The --ref directory does not hold the official file (names the path and the hashes)."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def official_source(ref: str, accept_vendored: bool):
    """(official model.py text, provenance dict)."""
    path = next((p for p in (os.path.join(ref, "inference", "model.py"),
                             os.path.join(ref, "model.py")) if os.path.isfile(p)), None)
    if path is None:
        raise FixtureSourceError(f"--ref {ref}: no inference/model.py or model.py there")
    raw = open(path, "rb").read()
    got = sha256(raw)
    prov = {"repo": "deepseek-ai/DeepSeek-V4.1-Flash", "revision": REVISION,
            "file": "inference/model.py", "sha256": OFFICIAL_SHA256, "used": "official",
            "used_file_sha256": got}
    if got == OFFICIAL_SHA256:
        return raw.decode("utf-8"), prov
    if not accept_vendored:
        raise FixtureSourceError(
            f"{path}: sha256 {got} is not the official {OFFICIAL_SHA256} (revision {REVISION}); "
            f"refusing it (a tt-metal vendored copy needs --accept-vendored-ttmetal)")
    lines = raw.decode("utf-8").split("\n")[VENDORED_HEADER_LINES:]
    for i, line in enumerate(lines):
        for new, old in VENDORED_IMPORTS.items():
            if line.startswith(new):
                lines[i] = old + line[len(new):]
    text = "\n".join(lines)
    if sha256(text.encode("utf-8")) != OFFICIAL_SHA256:
        raise FixtureSourceError(
            f"{path}: sha256 {got}; with the tt-metal header dropped and its imports restored "
            f"it hashes to {sha256(text.encode('utf-8'))}, not the official {OFFICIAL_SHA256}")
    prov.update(used="tt-metal vendored copy, un-vendored to the official bytes",
                ttmetal_commit=TTMETAL_COMMIT)
    return text, prov


def load_official(text: str):
    stubs = {"kernel": v41_kernel_standins}
    for name, attrs in (("engram", ("EngramLayout", "NgramHashState")),
                        ("vision", ("Aligner", "ViT")),
                        ("image_processor", ())):
        mod = types.ModuleType(name)
        for a in attrs:
            setattr(mod, a, type(a, (), {"from_args": staticmethod(lambda args: None)}))
        stubs[name] = mod
    for c in ("IMAGE", "IMAGE_END", "IMAGE_NEW_LINE", "IMAGE_START"):
        setattr(stubs["image_processor"], c, -100)
    sys.modules.update(stubs)
    spec = importlib.util.spec_from_loader("v41_official_model", loader=None)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    exec(compile(text, "v41_official/inference/model.py", "exec"), mod.__dict__)
    return mod


def init_weights(model, gen):
    """Seeded uniform values: matrices U(-1,1)/sqrt(in), norms 1 ± 0.05, sinks ±0.1, rest ±0.05."""
    for name, p in sorted(model.named_parameters()):
        u = torch.rand(p.shape, generator=gen, dtype=torch.float64) * 2 - 1
        if name.endswith("attn_sink"):
            v = 0.1 * u
        elif p.dim() == 1 and "norm" in name:
            v = 1 + 0.05 * u
        elif p.dim() == 2:
            v = u / p.shape[1] ** 0.5 * (1.0 if "embed" not in name else p.shape[1] ** 0.5)
        else:
            v = 0.05 * u
        p.data.copy_(v.to(p.dtype))


class Recorder:
    def __init__(self, mod, model):
        self.rec, self.layer, self.start_pos, self.o_obj = {}, None, 0, None
        self.win, self.ratios = MODEL_ARGS["window_size"], MODEL_ARGS["compress_ratios"]
        st = v41_kernel_standins
        act, fp4, sa = st.act_quant, st.fp4_act_quant, st.sparse_attn

        def put(name, t):
            if self.layer is not None:
                self.rec.setdefault(self.layer, {})[name] = t.detach().clone()

        def act_quant(x, *a, **k):
            out = act(x, *a, **k)
            put("kv", x[0])
            return out

        def fp4_act_quant(x, *a, **k):
            out = fp4(x, *a, **k)
            if x.dim() == 4:
                put("index_q", x[0])
            return out

        def sparse_attn(q, kv, sink, idx, scale):
            out = sa(q, kv, sink, idx, scale)
            put("q", q[0]), put("topk_idxs", idx[0]), put("o", out[0])
            if self.ratios[self.layer]:
                put("compressed_rows", kv[0, q.shape[1] if self.start_pos == 0 else self.win:])
            self.o_obj = out
            return out
        for name, fn in (("act_quant", act_quant), ("fp4_act_quant", fp4_act_quant),
                         ("sparse_attn", sparse_attn)):
            setattr(mod, name, fn)                     # the names model.py looks up
        win_idxs = mod.get_window_topk_idxs

        def get_window_topk_idxs(*a):
            out = win_idxs(*a)
            put("window_idxs", out[0])
            return out
        mod.get_window_topk_idxs = get_window_topk_idxs
        fwd = mod.Attention.forward

        def attention_forward(attn, x, start_pos):
            self.layer, self.start_pos = attn.layer_id, start_pos
            put("x", x[0])
            out = fwd(attn, x, start_pos)
            put("o_rot", self.o_obj[0]), put("out", out[0])
            self.layer = None
            return out
        mod.Attention.forward = attention_forward
        for blk in model.layers:
            a = blk.attn
            a.q_norm.register_forward_hook(lambda m_, i, o: put("qr", o[0]))
            a.wo_b.register_forward_pre_hook(lambda m_, i: put("og", i[0][0]))
            if a.compressor is not None:
                a.compressor.register_forward_hook(
                    lambda m_, i, o: put("latent", o[0]) if o is not None else None)


def fixture_weights(model, args) -> dict:
    """{"w/{official name}": tensor} for every backbone layer's attention: `n_layers` governs,
    as in the official model (compress_ratios entries past it belong to MTP layers, whose
    DSpark attention the fixture does not record)."""
    v41 = V41Args.from_any(args)
    return {f"w/{name}": model.get_parameter(name).detach().clone()
            for i in range(v41.n_layers) for name in weight_names(v41, i)}


def generate(text: str):
    torch.set_num_threads(1)            # one reduction order, whatever the machine
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    mod = load_official(text)
    with mod.set_dtype(torch.bfloat16):
        args = mod.ModelArgs(**MODEL_ARGS)
        model = mod.Transformer(args)
        init_weights(model, torch.Generator().manual_seed(SEED))
        rec = Recorder(mod, model)
        tensors, calls = {}, []
        tensors.update(fixture_weights(model, args))
        gen = torch.Generator().manual_seed(SEED + 1)
        scenarios = []
        for sname, prefill, last in SCENARIOS:
            ids = torch.randint(0, args.vocab_size, (1, last + 1), generator=gen)
            steps = [(0, prefill)] + [(p, 1) for p in range(prefill, last + 1)]
            keys = []
            for start, m in steps:
                rec.rec = {}
                model(ids[:, start:start + m], start)
                key = f"c{len(calls):03d}"
                for layer, points in sorted(rec.rec.items()):
                    for name, t in points.items():
                        tensors[f"{key}/L{layer}/{name}"] = t.contiguous()
                calls.append({"key": key, "scenario": sname, "start_pos": start, "m": m})
                keys.append(key)
            scenarios.append({"name": sname, "prefill": prefill, "last_pos": last,
                              "tokens": ids[0].tolist(), "calls": keys})
    return tensors, calls, scenarios


SUFFIXES = (".json", ".safetensors")


def write_outputs(stem: str, tensors, manifest) -> None:
    save_file(tensors, stem + ".safetensors", metadata={"format": manifest["format"]})
    with open(stem + ".json", "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


def differing_outputs(new_stem: str, old_stem: str) -> list:
    """The fixture files whose bytes differ between two stems (a missing file differs)."""
    bad = []
    for suffix in SUFFIXES:
        paths = (new_stem + suffix, old_stem + suffix)
        if not all(os.path.isfile(p) for p in paths):
            bad.append(old_stem + suffix)
            continue
        with open(paths[0], "rb") as a, open(paths[1], "rb") as b:
            if a.read() != b.read():
                bad.append(old_stem + suffix)
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", required=True, help="directory holding the official model.py")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "tests", "fixtures",
                                                  "attn_v41_official"))
    ap.add_argument("--accept-vendored-ttmetal", action="store_true",
                    help="accept tt-metal's vendored copy if un-vendoring it gives the official "
                         "bytes")
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temporary directory and compare byte for byte with "
                         "the existing --out files; writes nothing")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        text, prov = official_source(a.ref, a.accept_vendored_ttmetal)
    except FixtureSourceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    engram = os.path.join(a.ref, "inference", "engram.py")
    prov["engram.py"] = (f"present (sha256 {sha256(open(engram, 'rb').read())}), not imported: "
                         f"stubbed (no Engram layers)") if os.path.isfile(engram) else "stubbed"
    tensors, calls, scenarios = generate(text)
    secs = time.perf_counter() - t0
    manifest = {"format": "needle-parity attn_v41 fixture 1", "official": prov,
                "model_args": {k: list(v) if isinstance(v, tuple) else v
                               for k, v in MODEL_ARGS.items()},
                "seed": SEED, "scenarios": scenarios, "calls": calls,
                "standins": "tools/v41_kernel_standins.py (act_quant, fp4_act_quant, "
                            "sparse_attn, hc_split_sinkhorn)",
                "torch": torch.__version__, "threads": torch.get_num_threads()}
    if a.check:
        with tempfile.TemporaryDirectory() as tmp:
            stem = os.path.join(tmp, "regenerated")
            write_outputs(stem, tensors, manifest)
            bad = differing_outputs(stem, a.out)
        if bad:
            print(f"check: regeneration differs from {', '.join(bad)} ({secs:.1f} s)",
                  file=sys.stderr)
            return 1
        print(f"check: regeneration is byte-identical to {a.out}{{{','.join(SUFFIXES)}}} "
              f"({len(calls)} calls, {len(tensors)} tensors, {secs:.1f} s)")
        return 0
    write_outputs(a.out, tensors, manifest)
    size = os.path.getsize(a.out + ".safetensors") + os.path.getsize(a.out + ".json")
    print(f"{len(calls)} calls, {len(tensors)} tensors, {size / 1e6:.2f} MB, {secs:.1f} s; "
          f"official model.py sha256 {OFFICIAL_SHA256} ({prov['used']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
