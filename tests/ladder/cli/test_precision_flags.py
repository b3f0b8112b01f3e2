"""--port-precision against the other flags (issue 48 items 4 and 5): a declaration that
contradicts --weights is refused, and a pair the backend cannot run is refused before the C
step is built."""
import pytest

from ladder.cli.main import main

SHORT = ["--prompt-len", "2", "--steps", "1", "--no-check-plain"]


def _run(argv, capsys):
    lines = []
    rc = main(argv, out=lines.append)
    return rc, "\n".join(map(str, lines)) + capsys.readouterr().err


@pytest.mark.parametrize("flags,needle", [
    (["--weights", "cq", "--port-precision", "act=bfloat16,weights=float32"],
     "weights=float32 contradicts --weights cq"),
    (["--weights", "cq", "--port-precision", "bfloat16,weight=bf16"],
     "weights=bfloat16 contradicts --weights cq"),
    (["--weights", "dense", "--port-precision", "weights=cq"],
     "weights=cq declares CQ codes, and this run's weights are dense"),
    (["--port-precision", "bfloat16,weights=cq"], "this run's weights are dense"),
])
def test_a_declaration_contradicting_the_weights_is_refused(capsys, flags, needle):
    rc, text = _run(["run", *SHORT, *flags], capsys)
    assert rc == 2 and needle in text, text[-1500:]


@pytest.mark.parametrize("flags", [["--weights", "cq", "--port-precision", "bfloat16"],
                                   ["--weights", "cq", "--port-precision", "weights=cq"]])
def test_a_cq_run_may_leave_its_weights_implicit_or_name_them_cq(capsys, flags):
    rc, text = _run(["run", *SHORT, *flags], capsys)
    assert rc == 0, text[-1500:]


def test_native_below_float32_is_refused_before_the_c_step_is_built(capsys, monkeypatch):
    import kernels.native

    def never(*a, **kw):
        raise AssertionError("the C step was built before the refusal")
    monkeypatch.setattr(kernels.native, "unavailable_reason", never)
    rc, text = _run(["run", *SHORT, "--backend", "native", "--port-precision", "bfloat16"],
                    capsys)
    assert rc == 2 and "--port-precision bfloat16: our port runs below float32" in text
