"""The seed's object model of the V4.1 port (issue #14): one runtime (AttnV41) with per-layer
weights serves many sequences, each a SequenceV41 of per-layer state and its SharedV41; every
path writes its output into the runtime's static bf16 [max_tokens, dim] buffer and returns it
without a copy."""
import pytest
import torch

from port.v41.attn import AttnStackV41, AttnV41, AttnV41Error
from port.v41.state import LayerWeightsV41, SequenceV41, SharedV41


def scenario_calls(man, name):
    return [c for c in man["calls"] if c["scenario"] == name]


def alone(man, rec, w, calls, decode):
    """Every layer output of `calls` on a runtime serving nothing else."""
    rt = AttnV41(man["model_args"], w, decode=decode)
    return [rt.forward(layer, rec[c["key"]][layer]["x"], c["start_pos"]).clone()
            for c in calls for layer in range(8)]


@pytest.mark.parametrize("decode", ["eager", "graph"])
def test_interleaved_sequences_equal_separate_runs(v41_fx, decode):
    """Two sequences (prefill 3 and prefill 13, decode past the window) served layer by layer
    in turn by one runtime give the bytes each gives alone on a runtime of its own."""
    man, rec, w = v41_fx
    a_calls, b_calls = scenario_calls(man, "p3"), scenario_calls(man, "p13")
    want_a, want_b = alone(man, rec, w, a_calls, decode), alone(man, rec, w, b_calls, decode)
    rt = AttnV41(man["model_args"], w, decode=decode)
    sa, sb = rt.new_sequence(), rt.new_sequence()
    steps = {id(sa): [(c, layer) for c in a_calls for layer in range(8)],
             id(sb): [(c, layer) for c in b_calls for layer in range(8)]}
    got = {id(sa): [], id(sb): []}
    for i in range(max(len(v) for v in steps.values())):
        for seq in (sa, sb):
            if i < len(steps[id(seq)]):
                c, layer = steps[id(seq)][i]
                out = rt.forward(layer, rec[c["key"]][layer]["x"], c["start_pos"], seq=seq)
                got[id(seq)].append(out.clone())
    assert len(got[id(sa)]) == len(want_a) and len(got[id(sb)]) == len(want_b)
    for g, e in zip(got[id(sa)] + got[id(sb)], want_a + want_b):
        assert torch.equal(g, e)
    # the default sequence was never touched: its state is still the fresh one
    assert all(not st.ring.any() for st in rt.seq.layers)
    assert all(v is None for v in rt.seq.shared.values())


@pytest.mark.parametrize("decode", ["eager", "graph"])
def test_every_path_returns_the_static_output_rows(v41_fx, decode):
    """Prefill (general path), a source layer's decode step (general), a capturable decode
    step (eager step or the graph body): each result is rows of the one output buffer."""
    man, rec, w = v41_fx
    rt = AttnV41(man["model_args"], w, decode=decode, max_tokens=16)
    assert rt.out.dtype == torch.bfloat16 and tuple(rt.out.shape) == (16, 64)
    calls = scenario_calls(man, "p3")
    paths = set()
    for c in calls[:3]:
        for layer in range(8):
            out = rt.forward(layer, rec[c["key"]][layer]["x"], c["start_pos"])
            assert out.data_ptr() == rt.out.data_ptr() and out.shape[0] == c["m"]
            assert torch.equal(out, rt.out[:c["m"]])
            paths.add((c["start_pos"] > 0, rt.decode_capturable(layer)))
    assert paths == {(False, False), (False, True), (True, False), (True, True)}


def test_runtime_objects(v41_fx):
    man, rec, w = v41_fx
    assert AttnStackV41 is AttnV41
    rt = AttnV41(man["model_args"], w)
    assert all(isinstance(lw, LayerWeightsV41) and lw.layer == i
               for i, lw in enumerate(rt.layers))
    assert rt.layers[2].role.is_kv_source and "compressor.wgate.weight" in rt.layers[2].w
    assert "compressor.wkv.weight" not in rt.layers[3].w            # a reuse layer
    seq = rt.new_sequence()
    assert isinstance(seq, SequenceV41) and isinstance(seq.shared, SharedV41)
    assert seq.layers[2].kv_state is not None and seq.layers[3].cache is None
    with pytest.raises(KeyError, match="SharedV41 holds"):
        seq.shared["other"] = None
    with pytest.raises(AttnV41Error, match="seq=dict is not a SequenceV41"):
        rt.forward(0, rec[man["calls"][0]["key"]][0]["x"], 0, seq={})


