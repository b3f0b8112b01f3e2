"""Issue 32: the readers added since the first fuzzing round, fuzzed with Hypothesis (it draws
the seed of the random.Random that drives the mutations of tests/hostile/readers.py,
derandomized: the same cases every run; a seed, not `randoms()`, because conftest.py flushes
denormals, which Hypothesis's float draws refuse). Each mutated input is accepted or refused with its reader's own error; nothing else may
escape, and an input that is certainly invalid (`Case.hostile`) must be refused. The same
generators feed tools/hostile/hostile_inputs.py --readers, which runs a thousand and more of them
through the CLI."""
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.hostile import readers as hr

EXAMPLES = {"archive": 40, "needle_rs": 30, "namemap": 30, "grid": 40, "merge": 25, "port": 12,
            "image": 30}


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    return hr.make_bases(str(tmp_path_factory.mktemp("bases")))


def _check(case):
    try:
        case.read()
    except case.errors:
        return "refused"
    assert not case.hostile, f"accepted a hostile input: {case.kind}"
    return "accepted"


@pytest.mark.parametrize("reader", sorted(hr.READERS))
def test_fuzzed_reader_accepts_or_refuses_with_its_own_error(reader, bases, tmp_path_factory):
    seen = {"refused": 0, "accepted": 0}

    @settings(max_examples=EXAMPLES[reader], deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(seed=st.integers(0, 2 ** 32 - 1))
    def one(seed):
        tmp = str(tmp_path_factory.mktemp(reader))
        seen[_check(hr.READERS[reader](random.Random(seed), bases, tmp))] += 1
    one()
    assert seen["refused"] > 0, seen              # the mutations do reach the reader's checks


def test_the_generators_hostile_cases_can_fail_the_check(bases, tmp_path):
    """A reader that accepted everything would be caught: a hostile case read by a stub."""
    case = hr.archive_case(random.Random(0), bases, str(tmp_path))
    case.hostile, case.read = True, lambda: None
    with pytest.raises(AssertionError, match="accepted a hostile input"):
        _check(case)
