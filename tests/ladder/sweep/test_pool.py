"""The sweep's runner at -j 2 (ladder.sweep.command.run_cases): this process computes cases
beside its spawned worker, every job runs exactly once, and a worker's error reaches the
caller. The jobs here are cheap stand-ins for run_case, importable by name as a spawned worker
needs them to be."""
import os

import pytest

from ladder.sweep.command import run_cases


def whose(job):
    return {"id": job["id"], "pid": os.getpid()}


def fails_on_3(job):
    if job["id"] == 3:
        raise ValueError("case 3 broke")
    return {"id": job["id"], "pid": os.getpid()}


def test_at_j2_this_process_computes_beside_its_worker_and_each_job_runs_once():
    rows = []
    run_cases([{"id": i} for i in range(12)], 2, 1, False, rows.append, work=whose)
    assert sorted(r["id"] for r in rows) == list(range(12))
    pids = {r["pid"] for r in rows}
    assert os.getpid() in pids and len(pids) == 2        # this process and one worker


def test_at_j1_every_job_runs_here_in_order():
    rows = []
    run_cases([{"id": i} for i in range(4)], 1, 1, False, rows.append, work=whose)
    assert [r["id"] for r in rows] == [0, 1, 2, 3] and {r["pid"] for r in rows} == {os.getpid()}


def test_an_error_in_either_process_reaches_the_caller():
    # job 3 is the worker's first (submitted before this process takes any) at -j 2, ...
    with pytest.raises(ValueError, match="case 3 broke"):
        run_cases([{"id": 3}] + [{"id": i} for i in range(4, 8)], 2, 1, False, lambda r: None,
                  work=fails_on_3)
    # ... and this process's own here, where the worker takes job 0
    with pytest.raises(ValueError, match="case 3 broke"):
        run_cases([{"id": 0}, {"id": 3}], 2, 1, False, lambda r: None, work=fails_on_3)
