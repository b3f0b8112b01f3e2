"""ladder/sides/judge.py, the one-call check under the pytest plugin: every kind of port it accepts
gives the comparison `run`/`compare` give, and a schedule it cannot run is refused naming the
value."""
import pytest

from ladder.sides.capture import capture_port
from ladder.engine.compare import compare_ladders
from ladder.sides.judge import JudgeError, ModelUnderTest, capture, judge
from ladder.engine.trace import Ladder


@pytest.fixture(scope="module")
def tiny():
    return ModelUnderTest.build(preset="tiny", seed=0)


def _rows(cmp):
    return [(r.key, r.passed, r.error, r.max_abs) for r in cmp.rows]


def test_our_port_is_judged_as_run_judges_it(tiny):
    v = judge(tiny.our_port(), tiny, prompt_len=3, steps=2)
    port = capture_port(tiny.our_port(), v.tokens, 3)
    assert v.passed and _rows(v.cmp) == _rows(compare_ladders(port, v.yardstick))
    # the reference is captured once per schedule and kept
    assert judge(tiny.our_port(), tiny, prompt_len=3, steps=2).yardstick is v.yardstick


def test_cq_weights_judge_the_codes_against_the_dequantised_reference():
    cq = ModelUnderTest.build(weights="cq")
    v = judge(cq.our_port(), cq, prompt_len=3, steps=2)
    assert v.passed, v.message()
    assert cq.ref_params["embedding/embedding"].dtype == cq.params["embedding/embedding"].dtype
    assert not all(cq.ref_params[k].equal(cq.params[k]) for k in cq.params)   # quantised


def test_a_recording_is_judged_on_its_own_tokens(tiny, tmp_path):
    from ladder.sides.judge import save_trace
    cap = capture("tests.ports.toy_port:build_buggy", tiny, prompt_len=3, steps=2)
    path = save_trace(cap, tiny, tmp_path / "toy.safetensors")
    v = judge(str(path), tiny)
    assert not v.passed and v.cmp.first.key == "prefill/L02.hpost"
    assert v.tokens == cap.tokens and "own error" in v.location.verdict
    assert isinstance(v.obtained, Ladder)
    with pytest.raises(JudgeError, match="judged on its own tokens"):
        judge(str(path), tiny, tokens=[1, 2, 3, 4, 5])
    with pytest.raises(JudgeError, match="window=3: the recording stepped on window 8"):
        judge(str(path), tiny, window=3)


@pytest.mark.parametrize("kw,needle", [
    (dict(prompt_len=0), "prompt_len=0 must be an int >= 1"),
    (dict(steps=-1), "steps=-1 must be an int >= 0"),
    (dict(tokens=[1, 2], steps=2), "tokens= and steps=2: give one"),
    (dict(tokens=[1, 10 ** 6], prompt_len=1), "token id 1000000 outside the model's vocab_size"),
    (dict(prompt_len=3, steps=10 ** 6), "positions: the model allows 1.."),
])
def test_a_schedule_it_cannot_run_is_refused_naming_the_value(tiny, kw, needle):
    with pytest.raises(JudgeError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        judge(tiny.our_port(), tiny, **kw)


def test_a_bad_weight_form_is_refused():
    with pytest.raises(JudgeError, match="weights='q4'"):
        ModelUnderTest.build(weights="q4")


def test_a_live_side_name_is_not_a_recording(tiny):
    with pytest.raises(JudgeError, match="'torch' is not a recording"):
        judge("torch", tiny)


def test_a_recording_whose_argmax_contradicts_its_logits_is_refused(tiny, tmp_path):
    import json
    from safetensors.torch import save_file
    from ladder.engine import archive
    from ladder.sides.judge import save_trace
    from reference.params import load_safetensors
    cap = capture(tiny.our_port(), tiny, prompt_len=3, steps=2)
    path = save_trace(cap, tiny, tmp_path / "ok.safetensors")
    assert judge(str(path), tiny).passed
    tensors, meta = load_safetensors(path)
    m = json.loads(meta[archive.META_KEY])
    m["argmax"]["decode01"] = (m["argmax"]["decode01"] + 1) % tiny.cfg.vocab_size
    bad = tmp_path / "bad.safetensors"
    save_file(tensors, str(bad), metadata={archive.META_KEY: json.dumps(m)})
    with pytest.raises(JudgeError, match=r"argmax\['decode01'\].*contradicts itself"):
        judge(str(bad), tiny)
