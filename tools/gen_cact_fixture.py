"""Generate the .cact fixtures from the real cactus-needle 2.0.8 exporter, reader and decoder.

Writes into tests/fixtures/:
  cact_tok.model                 a small SentencePiece BPE model trained here (identity
                                 normalisation, byte fallback, the ten chat markers at ids 4-13)
  cact_<scheme>.cact             upstream-written files: CQ widths 2, 3, 4, ternary and a mix
  cact_upstream.safetensors      upstream's read_export tensors per slot, and upstream's decode
                                 logits on those dequantised weights
  cact_upstream.json             manifest: geometry, header, directory, sha256 of upstream's
                                 unpacked codes per CQ slot, tokenizer, RefTokenizer cases, and
                                 the in-process proofs below
Upstream is only imported and called; none of its code lives in this repository.

Checked here, in one process, before anything is written (the run fails otherwise):
  * our reader re-emits every upstream file byte for byte, and unpacks the same codes;
  * numpy's matmul of our pre-rotation rows with upstream's Hadamard matrix equals upstream's
    read_export bit for bit for every CQ slot (so only the BLAS summation order separates
    upstream's dequantisation from our correctly rounded one), FP16 slots are bit-equal;
  * upstream's read_export of a file *we* wrote gives the same tensors as our reader;
  * the slot -> flax-path mapping agrees with upstream's own flax-layout fake quantisation
    (quantize.cq_mixed_params), so the decode logits do not share a mapping bug with us.

Run from the repository root with the upstream venv (see tools/gen_upstream_fixture.py):
    /work/venv-up/bin/python tools/gen_cact_fixture.py [--out-dir tests/fixtures]
Deterministic: two runs on one machine give byte-identical files.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import io
import json
import os
import sys
import struct
import tempfile
import time

os.environ["JAX_PLATFORMS"] = "cpu"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import jax                                      # noqa: E402
import jax.numpy as jnp                         # noqa: E402
import numpy as np                              # noqa: E402
import sentencepiece as spm                     # noqa: E402
import torch                                    # noqa: E402
from flax import traverse_util                  # noqa: E402
from safetensors.numpy import save_file         # noqa: E402

from needle.model import architecture as arch   # noqa: E402
from needle.model import decode as dm           # noqa: E402
from needle.model import export as ex           # noqa: E402
from needle.model import quantize as qz         # noqa: E402
from needle.model import tokenizer as utok      # noqa: E402
from reference import cact, cq                  # noqa: E402
from reference.cact_layout import params_from_slots  # noqa: E402
from reference.config import V2Config           # noqa: E402
from reference.params import init_params        # noqa: E402

VOCAB = 512
SEED = 11
# name, bits map, probe heads kept, tokenizer embedded
SCHEMES = (("w2", "default=2", ("contrastive_head", "confidence_head"), True),
           ("w3", "default=3", (), False),
           ("w4", "default=4", ("contrastive_head", "confidence_head"), True),
           ("t158", "default=1.58", ("confidence_head",), True),
           ("mixed", "embedding=4,mhc=4,attn.q_proj=3,engram0=1.58,default=2",
            ("contrastive_head", "confidence_head"), True))
TEXTS = ("", "a", " ", "  leading and trailing  ", "hello world", "Hello, World! 123",
         "<|im_start|>user\nhi<|im_end|>", "<tools>[]</tools><tool_call>x</tool_call>",
         "<|im_start|><|im_end|><think></think>", "<|im_start", "café naïve Grüße",
         "日本語のテキスト", "emoji \U0001F600 and \u2581 itself", "<s> </s> <unk> <0x41>",
         "line1\nline2\ttab", "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}",
         "aaaaaaaaaaaaaaaa", "the the the the")
WORDS = ("the of and to in is you that it he was for on are as with his they at be this "
         "have from or one had by word but not what all were we when your can said there use "
         "an each which she do how their if will up other about out many then them these so "
         "some her would make like him into time has look two more write go see number no way "
         "could people my than first water been call who oil its now find long down day did "
         "get come made may part weather city search email send message calendar event tool "
         "call result query user assistant name arguments location date time json value "
         "café naïve Grüße").split()


def fail(msg):
    print(f"gen_cact_fixture: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def train_tokenizer(path):
    rng = np.random.default_rng(SEED)
    lines = []
    for _ in range(4000):
        words = [WORDS[i] for i in rng.integers(0, len(WORDS), rng.integers(3, 14))]
        kind = rng.integers(0, 4)
        if kind == 0:
            line = " ".join(words).capitalize() + "."
        elif kind == 1:
            line = json.dumps({"name": "_".join(words[:2]), "arguments": {words[2]: int(
                rng.integers(0, 1000))}}, separators=(",", ":"))
        elif kind == 2:
            line = f"<|im_start|>user <tools>[]</tools> {' '.join(words)}?<|im_end|>"
        else:
            line = " ".join(words) + f" {int(rng.integers(0, 100000))}"
        lines.append(line)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type="bpe",
        vocab_size=VOCAB, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, byte_fallback=True, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
        user_defined_symbols=list(utok.CHAT_MARKERS), character_coverage=0.9995,
        num_threads=1, minloglevel=2)
    with open(path, "wb") as f:
        f.write(model.getvalue())
    sp = spm.SentencePieceProcessor(model_file=path)
    if sp.GetPieceSize() != VOCAB:
        fail(f"tokenizer has {sp.GetPieceSize()} pieces, wanted {VOCAB}")
    for i, m in enumerate(utok.CHAT_MARKERS):
        if sp.PieceToId(m) != 4 + i:
            fail(f"chat marker {m} got id {sp.PieceToId(m)}, upstream expects {4 + i}")
    return utok.SANTokenizer(path)


def nested(flat):
    return traverse_util.unflatten_dict({tuple(k.split("/")): np.asarray(v, np.float32)
                                         for k, v in flat.items()})


def sha(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def directory(data):
    """The records of a .cact file, parsed here with struct (not by the reader under test)."""
    n, cb_len = struct.unpack_from("<I", data, 4)[0], struct.unpack_from("<I", data, 8)[0]
    start = struct.calcsize(ex._HDR_FMT) + 4 * cb_len
    out = []
    for i in range(n):
        dt, ndim, _, *dims, off, nbytes, group, bits = struct.unpack_from(
            ex._REC_FMT, data, start + ex.REC_SIZE * i)
        out.append({"dtype": dt, "shape": dims[:ndim], "offset": off, "nbytes": nbytes,
                    "group": group, "bits": bits})
    return out


def upstream_codes(data, rec):
    """Upstream's own unpacking of a CQ record's indices."""
    (out, in_dim), g = rec["shape"], rec["group"]
    in_pad = -(-in_dim // g) * g
    n = out * ex._packed_row_bytes(in_pad, rec["bits"], g)
    packed = np.frombuffer(data[rec["offset"]:rec["offset"] + n], np.uint8).reshape(out, -1)
    if rec["bits"] == ex.TERNARY_RECORD_BITS:
        return ex._unpack_ternary_crumbs(packed, in_pad)
    return ex._unpack_lsb(packed, rec["bits"], in_pad)


def prove_reader(path, ours, up_tensors, name):
    """Our reader against upstream's on one file: codes, pre-rotation, FP16, RAW."""
    data = open(path, "rb").read()
    recs = directory(data)
    H = qz._cq_hadamard_np(cq.GROUP)
    worst = 0.0
    for slot, up in zip(ours.slots, up_tensors):
        if slot.dtype == cact.DTYPE_RAW:
            if bytes(up) != slot.raw:
                fail(f"{name}: tokenizer blob differs")
            continue
        if slot.dtype == cact.DTYPE_CQ:
            if not np.array_equal(upstream_codes(data, recs[slot.index]), slot.codes().numpy()):
                fail(f"{name}: slot {slot.index} {slot.name}: codes differ from upstream's")
            v = cq.prerotation(slot.codes(), slot.norms, slot.bits).numpy()
            out, in_dim = slot.shape
            via = (v.reshape(out, -1, cq.GROUP) @ H).reshape(out, -1)[:, :in_dim]
            if not np.array_equal(via.view(np.uint32), up.view(np.uint32)):
                fail(f"{name}: slot {slot.index} {slot.name}: numpy(prerotation @ H) is not "
                     f"bitwise upstream's read_export")
            mine = slot.dequantize().numpy()
            worst = max(worst, float(np.abs(mine.astype(np.float64) - up).max()
                                     / max(np.abs(up).max(), 1e-30)))
        elif not np.array_equal(slot.dequantize().numpy().view(np.uint32),
                                np.asarray(up, np.float32).view(np.uint32)):
            fail(f"{name}: slot {slot.index} {slot.name}: FP16 values differ")
    return worst


