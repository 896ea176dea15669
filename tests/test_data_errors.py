"""Bad input to the data commands: one line naming the file and the problem, exit code 2, no traceback.

Each case runs the real command through click's test runner.
"""
from __future__ import annotations

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from ucmfh.app.cli import main
from ucmfh.data.synthetic import SyntheticSpec, make_synthetic


def user_error(args, *parts: str) -> str:
    """Run ``ucmfh ARGS``; check it failed as a user error and its message holds ``parts``; return the message."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert isinstance(result.exception, SystemExit) and result.exit_code == 2, (result.exception, result.output)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.output
    for part in parts:
        assert part in errors[0], errors[0]
    return errors[0]


# ------------------------------------------------------------------ validate, make-synthetic


@pytest.fixture
def small_file(tmp_path) -> str:
    return make_synthetic(tmp_path / "d.h5", SyntheticSpec(n_query=5, n_retrieval=20, n_train=10, n_classes=3,
                                                           d_img=4, d_txt=3, d_latent=4))


def test_validate_object_of_the_wrong_kind(small_file):
    path = small_file
    with h5py.File(path, "a") as f:
        del f["query"]
        f.create_dataset("query", data=np.zeros(3))
    user_error(["validate", path], f"{path}: /query: expected a group, found a dataset")
    with h5py.File(path, "a") as f:
        del f["query"]
        f.copy(f["train"], "query")
        del f["train"]["image"]
        f["train"].create_group("image")
    user_error(["validate", path], f"{path}: /train/image: expected a dataset, found a group")


def test_validate_float_ids(small_file):
    path = small_file
    with h5py.File(path, "a") as f:
        ids = f["retrieval"]["ids"][()]
        del f["retrieval"]["ids"]
        f["retrieval"].create_dataset("ids", data=ids / 10.0)  # 0.0, 0.1, ..., 0.9 would all load as id 0
    user_error(["validate", path], f"{path}: /retrieval/ids: ids must be integers, got float64")


@pytest.mark.parametrize("args, message", [
    (["--n-classes", "0"], "n_classes must be at least 1, got 0"),
    (["--d-img", "-3"], "d_img must be at least 1, got -3"),
    (["--n-retrieval", "10", "--n-train", "20"], "n_train (20) must be at most n_retrieval (10)"),
    (["--seed", "-1"], "seed must be >= 0, got -1"),
])
def test_make_synthetic_bad_sizes(tmp_path, args, message):
    user_error(["make-synthetic", tmp_path / "s.h5", *args], message)
    assert not (tmp_path / "s.h5").exists()


def test_synthetic_spec_checks_itself():
    with pytest.raises(ValueError, match="noise must be >= 0, got -0.5"):
        SyntheticSpec(noise=-0.5)
    with pytest.raises(ValueError, match="item_scale must be a finite number, got nan"):
        SyntheticSpec(item_scale=float("nan"))
    with pytest.raises(ValueError, match="n_query must be an integer, got 2.5"):
        SyntheticSpec(n_query=2.5)
