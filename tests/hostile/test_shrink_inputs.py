"""Hostile values given to `python -m ladder shrink`: its own flags (--max-time, --point, --out,
--force), the pairing of --port with --plant, and the `run` command a sweep row hands to
--from-sweep. Each is refused with exit 2 and one line naming the value and the limit, before
the first candidate is judged, and nothing is written."""
import json
import os
import time

import pytest

from ladder.cli.main import main


def _refused(capsys, argv, *parts):
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and all(p in err for p in parts), err
    assert time.perf_counter() - t0 < 10
    return err


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "-inf", "1e308", "1_0",
                                   "\u0661\u0660", "", " 5", "5s", "1" * 40])
def test_max_time_takes_plain_positive_seconds_only(capsys, value):
    _refused(capsys, ["shrink", "--max-time", value], "--max-time")


def test_max_time_in_range_is_taken():
    from ladder.cli.parser import MAX_SECONDS, seconds
    assert seconds("2.5") == 2.5 and seconds("1e3") == 1000.0
    assert seconds(str(MAX_SECONDS)) == MAX_SECONDS


@pytest.mark.parametrize("flag", ["--point", "--out"])
def test_an_empty_point_or_out_names_nothing_and_is_refused(capsys, flag):
    _refused(capsys, ["shrink", flag, ""], flag, "names nothing")


def _exit(argv, capsys):
    rc = main(argv, out=lambda *_: None)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("make", ["file", "dangling", "under_file", "long", "devnull"])
def test_an_out_that_cannot_take_the_reproducer_is_refused_before_the_search(
        tmp_path, capsys, make):
    target = {"file": tmp_path / "f", "dangling": tmp_path / "link",
              "under_file": tmp_path / "f" / "sub", "long": tmp_path / ("d" * 300),
              "devnull": "/dev/null"}[make]
    (tmp_path / "f").write_text("x")
    os.symlink(tmp_path / "nowhere", tmp_path / "link")
    t0 = time.perf_counter()
    rc, err = _exit(["shrink", "--plant", "rope_pos_plus_1", "--out", str(target)], capsys)
    assert rc == 2 and "--out" in err and err.count("\n") == 1, err
    assert time.perf_counter() - t0 < 5          # refused before any candidate runs
    assert sorted(os.listdir(tmp_path)) == ["f", "link"]


@pytest.mark.parametrize("name", ["test_shrunk_divergence.py", "README.md", "pytest.ini"])
def test_an_existing_reproducer_is_kept_unless_forced_and_a_link_never_replaced(
        tmp_path, capsys, name):
    out = tmp_path / "repro"
    out.mkdir()
    (out / name).write_text("mine")
    rc, err = _exit(["shrink", "--plant", "rope_pos_plus_1", "--out", str(out)], capsys)
    assert rc == 2 and f"{name} is already there" in err and "--force" in err, err
    assert (out / name).read_text() == "mine"
    os.remove(out / name)
    os.symlink(tmp_path / "elsewhere", out / name)
    rc, err = _exit(["shrink", "--plant", "rope_pos_plus_1", "--out", str(out), "--force"],
                    capsys)
    assert rc == 2 and "is a link" in err, err
    assert os.path.islink(out / name) and not os.path.exists(tmp_path / "elsewhere")


def test_a_fault_cannot_be_planted_in_another_port(capsys):
    rc, err = _exit(["shrink", "--port", "tests.ports.toy_port:build", "--plant",
                     "rope_pos_plus_1"], capsys)
    assert rc == 2 and "planted in our port" in err, err


def _sweep_row(tmp_path, run):
    case = tmp_path / "sw" / "cases" / "c0000-x"
    case.mkdir(parents=True)
    (case / "result.json").write_text(json.dumps({"run": run}))
    return str(tmp_path / "sw")