def test_chunked_prefill_past_zero_is_refused_naming_the_limit(v41_fx):
    """m > 1 at start_pos > 0 (a chunked prefill) is not generalised: the window ring and the
    compressors take one token per call past position 0 (as the official decode does). It is
    refused before any write, naming the value and the limit."""
    man, rec, w = v41_fx
    rt = AttnV41(man["model_args"], w)
    seq = rt.new_sequence()
    for layer in range(8):
        rt.forward(layer, rec[man["calls"][0]["key"]][layer]["x"], 0, seq=seq)
    before = [st.ring.clone() for st in seq.layers]
    x2 = rec[man["calls"][0]["key"]][0]["x"].repeat(2, 1)
    with pytest.raises(AttnV41Error, match=r"start_pos=1 > 0 takes one token \(a decode step\), "
                                           r"got m=2"):
        rt.forward(0, x2, 1, seq=seq)
    assert all(torch.equal(a, st.ring) for a, st in zip(before, seq.layers))


def mixed_class_args(ma):
    """The fixture's geometry with layer 6 a reuse layer and layer 7 window-only, so layers
    5, 6, 7 form one run of capturable layers holding both selection classes."""
    return dict(ma, compress_ratios=[0, 0, 2, 2, 1, 1, 1, 0], index_source_layers=[2, 4])


def test_segment_holds_both_classes_and_is_capturable(v41_fx):
    """One segment body for layers 5..7 (ratio 1, ratio 1, ratio 0): no host sync, the same op
    sequence at every decode position (one capture serves all), and output bytes equal to
    the eager layer-by-layer steps."""
    from port.v41.graph import record_segment_ops
    man, rec, w = v41_fx
    ma = mixed_class_args(man["model_args"])
    eager, graph = AttnV41(ma, w), AttnV41(ma, w, decode="graph")
    assert graph.segments() == [(0, 1), (3,), (5, 6, 7)]
    assert {graph.args.role(i).ratio > 0 for i in (5, 6, 7)} == {True, False}
    calls = scenario_calls(man, "p3")
    seen = []
    for c in calls[:5]:
        x = {i: rec[c["key"]][i]["x"] for i in range(8)}
        want = [eager.forward(i, x[i], c["start_pos"]).clone() for i in range(8)]
        if c["start_pos"] == 0:
            for i in range(8):
                graph.forward(i, x[i], 0)
            continue
        for i in range(5):
            graph.forward(i, x[i], c["start_pos"])
        ops, out = record_segment_ops(graph, (5, 6, 7), torch.cat([x[5], x[6], x[7]]),
                                      c["start_pos"])
        assert torch.equal(out, torch.cat(want[5:])), c["key"]
        seen.append(ops)
    assert len(seen) == 4 and all(ops == seen[0] for ops in seen)


@pytest.mark.parametrize("decode", ["eager", "graph"])
def test_forward_segment_equals_forward(v41_fx, decode):
    """forward_segment over every run of every decode step = forward layer by layer (bytes),
    on the mixed-class geometry; what it refuses, it refuses before any write."""
    man, rec, w = v41_fx
    ma = mixed_class_args(man["model_args"])
    ref, rt = AttnV41(ma, w), AttnV41(ma, w, decode=decode)
    runs = {run[0]: run for run in rt.segments()}
    for c in scenario_calls(man, "p13")[:6]:
        x = {i: rec[c["key"]][i]["x"] for i in range(8)}
        want = {i: ref.forward(i, x[i], c["start_pos"]).clone() for i in range(8)}
        i = 0
        while i < 8:
            run = runs.get(i) if c["start_pos"] else None
            if run is None:
                rt.forward(i, x[i], c["start_pos"])
                i += 1
                continue
            got = rt.forward_segment(run, torch.cat([x[j] for j in run]), c["start_pos"])
            assert torch.equal(got, torch.cat([want[j] for j in run])), (c["key"], run)
            i += len(run)
    rings = [r.clone() for r in rt.ring]
    xs = torch.cat([x[5], x[6]])
    for layers, args, msg in (((4, 5), (xs, 20), "not consecutive capturable layers"),
                              ((5, 6), (xs, 0), "a segment is a decode step"),
                              ((5, 6, 7), (xs, 20), r"xs must be \[3, dim\]")):
        with pytest.raises(AttnV41Error, match=msg):
            rt.forward_segment(layers, *args)
    assert all(torch.equal(a, b) for a, b in zip(rings, rt.ring))
