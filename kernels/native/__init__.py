"""The native CPU step (needle_step.c): built with the system C compiler on first use, loaded
with ctypes. Imports neither reference/ nor port/.

The shared library is cached under $NEEDLE_NATIVE_CACHE (default ~/.cache/needle-parity),
named by a hash of the source, the flags, the compiler's version and the CPU, and written
atomically, so concurrent first uses and upgrades never load a stale or half-written build.
The flags keep IEEE float32 semantics (no fast-math, no FMA contraction): the bits depend on
the source and the C library's expf/logf, not on the vector width the compiler picks.

On load the library's own capture table (nat_capture_name) and struct sizes (nat_struct_size)
are checked against the mirrors below; a mismatch refuses with NativeMismatch naming both.
`planted_build("NEEDLE_FAULT_...")` switches to a build with one compile-time fault (its own
cached library; ladder/sides/faults.py uses it to prove the harness locates bugs in the C step).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = [os.path.join(HERE, f) for f in ("needle_step.c", "dots.c", "cq_packed.c",
                                                "cq_wide.c")]
HEADERS = [os.path.join(HERE, f) for f in ("native.h", "captures.h", "faults.h", "stages.h")]
PROGRAM = os.path.join(HERE, "needle_trace.c")      # the standalone executable's main
# $NEEDLE_NATIVE_MARCH overrides -march (e.g. x86-64: no AVX, the scalar paths), which is
# how tests/port/test_native.py checks that the vector width changes no bit.
MARCH = os.environ.get("NEEDLE_NATIVE_MARCH", "native")
FLAGS = ["-O3", f"-march={MARCH}", "-ffp-contract=off", "-fno-fast-math", "-fopenmp", "-fPIC",
         "-shared"]
CAPTURES = ("nx", "hpre", "u", "alpha", "bx", "h_in", "q", "k", "v", "attn", "gate",
            "attn_out", "attn_post", "mlp_in", "mlp_out", "block_out", "y", "hpost",
            "res_logits", "hres", "x", "lane_mean", "embed", "engram_k", "engram_v")
# ^ the order of the step's `cap` array: checked against the C table (nat_capture_name) at load

STAGE_CLOCK = "NEEDLE_STAGE_CLOCK"  # stages.h: the per-stage clock's build (bench only)
_libs: dict = {}            # defines -> loaded library
_planted: tuple = ()        # the compile-time fault switches of the library lib() returns


class NativeUnavailable(RuntimeError):
    """The native step cannot be built or loaded here (no C compiler, or it failed)."""


class NativeMismatch(RuntimeError):
    """The loaded library does not match its ctypes mirror (struct sizes or capture table):
    a stale or foreign build, or a C edit without the matching Python edit."""


_P = ctypes.POINTER(ctypes.c_float)
_I64 = ctypes.c_int64


class CqMat(ctypes.Structure):
    _fields_ = [("packed", ctypes.POINTER(ctypes.c_uint8)), ("norms", _P), ("levels", _P),
                ("rows", _I64), ("in_features", _I64), ("in_pad", _I64), ("row_bytes", _I64),
                ("bits", _I64)]


class NModel(ctypes.Structure):
    _fields_ = ([(f, _I64) for f in ("L", "n", "d", "H", "KV", "hd", "hada", "max_seq", "vocab",
                                     "sinkhorn_iters")]
                + [(f, ctypes.c_float) for f in ("eps", "attn_scale", "walsh_scale")]
                + [(f, _P) for f in ("emb", "qkvg", "out", "router", "qn", "kn", "pre", "post",
                                     "pre_hada", "attn_gate", "d1", "d2", "d3", "pre_bias",
                                     "post_bias", "a_pre", "a_post", "a_res", "b_res", "cos_t",
                                     "sin_t", "final_scale")]
                + [("site_of_layer", ctypes.POINTER(_I64))]
                + [(f, _I64) for f in ("sites", "T", "sub", "taps", "dil", "ering")]
                + [(f, ctypes.POINTER(_P)) for f in ("tables", "eng_kv", "eng_taps")]
                + [(f, _I64) for f in ("cq", "cq_max_in")]
                + [(f, ctypes.POINTER(CqMat)) for f in ("cq_qkvg", "cq_out", "cq_router",
                                                        "cq_emb", "cq_eng_kv", "cq_tables")])


class NState(ctypes.Structure):
    _fields_ = [("k", _P), ("v", _P), ("key_ok", ctypes.POINTER(ctypes.c_uint8)),
                ("lanes", _P), ("hidden", _P), ("vraw", _P), ("R", _I64), ("window", _I64)]


def ptr(t: torch.Tensor, kind=_P):
    """A C pointer to a contiguous CPU tensor's data (the caller keeps the tensor alive)."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(f"native kernels need contiguous CPU tensors, got {t.device} "
                         f"strides {t.stride()}")
    return ctypes.cast(t.data_ptr(), kind)


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise NativeUnavailable("no C compiler found for the native CPU step (set CC, or "
                                "install gcc); the torch backend needs none")
    return cc


