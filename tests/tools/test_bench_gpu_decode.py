"""tools/bench/bench_gpu_decode.py on the CPU at the tiny preset: the eight-row table with numbers, the
launch counts read from count_launches' JSON, the JSON written, a raising backend reported as
failed (exit 1) without hiding the others, bad flags as exit 2 with one line. On a machine with
CUDA the same checks run on the GPU (Triton there is compiled, not interpreted)."""
from tests import paths
import json
import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(paths.TOOLS, "bench"))
import bench_gpu_decode as bench                                    # noqa: E402
from port.model import V2Model                                     # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the fewest interpreter steps that still measure: position 1, one untimed step, one timed
FAST = ["--preset", "tiny", "--device", DEVICE, "--steps", "1", "--warm", "1"]


@pytest.fixture(autouse=True)
def keep_threads():
    """main() sets the torch thread count of this process: put it back for the other tests."""
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def table_rows(out: str) -> dict:
    """config -> its cells, from the printed markdown table."""
    rows = {}
    for line in out.splitlines():
        if line.startswith("| ") and not line.startswith("| config"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0]] = cells[1:]
    return rows


def counts_file(tmp_path, preset="tiny"):
    """A count_launches JSON with a distinct number per backend:weights and decode."""
    configs = {f"{b}:{w}": {"total": 100 + 10 * i, "eager_total": 500 + 10 * i}
               for i, (b, w) in enumerate((b, w) for w in ("dense", "cq")
                                          for b in ("torch", "triton"))}
    path = tmp_path / "launches.json"
    path.write_text(json.dumps({"preset": preset, "layers": 6, "configs": configs}))
    return path, configs


