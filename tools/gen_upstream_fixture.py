"""Generate the upstream parity fixture from the real cactus-needle 2.0.8 JAX code.

Writes tests/fixtures/upstream_v2.safetensors (inputs, parameters and upstream's outputs,
including a per-layer "ladder" of intermediates) and tests/fixtures/upstream_v2.json (manifest).
Upstream is only imported and called (its helpers are wrapped at run time to observe values);
none of its code lives in this repository.

Setup (a separate venv, so jax never enters the project's own environment):

    python -m venv /work/venv-up && /work/venv-up/bin/pip install cactus-needle==2.0.8 \
        jax jaxlib flax safetensors numpy torch==2.13.0

Run from the repository root (10-15 minutes on 2 CPU cores, almost all of it XLA compilation:
~50 s per jitted decode shape, plus the training graph and heads):

    /work/venv-up/bin/python tools/gen_upstream_fixture.py [--seed N] [--out-dir tests/fixtures]

The output is deterministic: two runs give byte-identical files.  Nothing is written unless
every check passes (param tree == upstream's, jitted == instrumented eager decode).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import os
import sys
import time

os.environ["JAX_PLATFORMS"] = "cpu"          # reproducible CPU numerics, no accelerator probing
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import jax                                    # noqa: E402
import jax.numpy as jnp                       # noqa: E402
import numpy as np                            # noqa: E402
from flax import traverse_util               # noqa: E402
from safetensors.numpy import save_file      # noqa: E402

from needle.model import architecture as arch  # noqa: E402
from needle.model import decode as dm          # noqa: E402
import reference.config                        # noqa: E402
import reference.params                        # noqa: E402

jax.config.update("jax_enable_x64", False)    # upstream runs f32; int64 would change hashing
TRAINING_ONLY = ("mtp_", "contrastive_head/log_temp")
# name, batch, kv_window, cache length M, prompt length, decode steps
SCENARIOS = (("win", 2, 8, 32, 11, 13), ("full", 1, 0, 16, 5, 8),
             ("masked", 2, 8, 24, 12, 6), ("nohist", 2, 8, 16, 10, 0))
LAYER_POINTS = ("x_in", "nx", "u", "bx", "h_in", "q", "k", "attn_out", "attn_post", "mlp_in",
                "mlp_out", "block_out", "y", "res_logits", "hres", "x")


def fail(msg):
    print(f"gen_upstream_fixture: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def upstream_model(cfg, **over):
    d = {**cfg.to_dict(), **over}
    d["engram_orders"] = tuple(d["engram_orders"])
    return arch.SimpleAttentionNetwork(arch.TransformerConfig(**d))


def build_params(cfg, seed):
    """(ours: flat numpy dict, full: nested tree for apply incl. zeroed training-only leaves)."""
    ours = {k: v.detach().cpu().numpy().astype(np.float32)
            for k, v in reference.params.init_params(cfg, seed=seed, perturbed=True).items()}
    model = upstream_model(cfg)

    def touch_everything(m, toks):               # so the probe-head params get created too
        return m(toks), m.encode_contrastive(toks), m.forward_confidence(toks)

    toks = jnp.ones((1, 8), jnp.int32)
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), toks,
                                               method=touch_everything))["params"]
    up = {k: tuple(v.shape) for k, v in traverse_util.flatten_dict(shapes, sep="/").items()}
    up_kept = {k: s for k, s in up.items() if not k.startswith(TRAINING_ONLY)}
    for k in sorted(set(up_kept) | set(ours)):
        if k not in ours:
            fail(f"upstream parameter {k!r} {up_kept[k]} missing from reference.params")
        if k not in up_kept:
            fail(f"reference.params key {k!r} {ours[k].shape} does not exist upstream")
        if tuple(ours[k].shape) != up_kept[k]:
            fail(f"parameter {k!r}: ours {ours[k].shape} vs upstream {up_kept[k]}")
    full = dict(ours)
    for k, s in up.items():                      # unused by every output we record
        if k not in up_kept:
            full[k] = np.zeros(s, np.float32)
    nest = lambda flat: traverse_util.unflatten_dict(
        {tuple(k.split("/")): jnp.asarray(v) for k, v in flat.items()})
    return ours, nest(ours), nest(full)


# ---------------------------------------------------------------- ladder instrumentation
class Ladder:
    """Wraps decode.py's module-level helpers so an un-jitted _forward_cached reports its
    intermediates.  Calls are attributed by structure (which helper, which scale array),
    not by counting, so a mis-attribution fails loudly instead of silently shifting."""

    NAMES = ("_engram_kv", "_rms_unit", "_block_cached", "_zcrms", "_attn_cached",
             "_hadamard", "_sinkhorn", "apply_rope")

    def __init__(self, n, d):
        self.n, self.d = n, d
        self.engram, self.layers, self.final = None, [], {}
        self.lp, self.rope_calls = None, 0
        self.saved = {}

    def put(self, name, value):
        layer = self.layers[-1]
        if name in layer:
            fail(f"ladder point L{len(self.layers) - 1:02d}.{name} observed twice")
        layer[name] = np.array(value, np.float32)

    def __enter__(self):
        for name in self.NAMES:
            self.saved[name] = getattr(dm, name)
            setattr(dm, name, getattr(self, "w" + name))
        return self

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(dm, name, fn)

    def w_engram_kv(self, *a, **kw):
        ks, vs = self.saved["_engram_kv"](*a, **kw)
        self.engram = (np.array(ks), np.array(vs))
        return ks, vs

    def w_rms_unit(self, x, *a, **kw):
        out = self.saved["_rms_unit"](x, *a, **kw)
        if x.shape[-1] == self.n * self.d:           # first thing every layer does
            self.layers.append({})
            self.put("x_in", np.reshape(x, x.shape[:2] + (self.n, self.d)))
            self.put("nx", out)
        elif "u" not in self.layers[-1]:             # site layer: Engram gate's ru(u)
            self.put("u", x)
        return out                                   # (the other d-wide call is ru(k_s))

    def w_block_cached(self, x, lp, *a, **kw):
        if "u" not in self.layers[-1]:               # non-site layer: block input is u
            self.put("u", x)
        self.put("bx", x)
        self.lp, self.rope_calls = lp, 0
        out = self.saved["_block_cached"](x, lp, *a, **kw)
        self.lp = None
        self.put("block_out", out[0])
        self.put("y", np.asarray(out[0], np.float32) - self.layers[-1]["u"])
        return out

    def w_zcrms(self, x, scale, *a, **kw):
        out = self.saved["_zcrms"](x, scale, *a, **kw)
        if self.lp is None:                          # only the final norm runs outside blocks
            self.final["lane_mean"], self.final["final_norm"] = np.array(x), np.array(out)
            return out
        which = [k for k in ("pre", "qn", "kn", "post", "pre_hada") if self.lp[k] is scale]
        if len(which) != 1:
            fail(f"cannot attribute a _zcrms call in layer {len(self.layers) - 1}")
        name = {"pre": "h_in", "post": "attn_post", "pre_hada": "mlp_in"}.get(which[0])
        if name:                                     # q/k norms are recorded after RoPE
            self.put(name, out)
        return out

    def w_attn_cached(self, *a, **kw):
        out = self.saved["_attn_cached"](*a, **kw)
        self.put("attn_out", out[0])
        return out

    def wapply_rope(self, x, *a, **kw):
        out = self.saved["apply_rope"](x, *a, **kw)
        self.put(("q", "k")[self.rope_calls], out)   # _attn_cached ropes q, then k
        self.rope_calls += 1
        return out

    def w_hadamard(self, *a, **kw):
        out = self.saved["_hadamard"](*a, **kw)
        self.put("mlp_out", out)
        return out

    def w_sinkhorn(self, logits, *a, **kw):
        out = self.saved["_sinkhorn"](logits, *a, **kw)
        self.put("res_logits", logits)
        self.put("hres", out)
        return out

    def points(self, logits):
        """{point name: array} in ladder order, for one call."""
        L = len(self.layers)
        out = {"embed": self.layers[0]["x_in"][:, :, 0, :]}
        for s in range(self.engram[0].shape[0]):
            out[f"engram_k{s}"], out[f"engram_v{s}"] = self.engram[0][s], self.engram[1][s]
        for i, layer in enumerate(self.layers):
            if i + 1 < L:
                layer["x"] = self.layers[i + 1]["x_in"]
            for p in LAYER_POINTS:
                if p == "x" and i + 1 == L:
                    continue
                if p not in layer:
                    fail(f"ladder point L{i:02d}.{p} was never observed")
                out[f"L{i:02d}.{p}"] = layer[p]
        out.update(lane_mean=self.final["lane_mean"], final_norm=self.final["final_norm"],
                   logits=np.array(logits, np.float32))
        return out


def ladder_order(cfg):
    names = ["embed"] + [f"engram_{kv}{s}" for s in range(cfg.num_sites) for kv in "kv"]
    for i in range(cfg.num_layers):
        last = i == cfg.num_layers - 1
        names += [f"L{i:02d}.{p}" for p in LAYER_POINTS if not (p == "x" and last)]
    return names + ["lane_mean", "final_norm", "logits"]


# ---------------------------------------------------------------- decode scenarios
def scenario_inputs(name, B, M, total, cfg, rng):
    """tokens [B,total], hist [B,M], and the optional masks, as numpy."""
    toks = rng.integers(1, cfg.vocab_size, size=(B, total), dtype=np.int64).astype(np.int32)
    key_valid = hist_valid = sink = None
    if name in ("win", "full"):
        hist_valid = np.ones((B, M), bool)
    if name == "masked":                  # row 0 left-padded by 3; row 1 keeps pos 1 as a sink
        toks[0, :3] = cfg.pad_token_id
        key_valid = np.ones((B, M), bool)
        key_valid[0, :3] = False
        hist_valid = key_valid.copy()
        sink = np.zeros((B, M), bool)
        sink[1, 1] = True
    hist = None
    if name != "nohist":
        hist = np.zeros((B, M), np.int32)
        hist[:, :total] = toks            # the whole schedule, fixed in advance
    return toks, hist, key_valid, hist_valid, sink


def run_decode(cfg, tree, rng, out, scen_meta):
    hd = cfg.head_dim
    j = lambda a: None if a is None else jnp.asarray(a)
    eager_diff = {"logits": 0.0, "k_cache": 0.0, "v_cache": 0.0}
    tcfg = upstream_model(cfg).config
    for name, B, window, M, prompt, steps in SCENARIOS:
        t0, total = time.perf_counter(), prompt + steps
        toks, hist, key_valid, hist_valid, sink = scenario_inputs(name, B, M, total, cfg, rng)
        dcfg = dm.decode_cfg(tcfg, kv_window=window)
        cos, sin = dm.precompute_rope_freqs(hd, M, cfg.rope_theta)   # rope tables of length M
        kc, vc = dm.init_kv_cache(tcfg, B, M)
        pre = f"decode/{name}/"
        out[pre + "tokens"] = toks
        for mname, m in (("key_valid", key_valid), ("hist_valid", hist_valid), ("sink", sink)):
            if m is not None:
                out[pre + mname] = m.astype(np.uint8)
        calls = [("prefill", 0, prompt)] + [(f"decode{t:02d}", prompt + t, 1) for t in range(steps)]
        for step, pos, S in calls:
            args = (tree, dcfg, jnp.asarray(toks[:, pos:pos + S]), kc, vc,
                    jnp.asarray(pos, jnp.int32), cos, sin, j(key_valid), False, j(hist),
                    j(hist_valid), j(sink))
            logits, kc2, vc2 = dm.forward_cached(*args)
            logits = np.asarray(logits)
            out[pre + f"{step}/logits"] = logits
            if name == "win":
                # Same inputs (incl. the jitted chain's caches), un-jitted and instrumented.
                with Ladder(cfg.mhc_lanes, cfg.d_model) as lad:
                    e_logits, e_kc, e_vc = dm._forward_cached(*args)
                for what, a, b in (("logits", logits, e_logits), ("k_cache", kc2, e_kc),
                                   ("v_cache", vc2, e_vc)):
                    a, b = np.asarray(a), np.asarray(b)
                    diff = float(np.max(np.abs(a - b)))
                    eager_diff[what] = max(eager_diff[what], diff)
                    # XLA fuses the jitted graph differently from op-by-op dispatch, so bit
                    # equality does not hold; allow 1e-6 of the tensor's own scale.
                    if diff > 1e-6 * float(np.max(np.abs(a))):
                        fail(f"win/{step}: jitted vs eager {what} differ by {diff:.3g}")
                for p, v in lad.points(e_logits).items():
                    if p != "logits":             # the call's logits are the jitted ones
                        out[pre + f"{step}/{p}"] = v
            kc, vc = kc2, vc2
        out[pre + "k_cache"], out[pre + "v_cache"] = np.asarray(kc), np.asarray(vc)
        scen_meta[name] = dict(kv_window=window, batch=B, cache_len=M, prompt_len=prompt,
                               steps=steps, has_key_valid=key_valid is not None,
                               has_hist_valid=hist_valid is not None,
                               has_sink=sink is not None, ladder=name == "win")
        print(f"  decode/{name}: {len(calls)} calls, {time.perf_counter() - t0:.0f} s", flush=True)
    return eager_diff


# ---------------------------------------------------------------- training graph and heads
def run_arch(cfg, full_tree, rng, out):
    t0, V = time.perf_counter(), cfg.vocab_size
    toks = rng.integers(1, V, size=(2, 20), dtype=np.int64).astype(np.int32)
    htoks = rng.integers(1, V, size=(2, 20), dtype=np.int64).astype(np.int32)
    htoks[1, -4:] = cfg.pad_token_id            # row 1 ends with 4 pads
    out["arch/tokens"], out["heads/tokens"] = toks, htoks
    variables = {"params": full_tree}

    def call(model, tokens, method=None, **kw):
        fn = jax.jit(lambda v, t: model.apply(v, t, method=method, **kw))
        return np.asarray(fn(variables, jnp.asarray(tokens)).astype(jnp.float32))

    S = arch.SimpleAttentionNetwork
    f32, bf16 = upstream_model(cfg, dtype="float32"), upstream_model(cfg, dtype="bfloat16")
    out["arch/f32/logits"] = call(f32, toks)
    out["arch/f32_noflash/logits"] = call(upstream_model(cfg, dtype="float32", flash=False), toks)
    out["arch/bf16/logits"] = call(bf16, toks)
    out["arch/f32/cells"] = call(f32, toks, S.hidden_cells)
    out["arch/f32/cells_w8"] = call(f32, toks, S.hidden_cells, window=8)
    out["heads/contrastive"] = call(f32, htoks, S.encode_contrastive)
    out["heads/contrastive_w8"] = call(f32, htoks, S.encode_contrastive, window=8)
    out["heads/confidence"] = call(f32, htoks, S.forward_confidence)
    out["heads/confidence_w8"] = call(f32, htoks, S.forward_confidence, window=8)
    out["heads/bf16/contrastive"] = call(bf16, htoks, S.encode_contrastive)
    out["heads/bf16/confidence"] = call(bf16, htoks, S.forward_confidence)
    print(f"  arch + heads: {time.perf_counter() - t0:.0f} s", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out-dir", default=os.path.join("tests", "fixtures"))
    args = ap.parse_args()
    if jax.config.read("jax_enable_x64"):
        fail("jax_enable_x64 is on; upstream runs float32")

    cfg = reference.config.V2Config.preset("tiny")
    rng = np.random.default_rng(args.seed)
    ours, tree, full_tree = build_params(cfg, args.seed)
    print(f"params: {len(ours)} tensors match upstream's tree", flush=True)

    out = {f"params/{k}": v for k, v in ours.items()}
    cos, sin = arch.precompute_rope_freqs(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
    out["rope/cos"], out["rope/sin"] = np.asarray(cos), np.asarray(sin)

    etoks = np.stack([rng.integers(0, cfg.vocab_size, 16, dtype=np.int64),
                      rng.integers(0, 2**31, 16, dtype=np.int64)]).astype(np.int32)
    orders, heads, _ = arch.engram_geometry(upstream_model(cfg).config)
    out["engram/tokens"] = etoks
    out["engram/indices"] = np.asarray(arch.engram_indices(jnp.asarray(etoks), orders, heads,
                                                           cfg.engram_slots)).astype(np.int32)

    scen_meta = {}
    eager_diff = run_decode(cfg, tree, rng, out, scen_meta)
    run_arch(cfg, full_tree, rng, out)

    for k, v in out.items():                     # dtype discipline: f32, int32 or uint8 only
        if v.dtype not in (np.float32, np.int32, np.uint8):
            fail(f"tensor {k!r} has dtype {v.dtype}")
    out = {k: np.ascontiguousarray(out[k]) for k in sorted(out)}
    manifest = {
        "schema": 1,
        "generator": "tools/gen_upstream_fixture.py",
        "upstream": {"package": "cactus-needle", "version": md.version("cactus-needle"),
                     "jax": md.version("jax"), "jaxlib": md.version("jaxlib"),
                     "flax": md.version("flax")},
        "config": cfg.to_dict(),
        "seed": args.seed,
        "perturbed": True,
        "scenarios": scen_meta,
        "ladder_order": ladder_order(cfg),
        "jit_vs_eager_max_abs": max(eager_diff.values()),
        "jit_vs_eager_max_abs_by_tensor": eager_diff,
        "sha256": {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in out.items()},
    }
    missing = [p for p in manifest["ladder_order"] if f"decode/win/prefill/{p}" not in out]
    if missing:
        fail(f"ladder points missing from the output: {missing[:5]}")

    os.makedirs(args.out_dir, exist_ok=True)
    st_path = os.path.join(args.out_dir, "upstream_v2.safetensors")
    js_path = os.path.join(args.out_dir, "upstream_v2.json")
    save_file(out, st_path + ".tmp")             # write-then-rename: never a half-written pair
    with open(js_path + ".tmp", "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    os.chmod(st_path + ".tmp", 0o644)            # safetensors writes 0600; fixtures are shared
    os.replace(st_path + ".tmp", st_path)
    os.replace(js_path + ".tmp", js_path)
    print(f"wrote {st_path} ({os.path.getsize(st_path)} bytes, {len(out)} tensors), {js_path}; "
          f"jit vs eager max abs {manifest['jit_vs_eager_max_abs']:.3g}")


if __name__ == "__main__":
    main()
