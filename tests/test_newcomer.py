"""What a newcomer trips on (issue 24, section 3): each test fails without its fix."""
import importlib

from ladder.cli import main


def run(*argv):
    lines = []
    rc = main(list(argv), out=lines.append)
    return rc, "\n".join(lines)


def test_ladder_locate_is_the_function_and_its_module_stays_importable():
    mod = importlib.import_module("ladder.locate")
    from ladder import locate
    assert callable(locate) and locate is mod.locate
    import ladder.locate  # noqa: F401  (binding the submodule must not replace the function)
    import ladder
    assert ladder.locate is mod.locate
    from ladder.locate import Location, locate as again
    assert again is mod.locate and Location is mod.Location


def test_fixture_given_by_its_safetensors_file_names_the_right_files(tmp_path, capsys):
    for name in ("x.safetensors", "x.json", "x"):
        assert run("run", "--fixture", str(tmp_path / name)) == (2, "")
        err = capsys.readouterr().err
        assert f"no {tmp_path / 'x'}.json + {tmp_path / 'x'}.safetensors" in err, err
        assert ".safetensors.json" not in err and ".json.json" not in err
