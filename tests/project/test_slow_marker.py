"""The `slow` marker is registered and carried by the slowest tests, so the quick loop
(`-m "not slow"`) is quick.
"""
from tests import paths


def test_slow_marker_is_registered_and_on_the_slowest_tests(pytestconfig):
    import os
    assert "slow" in [m.split(":")[0].strip() for m in pytestconfig.getini("markers")]
    from tests.tools import test_bench_gpu_decode
    from tests.port import test_fused
    from tests.ladder.sides import test_faults
    from tests.port import test_native
    from tests.port import test_model
    marks = lambda f: {m.name for m in getattr(f, "pytestmark", [])}
    for f in (test_bench_gpu_decode.test_eight_rows_with_numbers_launches_and_json,   # 63 s
              test_bench_gpu_decode.test_count_launches_json_feeds_the_table,         # 42 s
              test_fused.test_triton_kernels_match_their_twins_in_the_body,           # 23+11 s
              test_native.test_bits_do_not_depend_on_the_vector_width,                # 17 s
              test_model.test_triton_backend_matches_torch_backend,                    # 16 s
              test_faults.test_triton_faults_on_a_short_schedule):             # 16 s
        assert "slow" in marks(f), f.__name__
    params = next(m for m in test_fused.test_locate_blames_the_fused_layer.pytestmark
                  if m.name == "parametrize").args[1]
    by_id = {p if isinstance(p, str) else p.values[0]:
             set() if isinstance(p, str) else {m.name for m in p.marks} for p in params}
    assert "slow" in by_id["triton"] and "slow" not in by_id["twin"]     # 15 s against 5 s
    readme = open(os.path.join(paths.ROOT,
                               "README.md"), encoding="utf-8").read()
    assert '`python -m pytest -q -m "not slow"`' in readme
