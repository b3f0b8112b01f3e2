"""Refused calls of the V4.1 attention (spec §2.2, §2.3), reference and port: each raises
AttnV41Error naming the value and the limit, and leaves every piece of state bit-identical:
rings, compressor state, compressed and index-key caches, the shared (published) tensors and
which tensors they are, and in the port the decode position, the static selection buffers and
the record of what they hold."""
import copy
import re

import pytest
import torch

from ladder.v41.sides import run_side
from port.v41.attn import AttnStackV41 as PortStack
from port.v41.attn import AttnV41Error as PortError
from reference.v41.attn import AttnStackV41 as RefStack
from reference.v41.attn import AttnV41Error as RefError

SIDES = [(RefStack, RefError), (PortStack, PortError)]
IDS = ["reference", "port"]


def _bits(t):
    return t.detach().cpu().contiguous().view(torch.uint8).clone()


def snapshot(st):
    """Every per-sequence and per-upload piece of state, as raw bytes (and identities)."""
    snap = {"ring": [_bits(r) for r in st.ring]}
    for name in ("cache", "kcache", "kv_state", "score_state"):
        snap[name] = {k: _bits(v) for k, v in getattr(st, name).items()}
    snap["shared"] = {k: None if v is None else (id(v), v.dtype, tuple(v.shape), _bits(v))
                      for k, v in st.shared.items()}
    for name in ("pos", "idx_dev", "idx_dev_win", "last_selection"):      # port only
        if isinstance(getattr(st, name, None), torch.Tensor):
            snap[name] = _bits(getattr(st, name))
    if hasattr(st, "_uploaded"):
        snap["uploaded"] = copy.deepcopy(st._uploaded)
    return snap


def assert_same(a, b, where):
    assert a.keys() == b.keys(), where
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, dict):
            assert_same(x, y, f"{where}.{k}")
        elif isinstance(x, (list, tuple)):
            assert len(x) == len(y), f"{where}.{k}"
            for i, (u, v) in enumerate(zip(x, y)):
                if isinstance(u, torch.Tensor):
                    assert torch.equal(u, v), f"{where}.{k}[{i}] changed"
                else:
                    assert u == v, f"{where}.{k}[{i}] changed"
        elif isinstance(x, torch.Tensor):
            assert torch.equal(x, y), f"{where}.{k} changed"
        else:
            assert x == y, f"{where}.{k} changed"


def refused(st, err, call, msg):
    before = snapshot(st)
    with pytest.raises(err, match=re.escape(msg)):
        call()
    assert_same(before, snapshot(st), msg)


def _calls(man, scenario):
    return [c for c in man["calls"] if c["scenario"] == scenario]


def _after_prefill(v41_fx, cls, scenario, **kw):
    man, rec, w = v41_fx
    calls = _calls(man, scenario)
    st = cls(dict(man["model_args"], **kw), w)
    run_side(st, man, rec, calls[:1])
    return st, calls


@pytest.mark.parametrize("cls, err", SIDES, ids=IDS)
def test_refusals_leave_state_untouched(v41_fx, cls, err):
    man, rec, w = v41_fx
    st = cls(man["model_args"], w)
    x1 = rec[man["calls"][0]["key"]][0]["x"]
    # a fresh stack: layer 3 would write its ring slot before finding no compressed cache
    refused(st, err, lambda: st.forward(3, x1, 0), "before any kv source published")
    # after a 13-token prefill, a decode step of layer 3 without layer 2 (item: a 13-row
    # selection is no selection for one query) and of layer 6 without layer 4's filter
    st, calls = _after_prefill(v41_fx, cls, "p13")
    xd = rec[calls[1]["key"]][3]["x"]
    refused(st, err, lambda: st.forward(3, xd, 13),
            "reuses a selection no index source published for these 1 queries (published: "
            "[13, 6]")
    refused(st, err, lambda: st.forward(6, xd, 13),
            "index source 6 needs the candidate")
    refused(st, err, lambda: st.forward(8, xd, 13), "layer=8 outside 0..7")
    refused(st, err, lambda: st.forward(0, xd.float(), 13), "bf16")
    refused(st, err, lambda: st.forward(0, xd, 64), "positions 64..64 outside 0..max_seq_len-1=63")
    refused(st, err, lambda: st.forward(0, xd.repeat(2, 1), 5), "start_pos=5 > 0 takes one token")
    # layers 0..2 of a 1-token prefill (layer 4 never runs, so no index keys exist): position 2
    # of layer 2 would hold its token in the compressor state, then find no index keys
    st = cls(man["model_args"], w)
    p1 = _calls(man, "p1")[0]["key"]
    for layer in (0, 1, 2):
        st.forward(layer, rec[p1][layer]["x"], 0)
    refused(st, err, lambda: st.forward(2, xd, 2), "index source 2 runs before any index keys")
    # a kv source that is no index source would run its Compressor, then find no selection
    st = cls(dict(man["model_args"], index_source_layers=[4, 6]), w)
    for layer in (0, 1):
        st.forward(layer, rec[man["calls"][0]["key"]][layer]["x"], 0)
    refused(st, err, lambda: st.forward(2, x1, 0), "layer 2 reuses a selection no index source")


def test_port_decode_refusals_leave_state_untouched(v41_fx):
    man, rec, w = v41_fx
    st, calls = _after_prefill(v41_fx, PortStack, "p13")
    x = rec[calls[1]["key"]][3]["x"]
    st.decode_prep(0, 13)                                   # the upload record is not empty
    cases = [
        (lambda: st.decode_prep(3, 14), "the shared selection holds 13 queries; a decode step "
                                        "takes 1"),
        (lambda: st.decode_prep(2, 13), "layer 2 is a kv or index source"),
        (lambda: st.decode_prep(0, 0), "decode start_pos=0 outside 1..max_seq_len-1=63"),
        (lambda: st.decode_body(2, x, None), "no capturable body"),
        (lambda: st.decode_body(3, x, None), "needs rows_b present"),
    ]
    for call, msg in cases:
        refused(st, PortError, call, msg)
    fresh = PortStack(man["model_args"], w)
    refused(fresh, PortError, lambda: fresh.decode_prep_role(True, 3),
            "before any source published")
    # a published selection too wide for the fixed decode width (tampered on purpose)
    st.shared["topk_idxs"] = torch.zeros(1, 7, dtype=torch.int64)
    refused(st, PortError, lambda: st.forward(3, x, 13),
            "layer 3: selection of 15 entries exceeds min(window + index_topk, 2048) = 14")
    refused(st, PortError, lambda: st.decode_prep(3, 13),
            "selection of 15 entries exceeds the fixed decode width 14")


def test_port_construction_errors(v41_fx):
    man, _, w = v41_fx
    cases = [
        (lambda: PortStack(man["model_args"], w, backend="cuda"), "backend='cuda'"),
        (lambda: PortStack(dict(man["model_args"], head_dim=48), w), "head_dim=48"),
        (lambda: PortStack({k: v for k, v in man["model_args"].items() if k != "max_seq_len"},
                           w), "args lack the field 'max_seq_len'"),
        (lambda: PortStack(man["model_args"], {}), "weights lack"),
        (lambda: PortStack(man["model_args"], w, max_tokens=65), "max_tokens=65 outside 1..64"),
    ]
    for call, msg in cases:
        with pytest.raises(PortError, match=re.escape(msg)):
            call()
