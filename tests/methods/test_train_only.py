"""Only the training split may matter: every registered method, through the entry every front
door trains it by (:func:`ucmfh.methods.fit_hashing`, i.e. ``Method.train``), and the fusion stage
(:func:`ucmfh.fusion_stage.fit_fusion`) give the same model, bit for bit, on a dataset whose query and
retrieval splits hold other items (same shapes). Half their rows are NaN: a query or retrieval row that
reached a batch, a statistic (centring, PCA, CCA, ITQ, a similarity matrix, a memory bank) or a
validation split would poison it; the other half are other finite features, labels and ids, which would
change it where NaN might be skipped. The same on a caption set (ids decide positives and the validation
split), and for SEPS, which reads its file itself."""
from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch

from ucmfh.config import HashConfig
from ucmfh.data.h5 import Dataset, Split
from ucmfh.fusion_stage import fit_fusion
from ucmfh.methods import METHODS, build_method, fit_hashing, hash_config

from conftest import small_fusion


def other_items(split: Split, seed: int) -> Split:
    """``split`` with the same shapes and none of its items: even rows NaN, odd rows other features drawn
    at the split's own scale; every label flipped and the ids moved past any of the file's."""
    generator = torch.Generator().manual_seed(seed)

    def features(x: torch.Tensor) -> torch.Tensor:
        out = torch.randn(x.shape, generator=generator) * x.std() + x.mean()
        out[0::2] = math.nan
        return out

    return Split(features(split.img), features(split.txt),
                 None if split.labels is None else 1 - split.labels,
                 None if split.ids is None else split.ids + 10 ** 9)


@pytest.fixture(scope="module")
def swapped(tiny) -> Dataset:
    """``tiny`` with its training split unchanged, the same tensors, and query and retrieval splits of other
    items. In the file train is drawn from retrieval; here the splits are separate, so only train is real."""
    return dataclasses.replace(tiny, query=other_items(tiny.query, 1), retrieval=other_items(tiny.retrieval, 2))


@pytest.fixture(scope="module")
def teacher(tiny):
    """The fusion encoder of the methods that learn from one (its own stage is checked below)."""
    return fit_fusion(tiny, small_fusion(epochs=1), progress=False)[0]


def config(name: str) -> HashConfig:
    """Method ``name`` small enough for CPU, with a validation split that picks the epoch and a refit on the
    whole training split where the method trains by epochs: every use of the data ``train`` makes."""
    trained = not METHODS[name].closed_form
    return hash_config(name, drop_unused=True, n_bits=16, hidden=32, epochs=2, batch_size=64, device="cpu",
                       val_fraction=0.2, patience=0, refit=trained)


def assert_same_model(real: torch.nn.Module, other: torch.nn.Module) -> None:
    a, b = real.state_dict(), other.state_dict()
    assert a.keys() == b.keys()
    assert all(b[k].isfinite().all() for k in b if b[k].is_floating_point()), "a query/retrieval NaN got in"
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"the query/retrieval splits changed {differ[:5]}"


@pytest.mark.parametrize("name", list(METHODS))
def test_a_method_learns_from_the_training_split_alone(tiny, swapped, teacher, name):
    """The model and the training record (losses, validation scores, the epoch and candidate kept) are those
    of the real dataset; for cca-itq the state holds the means and the PCA-CCA-ITQ projection matrices."""
    cfg, fusion = config(name), teacher if build_method(name).uses_fusion else None
    real, real_history = fit_hashing(tiny, cfg, fusion, progress=False)
    other, other_history = fit_hashing(swapped, cfg, fusion, progress=False)
    assert_same_model(real, other)
    assert other_history.as_dict() == real_history.as_dict()


def test_the_fusion_stage_learns_from_the_training_split_alone(tiny, swapped):
    cfg = small_fusion(epochs=2, val_fraction=0.2)
    real, real_history = fit_fusion(tiny, cfg, progress=False)
    other, other_history = fit_fusion(swapped, cfg, progress=False)
    assert_same_model(real, other)
    assert other_history.as_dict() == real_history.as_dict()


def test_a_method_that_replaces_train_is_given_neither_the_withheld_splits_nor_the_file(tiny, monkeypatch):
    """Method.train withheld the splits, and a method of another package may replace it; the file's path, kept,
    let a method read the query split from the file (an audit's plugin centred its features on it)."""
    from ucmfh.data.h5 import Withheld
    from ucmfh.methods.two_tower import TwoTower

    seen = []

    class Peeking(TwoTower):
        name = "peeking"

        def train(self, data, cfg, fusion=None, progress=True, state=None):
            seen.append((data.path, data.query, data.retrieval, data.name))
            raise RuntimeError("seen")

    monkeypatch.setitem(METHODS, "peeking", Peeking())
    with pytest.raises(RuntimeError, match="seen"):
        fit_hashing(tiny, dataclasses.replace(config("two-tower"), method="peeking"), progress=False)
    path, query, retrieval, name = seen[0]
    # for messages: the file's name, not its name attribute
    assert tiny.path and path is None and name == os.path.basename(tiny.path)
    assert isinstance(query, Withheld) and isinstance(retrieval, Withheld)


@pytest.fixture(scope="module")
def captions(tmp_path_factory) -> Dataset:
    """A caption set (relevance by id: a method's positives are its item's other captions), as ``tiny``."""
    from ucmfh.data.h5 import load_dataset

    from conftest import caption_file

    return load_dataset(caption_file(tmp_path_factory.mktemp("captions") / "c.h5"))


@pytest.mark.parametrize("name", list(METHODS))
def test_a_method_learns_from_a_caption_set_s_training_split_alone(captions, name):
    """A caption set's ids decide positives and the validation split (grouped by id): the query's and
    retrieval's ids, moved and poisoned, change nothing."""
    swapped = dataclasses.replace(captions, query=other_items(captions.query, 3),
                                  retrieval=other_items(captions.retrieval, 4))
    cfg = dataclasses.replace(config(name), batch_size=32)
    fusion = fit_fusion(captions, small_fusion(epochs=1), progress=False)[0] if build_method(name).uses_fusion else None
    real, real_history = fit_hashing(captions, cfg, fusion, progress=False)
    other, other_history = fit_hashing(swapped, cfg, fusion, progress=False)
    assert_same_model(real, other)
    assert other_history.as_dict() == real_history.as_dict()


def test_seps_learns_from_the_training_split_of_its_file_alone(tmp_path):
    """SEPS reads its file itself (token features): a file whose query split holds other images and captions
    (other tokens, ids, pooled features) gives the same model and record."""
    from ucmfh.data.writer import write_dataset
    from ucmfh.seps import fit_seps

    from conftest import small_seps, token_splits

    real = token_splits(seed=0)
    other = token_splits(seed=7)
    poisoned = {**real, "query": {**other["query"], "ids": other["query"]["ids"] + 10 ** 6}}
    paths = [write_dataset(tmp_path / f"{name}.h5", splits) for name, splits in (("real", real), ("other", poisoned))]
    (a, a_history), (b, b_history) = (fit_seps(path, small_seps(epochs=2), progress=False) for path in paths)
    assert_same_model(a, b)
    assert a_history.as_dict() == b_history.as_dict()
