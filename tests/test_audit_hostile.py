"""Issue 24 §2, kind 3: hostile-input defences, each with its own failing case - a file that
changes size while it is read, a /proc file (size 0, with content), a memory budget exceeded
only by the sum of many small terms, every declared bound at its limit and one past it, and the
C step's own argument checks reached directly through ctypes (not only through the Python
checks in front of them)."""
import ctypes
import struct

import pytest
import torch

from bounded import io as safe_io
from reference.config import MAX_ENGRAM_ORDER, MAX_ENGRAM_ORDERS, MAX_INT, ConfigError, V2Config
from reference.memory_budget import MemoryBudgetError, check_memory


# ---------------------------------------------------------------- files that change size
def _sized(monkeypatch, delta):
    """open_regular reporting the file's size off by `delta` (as if it changed between the
    fstat and the read)."""
    real = safe_io.open_regular

    def fake(path, limit, error=safe_io.InputFileError, what="file"):
        f, size = real(path, limit, error, what)
        return f, size + delta
    monkeypatch.setattr(safe_io, "open_regular", fake)


def test_a_file_that_grows_while_read_is_refused(tmp_path, monkeypatch):
    p = tmp_path / "f.json"
    p.write_bytes(b'{"a": 1}')
    assert safe_io.read_capped(p, 100) == b'{"a": 1}'
    _sized(monkeypatch, -1)                        # one byte more than fstat said
    with pytest.raises(safe_io.InputFileError, match="grew past its size of 7 bytes"):
        safe_io.read_capped(p, 100)


def test_a_file_that_shrinks_while_read_is_refused(tmp_path, monkeypatch):
    """A truncated read must not pass for the whole file (a cut .cact or manifest would be
    parsed from fewer bytes than its size said)."""
    p = tmp_path / "f.json"
    p.write_bytes(b'{"a": 1}')
    _sized(monkeypatch, +3)                        # three bytes fewer than fstat said
    with pytest.raises(safe_io.InputFileError, match="shrank to 8 of its 11 bytes"):
        safe_io.read_capped(p, 100)


def test_a_real_file_truncated_between_stat_and_read_is_refused(tmp_path, monkeypatch):
    p = tmp_path / "f.bin"
    p.write_bytes(bytes(range(64)))
    real = safe_io.open_regular

    def cut_after_stat(path, limit, error=safe_io.InputFileError, what="file"):
        f, size = real(path, limit, error, what)
        with open(path, "r+b") as g:
            g.truncate(10)
        return f, size
    monkeypatch.setattr(safe_io, "open_regular", cut_after_stat)
    with pytest.raises(safe_io.InputFileError, match="shrank to 10 of its 64 bytes"):
        safe_io.read_capped(p, 100)


def test_a_safetensors_file_truncated_between_stat_and_read_is_refused(tmp_path, monkeypatch):
    """load_safetensors reads tensor by tensor (not through read_capped): a tensor cut short
    by a file that shrank after its size was taken is refused by name."""
    import reference.params as params
    from safetensors.torch import save_file
    p = str(tmp_path / "t.safetensors")
    save_file({"a": torch.arange(64, dtype=torch.float32)}, p)
    assert torch.equal(params.load_safetensors(p)[0]["a"], torch.arange(64.0))
    import bounded.safetensors as st
    real = st.open_regular

    def cut_after_stat(path, limit, error=safe_io.InputFileError, what="file"):
        f, size = real(path, limit, error, what)
        with open(path, "r+b") as g:
            g.truncate(size - 16)
        return f, size
    monkeypatch.setattr(st, "open_regular", cut_after_stat)
    with pytest.raises(params.ParamsError, match="tensor 'a' is truncated .*shrank"):
        params.load_safetensors(p)


def test_a_proc_file_of_size_zero_with_content_is_refused():
    import os
    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc")
    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(safe_io.InputFileError, match="grew past its size of 0 bytes"):
        safe_io.read_capped("/proc/self/status", 1 << 20)
    with pytest.raises(safe_io.InputFileError, match="grew past its size of 0 bytes"):
        safe_io.load_json("/proc/self/status", 1 << 20)