@pytest.mark.slow
def test_eight_rows_with_numbers_launches_and_json(tmp_path, capsys):
    launches, configs = counts_file(tmp_path)
    out_json = tmp_path / "table.json"
    rc = bench.main(FAST + ["--launches", str(launches), "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = table_rows(out)
    assert set(rows) == set(bench.CONFIGS) and len(rows) == 8
    doc = json.loads(out_json.read_text())
    assert doc["complete"] is True and doc["failed"] == [] and doc["position"] == 1
    for name in bench.CONFIGS:
        backend, decode, weights = name.split(":")
        ms, launch, dlogits = rows[name]
        assert float(ms) > 0, name
        want = configs[f"{backend}:{weights}"]["total" if decode == "graph" else "eager_total"]
        assert launch == f"{want:,}", name
        assert doc["rows"][name]["launches_per_token"] == want
        assert math.isfinite(float(dlogits)), name
        assert doc["rows"][name]["ms_per_token"] == pytest.approx(float(ms), abs=5e-4)
    for weights in ("dense", "cq"):      # the reference itself, and graph replay == eager
        assert doc["rows"][f"torch:eager:{weights}"]["max_abs_dlogits"] == 0.0
        assert doc["rows"][f"torch:graph:{weights}"]["max_abs_dlogits"] == 0.0
    assert "set_flush_denormal(True)" in out
    assert ("GPU timing unmeasured" in out) == (DEVICE == "cpu")


def test_a_raising_backend_is_failed_and_the_others_still_run(tmp_path, capsys, monkeypatch):
    real_step = V2Model.step

    def step(self, token, state, logits=None):
        if self.backend == "triton":
            raise RuntimeError("kernel exploded\nsecond line")
        return real_step(self, token, state, logits)
    monkeypatch.setattr(V2Model, "step", step)
    out_json = tmp_path / "t.json"
    rc = bench.main(FAST + ["--configs", "triton:graph:dense", "torch:eager:dense",
                            "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 1
    rows = table_rows(out)
    assert rows["triton:graph:dense"][0] == "failed: RuntimeError: kernel exploded"
    assert float(rows["torch:eager:dense"][0]) > 0
    assert list(rows) == ["torch:eager:dense", "triton:graph:dense"]     # table order
    assert json.loads(out_json.read_text())["failed"] == ["triton:graph:dense"]


def test_missing_or_foreign_counts_show_na_and_compile_is_skipped_on_cpu(tmp_path, capsys):
    compile_flag = ["--compile"] if DEVICE == "cpu" else []     # on CUDA it compiles: minutes
    for launches, note in ((tmp_path / "absent.json", "does not exist"),
                           (counts_file(tmp_path, preset="shipped")[0], "counts preset")):
        rc = bench.main(FAST + ["--configs", "torch:graph:dense", "--launches", str(launches)]
                        + compile_flag)
        out = capsys.readouterr().out
        assert rc == 0 and note in out
        rows = table_rows(out)
        assert rows["torch:graph:dense"][1] == "n/a"
        if compile_flag:
            compiled = rows[f"{bench.COMPILE_ROW}:dense"]
            assert compiled[0].startswith("SKIPPED") and compiled[1:] == ["n/a", "n/a"]


@pytest.mark.parametrize("extra, words", [
    (["--configs", "torch:eager"], "--configs torch:eager"),
    (["--configs", "native:eager:dense"], "--configs native:eager:dense"),
    (["--steps", "0"], "--steps 0"),
    (["--threads", "0"], "--threads 0"),
    (["--warm", "0"], "--warm 0"),
    (["--warm", "62"], "max_seq_len=64"),                # 62 + 1 untimed + 1 step > 63
    (["--preset", "nope"], "--preset nope"),
    (["--steps", "two"], "--steps"),
    (["--frobnicate"], "--frobnicate"),
    (["--json", "/nonexistent-dir/t.json"], "--json"),
    (["--upstream-python", "/nonexistent/python"], "--upstream-python"),
])
def test_bad_flags_exit_2_with_one_line(extra, words, capsys):
    with pytest.raises(SystemExit) as e:
        raise SystemExit(bench.main(FAST + extra))
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert len(err.strip().splitlines()) == 1 and words in err, err


def test_unreadable_counts_file_is_a_bad_flag(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"preset": "tiny", "configs": {"torch:dense": {"eager_total": 3}}}')
    for path in (bad, tmp_path):                          # no "total"; a directory
        assert bench.main(FAST + ["--launches", str(path)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "--launches" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_cuda_refused_without_a_device(capsys):
    assert bench.main(["--preset", "tiny", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.slow
def test_count_launches_json_feeds_the_table(tmp_path, capsys, tiny_cfg, tiny_params):
    import count_launches as cl
    path = tmp_path / "launches.json"
    assert cl.main(["--preset", "tiny", "--backends", "triton", "--weights", "dense",
                    "--eager", "--json", str(path)]) == 0
    entry = json.loads(path.read_text())["configs"]["triton:dense"]
    assert entry["eager_total"] == sum(entry["eager_by_op"].values()) > 0
    # dropping the uncounted prefill's Triton launches changes no count
    model = V2Model.new(tiny_cfg, *V2Model.from_params(tiny_params, tiny_cfg).parts,
                        backend="triton", decode="graph")
    assert cl.count_body(model, skip_triton_prefill=True) == cl.count_body(model)
    capsys.readouterr()
    assert bench.main(FAST + ["--configs", "triton:eager:dense", "triton:graph:dense",
                              "--launches", str(path)]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert rows["triton:graph:dense"][1] == f"{entry['total']:,}"
    assert rows["triton:eager:dense"][1] == f"{entry['eager_total']:,}"


def test_upstream_row_from_the_interpreter_or_said_missing(tmp_path, capsys):
    answers = {
        "ok": ('echo \'{"upstream_one_token_ms": 3.55, "compile_s": 21.0, "jax": "0.4", '
               '"devices": ["cuda:0"]}\''),
        "no_wheel": "echo \"ModuleNotFoundError: No module named 'needle'\" >&2; exit 1",
    }
    got = {}
    for name, body in answers.items():
        fake = tmp_path / name
        fake.write_text(f"#!/bin/sh\n{body}\n")
        fake.chmod(0o755)
        rc = bench.main(FAST + ["--configs", "torch:graph:dense", "--upstream-python", str(fake)])
        assert rc == 0                                  # upstream never fails the run
        got[name] = table_rows(capsys.readouterr().out)[f"{bench.UPSTREAM_ROW} (at 1)"]
    assert got["ok"] == ["3.550", "n/a", "n/a"]
    assert "no 'needle' module" in got["no_wheel"][0] and "unmeasured" in got["no_wheel"][0]


def test_a_weight_form_that_does_not_build_fails_its_rows_once(capsys, monkeypatch):
    real, calls = V2Model.from_params, []

    def from_params(params, cfg, weights="dense", **kw):
        calls.append(weights)
        if weights == "cq":
            raise RuntimeError("mat2 is on cpu")
        return real(params, cfg, weights=weights, **kw)
    monkeypatch.setattr(V2Model, "from_params", staticmethod(from_params))
    rc = bench.main(FAST + ["--configs", "torch:eager:cq", "torch:graph:cq", "torch:eager:dense"])
    rows = table_rows(capsys.readouterr().out)
    assert rc == 1 and sorted(calls) == ["cq", "dense"]          # the cq build is not retried
    assert rows["torch:eager:cq"][0] == rows["torch:graph:cq"][0] == \
        "failed: RuntimeError: mat2 is on cpu"
    assert float(rows["torch:eager:dense"][0]) > 0
