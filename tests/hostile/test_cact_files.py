"""Hostile .cact headers: counts and offsets at their limit and one past, sizes past the
memory budget, a window wider than the KV budget. Each is refused naming the field and offset.
"""
from tests import paths
import json
import os
import struct
import pytest
from safetensors.torch import save_file
from reference.cact import CactFormatError, read_cact
from reference.config import V2Config
from reference.memory_budget import MemoryBudgetError
from reference.params import init_params, load_params


FIXTURES = paths.FIXTURES


CACT = os.path.join(FIXTURES, "cact_w2.cact")


def _patched_cact(tmp_path, **at_value) -> str:
    data = bytearray(open(CACT, "rb").read())
    for at, value in at_value.items():
        struct.pack_into("<I", data, int(at[1:]), value)
    path = tmp_path / "patched.cact"
    path.write_bytes(bytes(data))
    return str(path)


# ---------------------------------------------------------------- in process (safe to run)
def test_huge_max_seq_len_cact_header_is_refused_by_the_budget(tmp_path):
    path = _patched_cact(tmp_path, b44=2 ** 26)
    with pytest.raises(CactFormatError, match=r"budget of 2\.00 GiB.*largest is the KV cache, "
                                              r".* from max_seq_len=67108864 \(byte 44\)"):
        read_cact(path)
    # The same header under a budget that holds it reads (the limit is the budget, not a cap).
    f = read_cact(path, max_memory=1 << 40)
    assert f.config.max_seq_len == 2 ** 26


def test_cact_window_wider_than_the_kv_budget_is_refused(tmp_path):
    # max_seq_len = kv_window = 2e6: under the memory budget, but the ring and every step's
    # attention would span 2e6 slots; upstream's export never writes more than the KV budget.
    path = _patched_cact(tmp_path, b44=2 * 10 ** 6, b12=2 * 10 ** 6)
    with pytest.raises(CactFormatError, match=r"header field kv_window=2000000 at byte 12 "
                                              r"exceeds the KV budget of 40736 positions"):
        read_cact(path)
    assert read_cact(_patched_cact(tmp_path, b44=2 * 10 ** 6, b12=40736)).config.kv_window \
        == 40736
    # The same geometry from a parameter file's metadata: the same rule.
    cfg = V2Config.preset("tiny")
    meta = dict(cfg.to_dict(), max_seq_len=2 * 10 ** 6, kv_window=2 * 10 ** 6)
    save_file(init_params(cfg, 0), str(tmp_path / "p.safetensors"),
              metadata={"needle_config": json.dumps(meta)})
    with pytest.raises(MemoryBudgetError, match=r"kv_window=2000000 exceeds the KV budget of "
                                                r"[0-9]+ positions"):
        load_params(tmp_path / "p.safetensors")


# ---------------------------------------------------------------- .cact header counts
def _cact():
    import os
    with open(os.path.join(paths.FIXTURES, "cact_mixed.cact"), "rb") as f:
        return f.read()


def _put(data, offset, value):
    out = bytearray(data)
    struct.pack_into("<I", out, offset, value)
    return bytes(out)


ORDERS_AT, SITES_AT = 76, 96          # num_engram_orders, num_engram_sites (cact.HEADER_FIELDS)


def test_cact_header_offsets_are_the_fields():
    from reference import cact
    names = cact.HEADER_FIELDS
    assert names[ORDERS_AT // 4] == "num_engram_orders" and names[SITES_AT // 4] == \
        "num_engram_sites"


@pytest.mark.parametrize("at, edge, past, name, limit, later", [
    # at the limit the count is taken, and the file fails on what follows from it
    (SITES_AT, 4, 5, "num_engram_sites", "0..4", "(num_layers=4, 4 Engram sites)"),
    (ORDERS_AT, 4, 5, "num_engram_orders", "1..4", "engram_orders[2]=0 at byte 88 must be >= 1"),
    (ORDERS_AT, 1, 0, "num_engram_orders", "1..4", "engram_orders[1]=3 at byte 84 must be 0"),
])
def test_cact_header_counts_at_the_limit_and_one_past(at, edge, past, name, limit, later):
    from reference.cact import CactFormatError, parse_cact
    with pytest.raises(CactFormatError) as e:
        parse_cact(_put(_cact(), at, edge))
    assert later in str(e.value) and "must be in" not in str(e.value), str(e.value)
    with pytest.raises(CactFormatError, match=f"{name}={past} at byte {at} must be in {limit}"):
        parse_cact(_put(_cact(), at, past))