# ---------------------------------------------------------------- memory: many small terms
def test_a_budget_exceeded_only_by_the_sum_of_many_small_terms(tiny_cfg):
    base = check_memory(tiny_cfg, 1 << 40)
    many = {f"term {i}": (1000, "file size", "a small working copy") for i in range(200)}
    # each term is a rounding error of the budget; only their sum, 200 000 bytes, is not
    assert check_memory(tiny_cfg, base + 200_000, extra=many) == base + 200_000
    with pytest.raises(MemoryBudgetError, match="over the memory budget"):
        check_memory(tiny_cfg, base + 199_999, extra=many)


def test_the_implied_terms_are_summed_not_maxed(tiny_cfg):
    from reference.memory_budget import implied_bytes
    terms = implied_bytes(tiny_cfg)
    total = sum(b for b, _, _ in terms.values())
    assert len(terms) > 2 and total > max(b for b, _, _ in terms.values())
    assert check_memory(tiny_cfg, total) == total
    with pytest.raises(MemoryBudgetError):
        check_memory(tiny_cfg, total - 1)


# ---------------------------------------------------------------- config bounds, edge and past
def _cfg(tiny_cfg, **kw):
    return tiny_cfg.replace(**kw)


@pytest.mark.parametrize("kw_edge, kw_past, msg", [
    (dict(engram_orders=(2,) * MAX_ENGRAM_ORDERS), dict(engram_orders=(2,) * (MAX_ENGRAM_ORDERS + 1)),
     f"must hold 1..{MAX_ENGRAM_ORDERS} orders"),
    (dict(engram_orders=(1,)), dict(engram_orders=()), f"must hold 1..{MAX_ENGRAM_ORDERS}"),
    (dict(engram_orders=(MAX_ENGRAM_ORDER,)), dict(engram_orders=(MAX_ENGRAM_ORDER + 1,)),
     f"engram_orders\\[0\\]={MAX_ENGRAM_ORDER + 1} outside 1..{MAX_ENGRAM_ORDER}"),
    (dict(engram_orders=(1, 2)), dict(engram_orders=(0, 2)), "engram_orders\\[0\\]=0 outside"),
    (dict(kv_bits=32), dict(kv_bits=33), "kv_bits=33 outside 0..32"),
    (dict(act_bits=0), dict(act_bits=-1), "act_bits=-1 outside 0..32"),
    (dict(rope_theta=1e30), dict(rope_theta=1.1e30), "outside 1..1e30"),
    (dict(rope_theta=1.0), dict(rope_theta=0.999), "outside 1..1e30"),
    (dict(kv_window=0), dict(kv_window=-1), "kv_window=-1 must be >= 0"),
])
def test_config_bounds_at_the_limit_and_one_past(tiny_cfg, kw_edge, kw_past, msg):
    _cfg(tiny_cfg, **kw_edge)
    with pytest.raises(ConfigError, match=msg):
        _cfg(tiny_cfg, **kw_past)


def test_engram_sites_at_num_layers_and_one_past(tiny_cfg):
    L = tiny_cfg.num_layers
    cfg = _cfg(tiny_cfg, engram_layers=tuple(range(L)))
    assert cfg.num_sites == L
    with pytest.raises(ConfigError, match=f"{L + 1} entries, more than num_layers={L}"):
        _cfg(tiny_cfg, engram_layers=tuple(range(L)) + (0,))
    _cfg(tiny_cfg, engram_layers=(L - 1,))
    with pytest.raises(ConfigError, match=f"engram_layers\\[0\\]={L} outside"):
        _cfg(tiny_cfg, engram_layers=(L,))