def check_mapping(name, ours_params, tree, bits_map, heads):
    """Our slot -> flax mapping vs upstream's flax-layout CQ fake quantisation."""
    table, default = qz.parse_bits_map(bits_map)
    fq = traverse_util.flatten_dict(
        jax.tree.map(np.asarray, qz.cq_mixed_params(jax.tree.map(jnp.asarray, tree), table,
                                                    default)), sep="/")
    orig = traverse_util.flatten_dict(tree, sep="/")
    report = {}
    for key, mine in ours_params.items():
        mine = mine.numpy()
        leaf = key.split("/")[-1]
        quantised = (leaf in ("kernel", "embedding") or leaf.startswith("mhc_phi")) \
            and mine.ndim >= 2 and key.split("/")[0] not in heads
        # CQ slots against upstream's fake quantisation; the rest is stored as FP16.
        ref = fq[key] if quantised else orig[key].astype(np.float16).astype(np.float32)
        if ref.shape != mine.shape:
            fail(f"{name}: {key}: shape {mine.shape} vs upstream {ref.shape}")
        far = np.abs(mine - ref) > 1e-5 * np.abs(ref).max()
        report[key] = int(far.sum())
        # A mapping error moves nearly everything; an index tie flipped by XLA vs numpy
        # rotation order moves one 128-group of one row.
        if far.sum() > cq.GROUP:
            fail(f"{name}: {key}: {int(far.sum())} of {far.size} elements differ from "
                 f"upstream's flax-layout fake quantisation")
    return report