@pytest.mark.parametrize("run,part", [
    ("python -m ladder run --plant 'rope", "does not parse as a shell command"),
    ("python -m ladder run --steps 2 \\", "does not parse as a shell command"),
    ("python -m ladder runx --steps 2", "is not a `python -m ladder run` command"),
    ("python -m ladder locate --steps 2", "is not a `python -m ladder run` command"),
    ("python -m ladder run --help", "sets --help"),
    ("python -m ladder run -h", "sets -h"),
    ("python -m ladder run --h", "sets --help"),       # argparse's shortest prefix of --help
    ("python -m ladder run -hx", "sets -h"),
    ("python -m ladder run --ou=d", "sets --out"),
    ("python -m ladder run --point L00.q", "sets --point"),
    ("python -m ladder run --poi L00.q", "sets --point"),
    ("python -m ladder run --verdict own", "sets --verdict"),
    ("python -m ladder run --out=d", "sets --out"),
    ("python -m ladder run --from-sweep a b", "sets --from-sweep"),
    ("python -m ladder run --max-time 5", "sets --max-time"),
    ("python -m ladder run --force", "sets --force"),
    ("python -m ladder run --for", "sets --force"),
    ("python -m ladder run " + "--steps 2 " * 40, "holds 80 arguments"),
    ("python -m ladder run " + "--no-check-plain " * 100_000, "characters"),
])
def test_a_sweep_rows_run_command_is_checked_before_it_is_parsed(tmp_path, capsys, run, part):
    d = _sweep_row(tmp_path, run)
    t0 = time.perf_counter()
    rc, err = _exit(["shrink", "--from-sweep", d, "c0000"], capsys)
    assert rc == 2 and part in err and "result.json field run" in err, err
    assert err.count("\n") == 1, err
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("flags,part", [
    (["--plant", "rope_pos_plus_1"], "--plant 'rope_pos_plus_1' is a run flag"),
    (["--steps", "9"], "--steps 9 is a run flag"),
    (["--backend", "native"], "--backend 'native' is a run flag"),
])
def test_run_flags_beside_from_sweep_are_refused_not_dropped(tmp_path, capsys, flags, part):
    d = _sweep_row(tmp_path, "python -m ladder run --steps 2 --no-check-plain")
    rc, err = _exit(["shrink", "--from-sweep", d, "c0000", *flags], capsys)
    assert rc == 2 and part in err and err.count("\n") == 1, err


def test_shrinks_own_flags_beside_from_sweep_are_kept(tmp_path, capsys):
    d = _sweep_row(tmp_path, "python -m ladder run --steps 2 --no-check-plain")
    rc, err = _exit(["shrink", "--from-sweep", d, "c0000", "--max-time", "5", "--point",
                     "L00.y"], capsys)
    assert rc == 1, err                  # the clean case: no divergence, nothing to shrink


def test_a_case_name_is_shown_quoted_on_one_line(tmp_path, capsys):
    d = _sweep_row(tmp_path, "python -m ladder run --steps 2")
    rc, err = _exit(["shrink", "--from-sweep", d, "c00\n01"], capsys)
    assert rc == 2 and "'c00\\n01'" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("point", ["L03.qq", "L99.q", "prefill_batch:nothing", "q"])
def test_a_point_of_no_registry_is_refused_before_the_search(capsys, point):
    rc, err = _exit(["shrink", "--plant", "rope_pos_plus_1", "--no-check-plain", "--point",
                     point], capsys)
    assert rc == 2 and "not a point of this model" in err and "candidates" not in err, err


def test_forced_out_over_a_directory_named_like_its_file_is_refused_first(tmp_path, capsys):
    (tmp_path / "o" / "pytest.ini").mkdir(parents=True)
    rc, err = _exit(["shrink", "--plant", "rope_pos_plus_1", "--no-check-plain", "--out",
                     str(tmp_path / "o"), "--force"], capsys)
    assert rc == 2 and "pytest.ini there is not a regular file" in err, err
    assert "candidates" not in err


def test_a_window_that_cannot_reach_a_protocol_port_is_refused(capsys):
    rc, err = _exit(["shrink", "--port", "tests.ports.toy_port:build_buggy", "--window", "4"],
                    capsys)
    assert rc == 2 and "--window cannot reach it" in err, err
