"""What the memory budget counts (reference/memory_budget.py and the V4.1 side): every
term a file implies is summed before anything is allocated, and an override moves the limit.
"""
from tests import paths
import json
import os
import subprocess
import sys
import pytest
import torch
from safetensors.torch import save_file
from reference.cact import CactFormatError, read_cact
from reference.config import V2Config
from reference.memory_budget import DEFAULT_MAX_MEMORY, MemoryBudgetError, check_memory, \
    implied_bytes, parse_size
from reference.params import init_params, load_params
from ladder.v41.sides import DEFAULT_STEM as V41_STEM


def test_memory_budget_terms_and_override():
    tiny, shipped = V2Config.preset("tiny"), V2Config.preset("shipped")
    t = implied_bytes(tiny)
    assert t["RoPE tables"][0] == 3 * 64 * 6 * 4 and t["KV cache"][0] == 2 * 6 * 2 * 64 * 12 * 4
    assert t["Engram value ring"][0] == 2 * (3 * 3 + 1) * 48 * 4
    assert check_memory(shipped) < DEFAULT_MAX_MEMORY // 4      # the presets fit with room
    big = tiny.replace(max_seq_len=2 ** 24)
    with pytest.raises(MemoryBudgetError, match=r"largest is the KV cache.*max_seq_len=16777216"):
        check_memory(big)
    assert check_memory(big, budget=64 << 30) > DEFAULT_MAX_MEMORY
    assert parse_size("2G") == 2 << 30 and parse_size("512M") == 512 << 20
    for bad in ("", "-1", "2X", "0", "1e9"):
        with pytest.raises(ValueError):
            parse_size(bad)


ROOT = paths.ROOT


FIXTURES = paths.FIXTURES


# ---------------------------------------------------------------- 3. what the budget counts
def test_budget_counts_a_params_file_as_stored(tmp_path):
    """A float64 parameter file is held as stored (8 bytes a value) beside the float32 copy:
    a budget the float32 tables fit but the file's tensors do not is refused before reading."""
    from reference.config import V2Config
    from reference.memory_budget import MemoryBudgetError, check_memory
    cfg = V2Config.preset("tiny")
    path = str(tmp_path / "p64.safetensors")
    save_file({k: v.double() for k, v in init_params(cfg, 0).items()}, path,
              metadata={"needle_config": cfg.to_json()})
    budget = max(check_memory(cfg), os.path.getsize(path)) + 4096
    with pytest.raises(MemoryBudgetError, match=r"over the memory budget .* the largest is the "
                                                r"tensors as stored"):
        load_params(path, max_memory=budget)
    assert load_params(path, max_memory=2 * budget)[0]["embedding/embedding"].dtype == \
        torch.float64


def test_budget_counts_the_cact_file_and_its_dequantised_copies(tmp_path):
    """Reading a .cact holds the file, the slots' copy of it and the dequantised slots beside
    the parameters: a budget the tables alone fit is refused, naming the term."""
    from reference.memory_budget import check_memory
    from reference.cact_check import check_header
    path = os.path.join(FIXTURES, "cact_w2.cact")
    cfg = read_cact(path).config
    header_cfg = check_header(open(path, "rb").read(), path)[1]   # what the budget is of
    budget = max(check_memory(header_cfg), os.path.getsize(path)) + 4096
    with pytest.raises(CactFormatError, match=r"over the memory budget of .* \(--max-memory\); "
                                              r"the largest is the"):
        read_cact(path, max_memory=budget)
    assert read_cact(path, max_memory=64 << 20).config == cfg


_PEAK = r"""
import resource, sys, torch
torch.set_num_threads(1)
what = sys.argv[1]
def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if what == "values":          # 64 MB of NaN: the check must not make an int64 index of each
    from reference.params import ParamsError, check_values
    t = torch.full((1 << 24,), float("nan"))
    before = rss()
    try:
        check_values({"w": t}, "x")
    except ParamsError:
        pass
else:                         # a 4096 x 4096 2-bit matrix: 16 MB of codes
    from reference import cq
    packed = torch.randint(0, 256, (4096, 1024), dtype=torch.uint8)
    before = rss()
    codes = cq.unpack(packed, 2, 4096)
print(rss() - before)
"""


def test_value_checks_and_cq_unpack_working_copies_are_bounded():
    """The value scan and the CQ unpack used to make whole-tensor int64 copies (an all-NaN
    tensor's nonzero() is twice its size; unpacking, 17 bytes a weight): the peak they add
    is now their result and a bounded slice. One child process each (a process's peak RSS
    only grows), both at once."""
    limits = {"values": 40 << 20, "unpack": 96 << 20}     # before: ~150 MiB and ~436 MiB
    kids = {what: subprocess.Popen([sys.executable, "-c", _PEAK, what], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                   env=dict(os.environ, PYTHONPATH=ROOT))
            for what in limits}
    for what, kid in kids.items():
        out, err = kid.communicate(timeout=60)
        assert kid.returncode == 0, err[-2000:]
        grew = int(out.split()[-1])
        assert grew < limits[what], f"{what}: peak grew {grew >> 20} MiB (limit " \
                                    f"{limits[what] >> 20} MiB)"


def test_the_v41_budget_counts_the_compressors_state():
    from ladder.v41.sides import implied_bytes
    from reference.v41.config import V41Args
    m = json.load(open(V41_STEM + ".json"))
    a = V41Args.from_any(m["model_args"])
    terms = implied_bytes(a, m["calls"])
    ratios = [a.compress_ratios[i] for i in a.kv_sources if a.compress_ratios[i] > 1]
    assert ratios and terms["compressor states"][0] == \
        3 * sum(ratios) * (a.head_dim + a.index_head_dim) * 4 * 2


def test_the_sparse_attention_twin_widens_only_the_rows_it_gathers():
    """A 1M-position V4.1 geometry ran 69 s because the twin widened the whole compressed cache
    to float32 for every block of every query; widening the gathered rows gives the same bits."""
    from kernels.v41.sparse_attn import sparse_attn_v41_torch
    g = torch.Generator().manual_seed(3)
    T, H, D, na = 3, 2, 16, 4096
    q = torch.randn(T, H, D, generator=g).bfloat16()
    rows = torch.randn(na, D, generator=g).bfloat16()
    idx = torch.randint(-1, na, (T, 20), generator=g)
    sink = torch.randn(H, generator=g)
    widened = []

    class Watched(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is torch.Tensor.float and args[0].shape[0] == na:
                widened.append(tuple(args[0].shape))
            return super().__torch_function__(func, types, args, kwargs or {})

    sparse_attn_v41_torch(q, rows.as_subclass(Watched), None, idx, 0.25, sink)
    assert widened == []                                   # no pass over all `na` rows


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