def _cache_dir() -> str:
    return os.environ.get("NEEDLE_NATIVE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "needle-parity")


def _cpu_id() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    return platform.machine() + "".join(lines)


def build(defines: tuple = (), program: bool = False) -> str:
    """Path of the shared library, compiling it when no matching build is cached. `defines`:
    compile-time fault switches (NEEDLE_FAULT_...), each set built and cached on its own.
    `program`: the standalone executable `needle_trace` instead (needle_trace.c's main over
    the same step; no Python in its process)."""
    for d in defines:
        if not re.fullmatch(r"NEEDLE_FAULT_[A-Z0-9_]+", d) and d != STAGE_CLOCK:
            raise ValueError(f"{d!r} is not a fault switch (NEEDLE_FAULT_[A-Z0-9_]+)")
    base = [f for f in FLAGS if f not in ("-fPIC", "-shared")] if program else FLAGS
    flags = base + [f"-D{d}" for d in sorted(defines)]
    sources = SOURCES + [PROGRAM] if program else SOURCES
    cc = _compiler()
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                                 timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeUnavailable(f"C compiler {cc!r} does not run: {e}") from e
    src = b""
    for path in sources + HEADERS:
        try:
            with open(path, "rb") as f:
                src += f.read()
        except OSError as e:
            # An install that left out the C files (package data) lands here, not in the
            # compiler: say which file, so the fix (reinstall) is obvious.
            raise NativeUnavailable(f"cannot read the native step's source {path}: "
                                    f"{e.strerror}; this install of needle-parity lacks its "
                                    f"C files (reinstall it), or use the torch backend") from e
    key = hashlib.sha256(src + " ".join(flags).encode() + version.encode()
                         + _cpu_id().encode()).hexdigest()[:16]
    out_dir = _cache_dir()
    path = os.path.join(out_dir, f"needle_trace-{key}" if program else f"needle_step-{key}.so")
    if os.path.exists(path):
        return path
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    what = "the standalone program needle_trace" if program else "the native step"
    switches = f" with {', '.join(defines)}" if defines else ""
    # A first build takes seconds of silence: say what is happening, and where it is kept.
    print(f"building {what}{switches} with {os.path.basename(cc)} (once; cached in {out_dir})",
          file=sys.stderr, flush=True)
    try:
        res = subprocess.run([cc, *flags, "-o", tmp, *sources, "-lm"], capture_output=True,
                             text=True, timeout=300)
        if res.returncode != 0:
            raise NativeUnavailable(f"compiling {sources} with {cc} failed:\n{res.stderr}")
        if program:
            os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def lib():
    """The loaded library (built on first use): the clean build, or inside `planted_build`
    the faulty one."""
    so = _libs.get(_planted)
    if so is None:
        so = _bind(ctypes.CDLL(build(_planted)))
        _check_mirrors(so)
        _libs[_planted] = so
    return so


def _bind(so):
    so.nat_gemm.argtypes = [_P, _I64, _P, _I64, _I64, _P]
    so.nat_set_threads.argtypes = [_I64]
    cqp = ctypes.POINTER(CqMat)
    so.nat_cq_product.argtypes = [cqp, _I64, _P, _I64, _I64, _P, _I64, _P]
    so.nat_cq_rotate.argtypes = [_P, _I64, _I64, _P]
    so.nat_cq_row.argtypes = [cqp, _I64, _P, _P]
    so.nat_sinkhorn.argtypes = [_P, _I64, _I64]
    so.nat_scratch_floats.argtypes = [ctypes.POINTER(NModel), _I64]
    so.nat_scratch_floats.restype = _I64
    i64p, u8p = ctypes.POINTER(_I64), ctypes.POINTER(ctypes.c_uint8)
    so.nat_rows.argtypes = [ctypes.POINTER(NModel), ctypes.POINTER(NState), _I64, _I64,
                            i64p, i64p, _P, u8p, u8p, _P, ctypes.POINTER(_P), _I64, _P]
    so.nat_rows.restype = _I64
    so.nat_layer.argtypes = [ctypes.POINTER(NModel), ctypes.POINTER(NState), _I64, _I64, _P,
                             _P, _P, i64p, _P, u8p, ctypes.c_uint8, _P, ctypes.POINTER(_P)]
    so.nat_layer.restype = _I64
    so.nat_capture_count.restype = _I64
    so.nat_capture_name.argtypes = [_I64]
    so.nat_capture_name.restype = ctypes.c_char_p
    so.nat_struct_size.argtypes = [_I64]
    so.nat_struct_size.restype = _I64
    return so


def _check_mirrors(so):
    """Refuse a library whose structs or capture table differ from the mirrors here."""
    for which, name in enumerate(("NModel", "NState", "CqMat")):
        c_size, mirror = so.nat_struct_size(which), globals()[name]
        if c_size != ctypes.sizeof(mirror):
            raise NativeMismatch(f"sizeof({name}) is {c_size} bytes in the C library "
                                 f"but {ctypes.sizeof(mirror)} in its ctypes mirror "
                                 f"(kernels/native/__init__.py): update the mirror with native.h")
    names = tuple(so.nat_capture_name(i).decode() for i in range(so.nat_capture_count()))
    if names != CAPTURES:
        raise NativeMismatch(f"the C step captures {names}, its ctypes mirror expects "
                             f"{CAPTURES}: update CAPTURES with needle_step.c's NAT_CAPTURES")


@contextmanager
def planted_build(*defines: str):
    """Inside, lib() is the step built with these compile-time fault switches (its own cached
    library); models bound before read it too, since they call lib() per step."""
    global _planted
    old, _planted = _planted, tuple(sorted(defines))
    try:
        lib()
        yield
    finally:
        _planted = old


def stage_build():
    """Inside, lib() is the step built with the per-stage clock (stages.h; the same arithmetic,
    the same bits); tools/bench/bench_native_stages.py reads it with stage_take()."""
    return planted_build(STAGE_CLOCK)


def stage_take() -> dict:
    """Milliseconds per stage since the last call (the stage_build library), then zeroed."""
    so = lib()
    so.nat_stage_name.restype = ctypes.c_char_p
    names = []
    while so.nat_stage_name(_I64(len(names))):
        names.append(so.nat_stage_name(_I64(len(names))).decode())
    out = (ctypes.c_double * len(names))()
    so.nat_stage_take(out)
    return {n: v / 1e6 for n, v in zip(names, out)}


def set_threads(n: int) -> None:
    """Threads for the weight products (output rows split; bits do not depend on it)."""
    lib().nat_set_threads(int(n))


def unavailable_reason() -> str | None:
    """None when the native step builds and loads here; otherwise why not, in one line."""
    try:
        lib()
    except NativeUnavailable as e:
        return str(e)
    except OSError as e:                # ctypes could not load the library it built
        return f"the native step's library does not load: {e}"
    return None


def available() -> bool:
    return unavailable_reason() is None


def _f32(x: torch.Tensor, name: str) -> torch.Tensor:
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"{name} must be a float32 CPU tensor, got {x.dtype} on {x.device}")
    return x.contiguous()


