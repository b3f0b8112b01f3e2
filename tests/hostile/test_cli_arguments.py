"""Bad command-line arguments end in exit 2 and one line naming the value: devices, empty
paths, pad token ids, bits-map keys, the reference CLI's own flags and its failing save.
"""
import json
import os
import pytest
from ladder.cli.main import main as ladder_main


# ---------------------------------------------------------------- 7. arguments
def _one_line_exit_2(rc, capsys, *parts):
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    for p in parts:
        assert p in err, err


@pytest.mark.parametrize("argv, parts", [
    (["run", "--device", "meta"], ["--device meta: device type 'meta' is not one the port"]),
    (["run", "--device", "xpu"], ["--device xpu: device type 'xpu'"]),
    (["run", "--model", "attn_v41", "--device", "meta"], ["--device meta"]),
    (["run", "--params", ""], ["--params '': empty path"]),
    (["run", "--cact", " "], ["--cact ' ': empty path"]),
    (["run", "--fixture", ""], ["--fixture '': empty path"]),
    (["run", "--rules", ""], ["--rules '': empty path"]),
    (["run", "--model", "attn_v41", "--fixture", ""], ["--fixture '': empty path"]),
])
def test_ladder_device_and_empty_paths_refused_up_front(capsys, argv, parts):
    _one_line_exit_2(ladder_main(argv), capsys, *parts)


@pytest.mark.parametrize("argv, parts", [
    (["--seed", str(2 ** 64)], ["--seed 18446744073709551616: outside -2**63..2**64-1"]),
    (["--seed", str(-2 ** 63 - 1)], ["--seed -9223372036854775809: outside"]),
    (["--params", ""], ["--params '': empty path"]),
    (["--save", ""], ["--save '': empty path"]),
    (["--save", "/nonexistent-dir/p.safetensors"], ["directory /nonexistent-dir does not exist"]),
    (["--save", "{tmp}"], ["is a directory"]),
    (["--window", str(10 ** 23)], ["--window 100000000000000000000000: must lie in 0..max_seq_len"
                                   "=64"]),
])
def test_reference_run_refuses_bad_arguments_with_exit_2(tmp_path, capsys, argv, parts):
    from reference.__main__ import main
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    _one_line_exit_2(main(["run", "--steps", "1", "--prompt-len", "1", *argv]), capsys, *parts)


def test_reference_save_failing_is_exit_2_not_a_library_error(tmp_path, capsys):
    from reference.__main__ import main
    os.chmod(tmp_path, 0o500)
    try:
        if os.access(tmp_path, os.W_OK):          # root: the directory stays writable
            os.symlink("/proc/version", tmp_path / "p.safetensors")   # unwritable file
    except OSError:
        pass
    try:
        rc = main(["run", "--steps", "1", "--prompt-len", "1", "--save",
                   str(tmp_path / "p.safetensors")])
    finally:
        os.chmod(tmp_path, 0o700)
    _one_line_exit_2(rc, capsys, "p.safetensors")


def _refused(argv, capsys, tmp_path, match):
    before = sorted(os.listdir(tmp_path))
    assert ladder_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert match in err, err
    assert sorted(os.listdir(tmp_path)) == before            # nothing written
    return err


@pytest.mark.parametrize("pad", [-5, -2147483647])
def test_a_negative_pad_token_id_is_refused(tmp_path, capsys, pad, tiny_cfg, tiny_params):
    from reference.config import ConfigError, V2Config
    from reference.params import save_params
    with pytest.raises(ConfigError, match=f"pad_token_id={pad} outside 0..vocab_size-1"):
        V2Config(**{**tiny_cfg.__dict__, "pad_token_id": pad})
    cfg = json.loads(tiny_cfg.to_json())
    cfg["pad_token_id"] = pad
    path = tmp_path / "p.safetensors"
    save_params(path, tiny_params, None, metadata={"needle_config": json.dumps(cfg)})
    _refused(["run", "--params", str(path)], capsys, tmp_path,
             f"pad_token_id={pad} outside 0..vocab_size-1")


def test_a_look_alike_bits_map_key_is_refused(tmp_path, capsys):
    monkey = "\uff45mbedding=4,default=2"                  # fullwidth 'e'
    _refused(["run", "--weights", "cq", "--bits-map", monkey], capsys, tmp_path,
             "key '\uff45mbedding' holds '\uff45' (U+FF45) at character 0")


@pytest.mark.parametrize("argv", [["run", "--plant", ""], ["locate", "--plant", " "],
                                  ["dump", "torch", "--out", "x.safetensors", "--plant", ""],
                                  ["run", "--port", ""], ["run", "--dump", ""]])
def test_an_empty_plant_port_or_dump_is_refused(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    flag = next(a for a in argv if a in ("--plant", "--port", "--dump"))
    _refused(argv, capsys, tmp_path, f"{flag} '{argv[argv.index(flag) + 1]}': empty")


@pytest.mark.parametrize("argv", [
    ["report", "--out", "{tmp}/" + "o" * 300 + "/r.html"],
    ["sweep", "grid.toml", "--out", "{tmp}/" + "o" * 300],
    ["shrink", "--out", "{tmp}/" + "o" * 300],
])
def test_an_out_name_too_long_for_the_file_system_is_refused_before_any_work(tmp_path, capsys,
                                                                             argv):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    _one_line_exit_2(ladder_main(argv), capsys, "a name of 300 bytes; this file system takes "
                     "at most")
    assert os.listdir(tmp_path) == []
