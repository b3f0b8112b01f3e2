"""The operands of the triton backend's fused decode body (port/fused.py), laid out once at load.

Every matrix product of the body is a `Product`: either a float32 matrix in the model's [in, out]
view ("dense", or "rotated": the Cactus-Quants pre-rotation rows, whose input is zero-padded to
whole 128-groups and rotated first), or the packed codes themselves, the form a GPU streams:
about 13 MB per token at the shipped geometry instead of 137 MB of float32 rows. Packed
products come from the codes a cq model keeps beside its rows (`attach_codes`): the products
that share an input (q|k|v|gate, the three mHC routers, the Engram key|value) are joined row-wise
into one code matrix when their widths agree, so each stays one launch; when they do not, the
product is several blocks, each writing its rows of the output.

Dense weights stored 16-bit (a precision's `weights`, port/precision.py) are laid out as 16-bit
tensors here: the rows the model holds are float32 copies of those values, so the conversion is
exact and the products stream half the bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .cq import CqWeight


@dataclass
class CodeBlock:
    """Rows row0..row0+out-1 of a product, as packed codes (kernels/cq_gemv.py's contract)."""
    row0: int
    packed: torch.Tensor            # uint8 [out, bytes]
    norms: torch.Tensor             # float16 [out, groups]
    levels: torch.Tensor            # float32 level of each stored code value
    bits: int                       # stored code width (ternary travels as 2-bit crumbs)
    width: int                      # the file's width code (5: ternary), what may be joined

    @property
    def out(self) -> int:
        return self.packed.shape[0]

    def operands(self) -> tuple:
        return self.packed, self.norms, self.levels, self.bits


@dataclass
class Product:
    out_features: int
    w: torch.Tensor | None = None   # float32 [in or in_pad, out] view; None for codes
    rotate: bool = False            # the input is padded and rotated per 128-group first
    blocks: list = field(default_factory=list)      # CodeBlock, covering 0..out_features-1

    @property
    def packed(self) -> bool:
        return bool(self.blocks)


def _joined(weights: list, device) -> list:
    """One CodeBlock per run of consecutive weights of equal code width (rows concatenated)."""
    blocks, row0 = [], 0
    for cw in weights:
        packed, norms, levels, bits = cw.kernel_operands(device)
        last = blocks[-1] if blocks else None
        if last is not None and last.width == cw.bits:
            last.packed = torch.cat([last.packed, packed])
            last.norms = torch.cat([last.norms, norms])
        else:
            blocks.append(CodeBlock(row0, packed.contiguous(), norms.contiguous(),
                                    levels.contiguous(), bits, cw.bits))
        row0 += cw.out_features
    return blocks


def _row_slice(cw: CqWeight, r0: int, r1: int) -> CqWeight:
    """Rows r0..r1-1 of a code matrix as a CqWeight of its own (views of the payload)."""
    return CqWeight(cw.packed[r0:r1], cw.norms[r0:r1], cw.bits, cw.in_features, "packed")


def _stored(w, dtype):
    """w (float32, values already rounded to dtype) as a dtype tensor with w's strides."""
    low = w.to(dtype)                       # preserve_format: the [in, out] view's strides
    if not torch.equal(low.float(), w):
        raise ValueError(f"a dense weight holds values that {dtype} cannot represent: the "
                         f"model was not rounded to its declared weight storage")
    return low


@dataclass
class FusedWeights:
    """Per layer: the mHC router, q|k|v|gate and output products; per site: the Engram
    key|value product; the LM head."""
    router: list
    qkvg: list
    out: list
    engram_kv: list
    head: Product
    form: str                       # "dense", "rotated" or "packed"

    @classmethod
    def of(cls, model, weight_dtype=None) -> "FusedWeights":
        """`weight_dtype`: bfloat16 or float16 to hand dense matrices over in that dtype
        (their values must be representable in it: the model rounded them at load)."""
        cfg, dev = model.cfg, model.device
        L, n = cfg.num_layers, cfg.mhc_lanes
        rot = model.rotate
        codes = [lw.codes for lw in model.layers]
        if all(c is not None for c in codes) and model.mhc.codes is not None \
                and model.embedding.codes is not None:
            mc = model.mhc.codes
            widths = {"pre": n, "post": n, "res": n * n}
            router = [Product(2 * n + n * n, blocks=_joined(
                [_row_slice(mc[k], i * w, (i + 1) * w) for k, w in widths.items()], dev))
                for i in range(L)]
            qkvg = [Product(sum(c[k].out_features for k in ("q_proj", "k_proj", "v_proj",
                                                             "gate_proj")),
                            blocks=_joined([c[k] for k in ("q_proj", "k_proj", "v_proj",
                                                           "gate_proj")], dev))
                    for c in codes]
            out = [Product(cfg.d_model, blocks=_joined([c["out_proj"]], dev)) for c in codes]
            head = Product(cfg.vocab_size, blocks=_joined([model.embedding.codes], dev))
            engram_kv = []
            for site in model.engrams:
                sc = site.codes or {}
                kv = _joined([sc["key_proj"], sc["value_proj"]], dev) if sc else []
                # the prelude kernel takes one code matrix: mixed widths use the rows
                engram_kv.append(Product(2 * cfg.d_model, blocks=kv) if len(kv) == 1 else
                                 Product(2 * cfg.d_model, w=site.kv, rotate=rot))
            return cls(router, qkvg, out, engram_kv, head, "packed")
        narrow = (lambda w: w) if weight_dtype in (None, torch.float32) else \
            (lambda w: _stored(w, weight_dtype))
        router = [Product(2 * n + n * n, w=narrow(model.mhc.router[i]), rotate=rot)
                  for i in range(L)]
        qkvg = [Product(lw.qkvg.shape[1], w=narrow(lw.qkvg), rotate=rot) for lw in model.layers]
        out = [Product(cfg.d_model, w=narrow(lw.out), rotate=rot) for lw in model.layers]
        head = Product(cfg.vocab_size, w=narrow(model.embedding.head if rot else
                                                model.embedding.table.t()), rotate=rot)
        engram_kv = [Product(2 * cfg.d_model, w=narrow(site.kv), rotate=rot)
                     for site in model.engrams]
        return cls(router, qkvg, out, engram_kv, head, "rotated" if rot else "dense")