def run_decode(cfg, tree, tokens, prompt_len):
    tcfg = arch.TransformerConfig(**{**cfg.to_dict(), "engram_orders": tuple(cfg.engram_orders)})
    M = len(tokens)
    dcfg = dm.decode_cfg(tcfg, kv_window=cfg.kv_window)
    cos, sin = dm.precompute_rope_freqs(cfg.head_dim, M, cfg.rope_theta)
    kc, vc = dm.init_kv_cache(tcfg, 1, M)
    toks = np.asarray([tokens], np.int32)
    hist, valid = jnp.asarray(toks), jnp.ones((1, M), bool)
    out = {}
    calls = [("prefill", 0, prompt_len)] + [(f"step{t:02d}", t, 1) for t in range(prompt_len, M)]
    for call, pos, S in calls:
        logits, kc, vc = dm.forward_cached(tree, dcfg, jnp.asarray(toks[:, pos:pos + S]), kc, vc,
                                           jnp.asarray(pos, jnp.int32), cos, sin, None, False,
                                           hist, valid, None)
        out[call] = np.asarray(logits)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=os.path.join(REPO, "tests", "fixtures"))
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    # The tiny preset with four layers (each lane active once) keeps the fixture near 2.5 MB.
    cfg = V2Config.preset("tiny").replace(vocab_size=VOCAB, num_layers=4, engram_layers=(1, 3))
    tok = train_tokenizer(os.path.join(args.out_dir, "cact_tok.model"))
    full = {k: v.numpy() for k, v in init_params(cfg, seed=SEED, perturbed=True).items()}
    ref_tok = None
    tensors, manifest = {}, {"config": cfg.to_dict(), "seed": SEED, "files": {},
                             "versions": {p: md.version(p) for p in
                                          ("cactus-needle", "jax", "numpy", "sentencepiece")}}
    rng = np.random.default_rng(SEED)
    for name, bits_map, heads, with_tok in SCHEMES:
        flat = {k: v for k, v in full.items() if "_head/" not in k or k.split("/")[0] in heads}
        path, t0 = os.path.join(args.out_dir, f"cact_{name}.cact"), time.perf_counter()
        ex.write_export(nested(flat), arch.TransformerConfig(**{**cfg.to_dict(), "engram_orders":
                                                               tuple(cfg.engram_orders)}),
                        path, bits_map=bits_map, tokenizer=tok if with_tok else None,
                        kv_window=cfg.kv_window)
        data = open(path, "rb").read()
        meta, up = ex.read_export(path)
        ours = cact.read_cact(path)
        if ours.to_bytes() != data:
            fail(f"{name}: our reader does not re-emit upstream's bytes")
        worst = prove_reader(path, ours, up, name)
        # A file we write, read by upstream.
        with tempfile.TemporaryDirectory() as tmp:
            mine_path = os.path.join(tmp, "m.cact")
            mine = cact.write_cact(mine_path, {k: torch.from_numpy(v) for k, v in flat.items()},
                                   cfg, bits_map, tok if with_tok else None, cfg.kv_window)
            _, up_mine = ex.read_export(mine_path)
            prove_reader(mine_path, cact.read_cact(mine_path), up_mine, name + "(ours)")
            mine_bytes = open(mine_path, "rb").read()
        agree = {"bytes_equal": mine_bytes == data, "codes_differ": 0, "codes_total": 0,
                 "norms_differ": 0, "norms_total": 0}
        for a, b in zip(ours.slots, cact.parse_cact(mine_bytes).slots):
            if a.dtype == cact.DTYPE_CQ:
                agree["codes_differ"] += int((a.codes() != b.codes()).sum())
                agree["codes_total"] += a.codes().numel()
                agree["norms_differ"] += int((a.norms.view(torch.int16)
                                              != b.norms.view(torch.int16)).sum())
                agree["norms_total"] += a.norms.numel()
            elif a.blob() != b.blob():
                fail(f"{name}: our writer's slot {a.index} {a.name} differs from upstream's")
        print(f"  {name}: proofs {time.perf_counter() - t0:.0f} s", flush=True)
        mapping = check_mapping(name, ours.params, nested(flat), bits_map, heads)
        # Upstream decode on upstream's dequantised tensors, placed by our mapping (checked above).
        up_params = params_from_slots({s.name: torch.from_numpy(np.asarray(t, np.float32))
                                       for s, t in zip(ours.slots, up)
                                       if s.dtype != cact.DTYPE_RAW}, ours.config)
        dec_tree = nested({k: v.numpy() for k, v in up_params.items() if "_head/" not in k})
        if with_tok:
            ref_tok = ex.RefTokenizer.from_cact(path)
            prompt = [utok.BOS_ID] + ref_tok.encode("<|im_start|>user\nwhat is the weather "
                                                    "in Paris?<|im_end|>\n")
        else:
            prompt = [utok.BOS_ID] + rng.integers(14, VOCAB, 11).tolist()
        prompt = (prompt + rng.integers(14, VOCAB, 14).tolist())[:14]     # fixed shapes:
        tokens = prompt + rng.integers(14, VOCAB, 10).tolist()
        print(f"  {name}: mapping {time.perf_counter() - t0:.0f} s", flush=True)
        logits = run_decode(ours.config, dec_tree, tokens, len(prompt))
        print(f"  {name}: decode {time.perf_counter() - t0:.0f} s", flush=True)
        for i, t in enumerate(up):
            if not isinstance(t, (bytes, bytearray)):
                tensors[f"{name}/slot{i:03d}"] = np.ascontiguousarray(t, np.float32)
        for call, v in logits.items():
            tensors[f"{name}/logits/{call}"] = v
        manifest["files"][name] = {
            "file": os.path.basename(path), "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(), "bits_map": bits_map,
            "heads": list(heads), "tokenizer": with_tok,
            "header": {k: (float(v) if isinstance(v, float) else v) for k, v in meta.items()
                       if k != "codebook"},
            "codebook_hex": [f"{int(x):08x}" for x in meta["codebook"].view(np.uint32)],
            "slots": [dict(r, codes_sha256=sha(upstream_codes(data, r))
                           if r["dtype"] == ex.CQ else None) for r in directory(data)],
            "tokens": tokens, "prompt_len": len(prompt),
            "proofs": {"reemit_bytes_equal": True, "codes_equal": True,
                       "numpy_matmul_of_prerotation_bitwise_upstream": True,
                       "fp16_raw_equal": True, "upstream_reads_our_file": True,
                       "dequant_max_rel_vs_upstream": worst,
                       "mapping_elements_off_vs_cq_mixed_params": mapping,
                       "our_writer_vs_upstream_writer": agree},
        }
        print(f"  {name}: {len(data)} bytes, dequant max rel {worst:.2e}, writer codes "
              f"{agree['codes_differ']}/{agree['codes_total']} norms "
              f"{agree['norms_differ']}/{agree['norms_total']} differ", flush=True)
    blob = ex.parse_tokenizer_blob(cact.read_cact(os.path.join(args.out_dir, "cact_w2.cact"))
                                   .slot("tokenizer").raw)
    manifest["tokenizer"] = {k: blob[k] for k in ("pieces", "types", "pad_id", "eos_id", "bos_id",
                                                  "unk_id", "add_dummy_prefix", "byte_fallback")}
    manifest["tokenizer"]["scores_hex"] = [f"{int(x):08x}" for x in
                                           np.asarray(blob["scores"], np.float32).view(np.uint32)]
    manifest["tokenizer"]["cases"] = [{"text": t, "ids": ref_tok.encode(t),
                                       "decoded": ref_tok.decode(ref_tok.encode(t))} for t in TEXTS]
    save_file(tensors, os.path.join(args.out_dir, "cact_upstream.safetensors"),
              metadata={"manifest": "cact_upstream.json"})
    with open(os.path.join(args.out_dir, "cact_upstream.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True, ensure_ascii=True)
        f.write("\n")
    print("gen_cact_fixture: ok")


if __name__ == "__main__":
    main()
