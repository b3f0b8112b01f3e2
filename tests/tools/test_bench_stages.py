"""The benchmarks say each stage on stderr as they go (a newcomer must see progress).
"""
from tests import paths


def _tool(name):
    import importlib.util
    import os
    import sys
    tools = os.path.join(paths.TOOLS, "bench")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    spec = importlib.util.spec_from_file_location(name, os.path.join(tools, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benches_say_each_stage_on_stderr(capsys):
    import re
    import torch
    threads = torch.get_num_threads()
    try:
        _tool("bench_decode").main(["--preset", "tiny", "--ports", "torch:dense", "--steps", "2"])
        err = capsys.readouterr().err
        for what in ("port 1/1 torch:dense: building",
                     "port 1/1 torch:dense: median of 2 steps at position",
                     "the reference's one-token forward_cached at position"):
            assert re.search(rf"^bench_decode \[ *\d+\.\d s\] {re.escape(what)}", err, re.M), err
        assert _tool("bench_gpu_decode").main(["--preset", "tiny", "--device", "cpu", "--steps",
                                               "2", "--warm", "3", "--configs",
                                               "torch:eager:dense"]) == 0
        err = capsys.readouterr().err
        for what in ("configuration 1/1: torch:eager:dense", "building the dense model",
                     "torch:eager:dense: fast-forward to position 3",
                     "torch:eager:dense: median of 2 steps"):
            assert re.search(rf"^bench_gpu_decode \[ *\d+\.\d s\] {re.escape(what)}", err,
                             re.M), err
    finally:
        torch.set_num_threads(threads)
