"""What a writer in another language needs, held to the code (issue 34): the registry as
`ladder points` prints it, and params_sha256 computed from its documented recipe alone."""
from tests import paths
import hashlib
import json
import os

import numpy as np

from ladder.cli.main import main
from ladder.engine.trace import Ladder
from tests.captures import reference_ladder, setup

ROOT = paths.ROOT


def test_points_prints_every_recorded_value_with_its_shape_in_forward_order(capsys):
    assert main(["points", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["points"]
    ref = reference_ladder()            # what the reference actually records, step by step
    st = ref.steps[0]
    recorded = [k.split("/", 1)[1] for k in ref.keys() if k.startswith(st.name + "/")]
    assert [r["name"] for r in rows] == recorded
    for r in rows:
        assert list(ref[f"{st.name}/{r['name']}"].shape[1:]) == r["shape"], r["name"]
    assert [r["index"] for r in rows] == list(range(len(rows)))
    assert {r["scope"] for r in rows} == {"whole", "site", "layer"}


def test_points_text_names_the_geometry_and_is_refused_on_a_missing_file(capsys):
    assert main(["points"]) == 0
    text = capsys.readouterr().out
    assert "d_model=48" in text and "L05.x" in text and "[4, 48]" in text
    assert main(["points", "--cact", "no_such.cact"]) == 2
    assert "--cact no_such.cact" in capsys.readouterr().err


def _documented_params_sha256(params) -> str:
    """docs/porting.md's recipe, written from the text alone: for each parameter in order of
    its name's UTF-8 bytes, the UTF-8 header `NAME|torch.float32|[D0, D1, ...]|` then the
    values as little-endian float32 in C order; SHA-256 of the whole, lower-case hex."""
    h = hashlib.sha256()
    for name in sorted(params, key=lambda n: n.encode()):
        a = np.ascontiguousarray(params[name].numpy(), dtype="<f4")
        dims = ", ".join(str(d) for d in a.shape)
        h.update(f"{name}|torch.float32|[{dims}]|".encode())
        h.update(a.tobytes(order="C"))
    return h.hexdigest()


def test_params_sha256_follows_its_documented_recipe(tmp_path):
    doc = open(os.path.join(ROOT, "docs", "porting.md"), encoding="utf-8").read()
    assert "`NAME|torch.float32|[D0, D1, ...]|`" in doc          # the recipe the test follows
    out = tmp_path / "d.safetensors"
    assert main(["dump", "torch", "--out", str(out), "--prompt-len", "2", "--steps", "1"]) == 0
    recorded = Ladder.load(out).meta["weights"]["params_sha256"]
    assert recorded == _documented_params_sha256(setup()[1])


def test_the_weight_identity_line_says_what_was_checked_and_what_was_absent(tmp_path, capsys):
    from safetensors.torch import save_file
    from reference.params import load_safetensors
    from ladder.engine import archive
    out = tmp_path / "d.safetensors"
    assert main(["dump", "torch", "--out", str(out), "--prompt-len", "2", "--steps", "1"]) == 0
    capsys.readouterr()
    assert main(["compare", str(out), "reference"]) == 0
    text = capsys.readouterr().out
    assert "checked params_sha256" in text
    assert "; sha256 absent" in text and "(a name, not checked)" in text
    assert ": recorded in float32 (producer.dtype)" in text        # the side's dtype, said
    tensors, meta = load_safetensors(out)
    for value, rc, needle in ((None, 0, "params_sha256 absent"),
                              ("ab" * 32, 2, "weights field params_sha256 is " + "ab" * 32)):
        m = json.loads(meta[archive.META_KEY])
        m["weights"]["params_sha256"] = value
        bad = tmp_path / "b.safetensors"
        save_file(tensors, str(bad), metadata={archive.META_KEY: json.dumps(m)})
        assert main(["compare", str(bad), "reference"]) == rc
        assert needle in "".join(capsys.readouterr())      # whole hashes, never cut