def gemm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] times w [N, K] (row-major [out, in]) -> [M, N]; row r's bits do not depend
    on M."""
    x, w = _f32(x, "x"), _f32(w, "w")
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"gemm needs x [M, K] and w [N, K]; got {list(x.shape)}, "
                         f"{list(w.shape)}")
    M, K, N = x.shape[0], x.shape[1], w.shape[0]
    if out is None:
        out = torch.empty(M, N)
    elif tuple(out.shape) != (M, N) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous float32 [{M}, {N}], got {out.dtype} "
                         f"{list(out.shape)}")
    lib().nat_gemm(ptr(x), M, ptr(w), N, K, ptr(out))
    return out


MAX_IN = 4096           # cq_packed.c: widest padded input of a packed matrix


class PackedCq:
    """One CQ matrix as the C side's CqMat: the codes as stored (`bits` wide, LSB first),
    float32 norms, and `levels` (the level of each code value). Keeps the tensors it points
    to alive. `row0`/`rows` select a band of rows."""

    def __init__(self, packed, norms, levels, bits: int, in_features: int, row0: int = 0,
                 rows: int | None = None):
        rows = packed.shape[0] - row0 if rows is None else rows
        if packed.dtype != torch.uint8 or packed.dim() != 2 or bits not in (2, 3, 4) or \
                levels.numel() != 1 << bits:
            raise ValueError(f"packed CQ needs 2-D uint8 codes of 2, 3 or 4 bits and 2**bits "
                             f"levels; got {packed.dtype} {list(packed.shape)}, bits={bits}, "
                             f"{levels.numel()} levels")
        in_pad = packed.shape[1] * 8 // bits
        if not 0 <= row0 <= row0 + rows <= packed.shape[0] or in_pad % 128 or \
                in_pad > MAX_IN or not 0 < in_features <= in_pad:
            raise ValueError(f"rows {row0}..{row0 + rows - 1} of {packed.shape[0]}, in_pad "
                             f"{in_pad} (in_features {in_features}): outside the matrix, not "
                             f"whole 128-groups, or wider than MAX_IN={MAX_IN}")
        self.packed = packed[row0:row0 + rows].contiguous()
        self.norms = norms[row0:row0 + rows].to(torch.float32).contiguous()
        self.levels = torch.zeros(16)
        self.levels[:1 << bits] = levels.to(torch.float32)
        self.mat = CqMat(packed=ptr(self.packed, ctypes.POINTER(ctypes.c_uint8)),
                         norms=ptr(self.norms), levels=ptr(self.levels), rows=rows,
                         in_features=in_features, in_pad=in_pad,
                         row_bytes=packed.shape[1], bits=bits)
        self.rows, self.in_features, self.in_pad = rows, in_features, in_pad


def cq_array(mats: list):
    """A C array of CqMat values (the PackedCq objects must outlive it)."""
    return (CqMat * len(mats))(*[m.mat for m in mats])


def cq_product(mats: list, x: torch.Tensor) -> torch.Tensor:
    """x [M, in_features] times the concatenated rows of `mats` (PackedCq of one input width)
    -> [M, sum of rows]."""
    x = _f32(x, "x")
    if x.dim() != 2 or any(m.in_features != x.shape[1] or m.in_pad != mats[0].in_pad
                           for m in mats):
        raise ValueError(f"x {list(x.shape)} does not fit the matrices' in_features "
                         f"{[m.in_features for m in mats]}")
    n = sum(m.rows for m in mats)
    y = torch.empty(x.shape[0], n)
    xp = torch.empty(x.shape[0], mats[0].in_pad)
    lib().nat_cq_product(cq_array(mats), len(mats), ptr(x), x.shape[0], x.shape[1], ptr(y), n,
                         ptr(xp))
    return y


def cq_rotate(x: torch.Tensor, in_pad: int) -> torch.Tensor:
    """The C side's input rotation: x [M, K] zero-padded to in_pad, Walsh-rotated per
    128-group (butterflies, then 1/sqrt(128))."""
    x = _f32(x, "x")
    out = torch.empty(x.shape[0], in_pad)
    for r in range(x.shape[0]):
        lib().nat_cq_rotate(ptr(x[r].contiguous()), x.shape[1], in_pad, ptr(out[r]))
    return out


def cq_row(mat: "PackedCq", r: int) -> torch.Tensor:
    """Row r of the dequantised matrix [in_features]."""
    if not 0 <= r < mat.rows:
        raise ValueError(f"row {r} outside 0..{mat.rows - 1}")
    out, tmp = torch.empty(mat.in_features), torch.empty(mat.in_pad)
    lib().nat_cq_row(ctypes.byref(mat.mat), r, ptr(out), ptr(tmp))
    return out


def sinkhorn(z: torch.Tensor, iters: int = 20) -> torch.Tensor:
    """The step's log-domain Sinkhorn of one n x n matrix, then exp (a copy; z is kept)."""
    z = _f32(z, "z").clone()
    if z.dim() != 2 or z.shape[0] != z.shape[1]:
        raise ValueError(f"sinkhorn needs a square matrix, got {list(z.shape)}")
    lib().nat_sinkhorn(ptr(z), z.shape[0], int(iters))
    return z