def test_engram_tables_at_d_model_and_one_past(tiny_cfg):
    """tables = orders x heads; each table's sub-dimension d_model // tables must be >= 1."""
    d, n = tiny_cfg.d_model, len(tiny_cfg.engram_orders)
    cfg = _cfg(tiny_cfg, engram_heads=d // n)
    assert cfg.engram_tables == d and cfg.engram_sub == 1
    with pytest.raises(ConfigError, match="engram sub-dim d_model // tables = 0 must be >= 1"):
        _cfg(tiny_cfg, engram_heads=d // n + 1)


def test_integer_fields_at_max_int_and_one_past(tiny_cfg):
    d = dict(tiny_cfg.to_dict(), pad_token_id=-MAX_INT)
    # in the integer range, so past the type check; then refused as no token id (issue 32)
    with pytest.raises(ConfigError, match=f"pad_token_id=-{MAX_INT} outside 0..vocab_size-1"):
        V2Config.from_file_fields(d)
    with pytest.raises(ConfigError, match=f"-{MAX_INT}..{MAX_INT}"):
        V2Config.from_file_fields(dict(d, pad_token_id=-MAX_INT - 1))
    with pytest.raises(ConfigError, match=f"-{MAX_INT}..{MAX_INT}"):
        V2Config.from_file_fields(dict(d, kv_window=MAX_INT + 1))


# ---------------------------------------------------------------- .cact header counts
def _cact():
    import os
    with open(os.path.join(os.path.dirname(__file__), "fixtures", "cact_mixed.cact"), "rb") as f:
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


# ---------------------------------------------------------------- the C step's own checks
native = pytest.importorskip("kernels.native")


@pytest.fixture(scope="module")
def c_step(tiny_cfg, tiny_params):
    if not native.available():
        pytest.skip(native.unavailable_reason())
    from port.model import V2Model
    model = V2Model.from_params(tiny_params, tiny_cfg, backend="native")
    state = model.make_state()
    model.step(3, state)
    nm = model._native
    b = nm.buffers(state)
    b.grow(2)
    return model, nm, b, state


def _snapshot(state, out):
    return [t.clone() for t in (state.k, state.v, state.vraw, state.lanes, state.hidden, out)]


def _rows(nm, b, m, pos0, toks, out):
    for r, t in enumerate(toks):
        b.tok[r] = t
    return nm.lib.nat_rows(ctypes.byref(nm.m), ctypes.byref(b.s), m, pos0, b.tok, b.flat,
                           b.ok, b.tap_ok, b.valid, native.ptr(b.scratch), None, 1,
                           native.ptr(out))


def test_nat_rows_refuses_bad_positions_and_tokens_itself(c_step, tiny_cfg):
    model, nm, b, state = c_step
    V, S = tiny_cfg.vocab_size, tiny_cfg.max_seq_len
    assert (nm.m.vocab, nm.m.max_seq) == (V, S)
    out = torch.zeros(V)
    before = _snapshot(state, out)
    for m, pos0, toks in ((0, 1, [3]), (1, -1, [3]), (1, S, [3]), (2, S - 1, [3, 3]),
                          (1, 1, [-1]), (1, 1, [V]), (2, 1, [3, V]), (2, 1, [-5, 3])):
        assert _rows(nm, b, m, pos0, toks, out) == -1, (m, pos0, toks)
        now = _snapshot(state, out)
        assert all(torch.equal(x, y) for x, y in zip(before, now)), (m, pos0, toks)
    # the edges themselves run: the last position, the largest token id
    assert _rows(nm, b, 1, S - 1, [V - 1], out) == 0
    assert torch.isfinite(out).all() and out.abs().sum() > 0
    assert _rows(nm, b, 2, S - 2, [0, V - 1], out) == 0


def test_nat_layer_refuses_bad_layers_and_positions_itself(c_step, tiny_cfg):
    model, nm, b, state = c_step
    L, S = tiny_cfg.num_layers, tiny_cfg.max_seq_len
    X = torch.ones(tiny_cfg.mhc_lanes, tiny_cfg.d_model)

    def run(i, pos):
        return nm.lib.nat_layer(ctypes.byref(nm.m), ctypes.byref(b.s), i, pos, native.ptr(X),
                                None, None, b.flat, b.ok, b.tap_ok, 1, native.ptr(b.scratch),
                                None)
    before = _snapshot(state, X)
    for i, pos in ((-1, 0), (L, 0), (0, -1), (0, S), (L, S)):
        assert run(i, pos) == -1, (i, pos)
        assert all(torch.equal(x, y) for x, y in zip(before, _snapshot(state, X))), (i, pos)
    assert run(L - 1, S - 1) == 0 and not torch.equal(X, torch.ones_like(X))
    assert run(0, 0) == 0


# ---------------------------------------------------------------- file-size caps
def test_manifest_size_cap_at_the_limit_and_one_past(tmp_path, monkeypatch):
    from ladder.sides import fixtures
    from ladder_common import FIXTURE
    size = len(open(FIXTURE + ".json", "rb").read())
    monkeypatch.setattr(fixtures, "MAX_MANIFEST", size)
    fixtures.read_manifest(FIXTURE + ".json")
    monkeypatch.setattr(fixtures, "MAX_MANIFEST", size - 1)
    with pytest.raises(fixtures.FixtureError, match=f"{size} bytes exceeds the manifest limit "
                                                    f"{size - 1}"):
        fixtures.read_manifest(FIXTURE + ".json")


# ---------------------------------------------------------------- rules-file bounds
def _rules_file(tmp_path, rules, **extra):
    import json
    p = tmp_path / "rules.json"
    p.write_text(json.dumps(dict({"rules": rules}, **extra)))
    return p


def test_rules_file_counts_and_pattern_length_at_the_limit_and_one_past(tmp_path):
    from ladder.engine.rules import MAX_PATTERN, MAX_RULES, RulesError, load_rules
    catch = [{"pattern": "*", "rtol": 1e-5}]
    many = [{"pattern": f"port/p{i}", "rtol": 1e-5} for i in range(MAX_RULES - 1)]
    assert len(load_rules(_rules_file(tmp_path, many + catch)).rules) == MAX_RULES
    with pytest.raises(RulesError, match=f"{MAX_RULES + 1}.*{MAX_RULES}|{MAX_RULES}.*"
                                         f"{MAX_RULES + 1}"):
        load_rules(_rules_file(tmp_path, many + [{"pattern": "port/x", "rtol": 1e-5}] + catch))
    long = "port/" + "a" * (MAX_PATTERN - 5)
    assert len(long) == MAX_PATTERN
    load_rules(_rules_file(tmp_path, [{"pattern": long, "rtol": 1e-5}] + catch))
    with pytest.raises(RulesError, match=f"exceeds the limit {MAX_PATTERN}"):
        load_rules(_rules_file(tmp_path, [{"pattern": long + "a", "rtol": 1e-5}] + catch))


def test_rule_tolerances_and_topk_at_the_limit_and_one_past():
    from ladder.engine.rules import MAX_TOLERANCE, LogitsRule, Rule, RulesError
    Rule(MAX_TOLERANCE, atol=MAX_TOLERANCE, floor=MAX_TOLERANCE)
    for field in ("rtol", "atol", "floor"):
        kw = dict(rtol=1e-5)
        kw[field] = MAX_TOLERANCE * (1 + 1e-12)
        with pytest.raises(RulesError, match=f"field {field}="):
            Rule(**kw)
        kw[field] = -1e-300 if field != "rtol" else -1e-300
        with pytest.raises(RulesError, match=f"field {field}="):
            Rule(**kw)
    LogitsRule(topk=1 << 20, tie_factor=MAX_TOLERANCE)
    LogitsRule(topk=1)
    for kw in (dict(topk=(1 << 20) + 1), dict(topk=0), dict(tie_factor=MAX_TOLERANCE * 1.001)):
        with pytest.raises(RulesError):
            LogitsRule(**kw)


def test_json_nesting_and_number_length_at_the_limit_and_one_past():
    edge = b"[" * safe_io.MAX_DEPTH + b"]" * safe_io.MAX_DEPTH
    safe_io.parse_json(edge, "probe")
    with pytest.raises(safe_io.InputFileError, match="nesting depth"):
        safe_io.parse_json(b"[" + edge + b"]", "probe")
    num = b"1" * safe_io.MAX_NUMBER_CHARS
    safe_io.parse_json(b"[" + num + b"]", "probe")
    with pytest.raises(safe_io.InputFileError, match="number literal"):
        safe_io.parse_json(b"[" + num + b"1]", "probe")
