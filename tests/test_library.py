"""The library as a notebook user meets it: the public entry points refuse an argument of another type in one
line that says what to give, before anything deep inside fails on it; a trained model's codes and scores
are one call each."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import ucmfh
from ucmfh.models.fusion import FusionEncoder

from conftest import ROOT, method_config, small_fusion


@pytest.fixture(scope="module")
def trained(tiny):
    model, _ = ucmfh.fit_hashing(tiny, method_config("two-tower", epochs=1), progress=False)
    return model


def test_a_wrong_type_at_an_entry_point_says_what_to_give(tiny, tiny_path, trained):
    hash_cfg, fusion_cfg = method_config("two-tower"), ucmfh.FusionConfig(device="cpu")
    fusion = FusionEncoder.from_config(tiny.d_img, tiny.d_txt, fusion_cfg)
    calls = [
        (lambda: ucmfh.fit_hashing(tiny_path, hash_cfg),
         rf"^fit_hashing: data must be a Dataset \(ucmfh.load_dataset\(path\)\), got str '{tiny_path}'$"),
        (lambda: ucmfh.fit_hashing(tiny.train, hash_cfg), r"^fit_hashing: data must be a Dataset .*got Split$"),
        (lambda: ucmfh.fit_hashing(tiny, fusion_cfg),
         r"^fit_hashing: cfg must be a HashConfig \(ucmfh.hash_config\(method, ...\)\), got FusionConfig$"),
        (lambda: ucmfh.fit_hashing(tiny, hash_cfg, "fusion.pt"),
         r"^fit_hashing: fusion must be a FusionEncoder or a FusionConfig or None \(ucmfh.fit_fusion, or the "
         r"FusionConfig of ucmfh.stage_configs\), got str 'fusion.pt'$"),
        (lambda: ucmfh.fit_fusion(tiny, hash_cfg), r"^fit_fusion: cfg must be a FusionConfig .*got HashConfig$"),
        (lambda: ucmfh.evaluate_hashing("hash64.pt", tiny),
         r"^evaluate_hashing: model must be a hashing model \(ucmfh.fit_hashing, or ucmfh.load_model\(path, "
         r"'hash'\)\), got str 'hash64.pt'$"),
        (lambda: ucmfh.evaluate_hashing(fusion, tiny), r"^evaluate_hashing: model must be a hashing model .*got "
                                                        r"FusionEncoder$"),
        (lambda: ucmfh.evaluate_hashing(trained, tiny_path), r"^evaluate_hashing: data must be a Dataset"),
        (lambda: ucmfh.evaluate_fusion(trained, tiny), r"^evaluate_fusion: fusion must be a FusionEncoder .*got "
                                                        r"FeatureHasher$"),
        (lambda: ucmfh.encode_split(trained, tiny), r"^encode_split: split must be a Split \(a split of "
                                                     r"ucmfh.load_dataset\(path\): .query, .retrieval\), got Dataset$"),
        (lambda: ucmfh.save_checkpoint("hash.pt", trained, None, fusion_cfg),
         r"^save_checkpoint: hash_cfg must be a HashConfig or None, got FusionConfig$"),
        (lambda: ucmfh.evaluate_hashing(trained, tiny, k="50"), r"^evaluate_hashing: k must be an int, got str '50'$"),
        # a path that is not one: Python's 'expected str, bytes or os.PathLike object', or bytes made a dataset
        # whose repr failed
        (lambda: ucmfh.load_dataset(None), r"^load_dataset: path must be a file path \(str or os.PathLike\), got "
                                           r"NoneType$"),
        (lambda: ucmfh.load_dataset(tiny_path.encode()), r"^load_dataset: path must be a file path .*got bytes b'"),
        (lambda: ucmfh.load_model(None, "hash"), r"^load_model: path must be a file path"),
    ]
    for call, message in calls:
        with pytest.raises(TypeError, match=message):
            call()
    calls = [  # 'foo is needed here'; None took either kind
        (lambda: ucmfh.load_model("hash.pt", "foo"), r"^load_model: kind must be 'fusion' or 'hash' .*got 'foo'$"),
        (lambda: ucmfh.load_model("hash.pt", None), r"^load_model: kind must be 'fusion' or 'hash' .*got None$"),
    ]
    for call, message in calls:
        with pytest.raises(ValueError, match=message):
            call()
    calls = [
        (lambda: ucmfh.write_dataset("x.h5", [1, 2]), r"^write_dataset: splits must be a dict of train/query/"),
    ]
    for call, message in calls:
        with pytest.raises(TypeError, match=message):
            call()


def test_a_file_read_unvalidated_that_is_not_of_the_format_is_said_in_validation_s_words(tmp_path):
    """load_dataset(path, validate=False) of a codes file or a text file ended in h5py's KeyError or OSError (an
    audit's)."""
    import h5py

    (tmp_path / "notes.txt").write_text("hello")
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = np.zeros(3)
    for name, said in (("notes.txt", r"notes\.txt: not a readable HDF5 file"),
                       ("other.h5", r"other\.h5: /train: missing group \(the file has: \['x'\]\)")):
        with pytest.raises(ucmfh.DataError, match=said):
            ucmfh.load_dataset(tmp_path / name, validate=False)


def test_fit_fusion_goes_on_from_a_copy_of_the_encoder_given_as_fit_hashing_does(tiny):
    """fit_fusion(data, cfg, fusion) trained the encoder given in place and returned it (an audit's), where
    fit_hashing leaves its own as it was."""
    cfg = small_fusion(epochs=1)
    given, _ = ucmfh.fit_fusion(tiny, cfg, progress=False)
    before = {k: v.clone() for k, v in given.state_dict().items()}
    more, _ = ucmfh.fit_fusion(tiny, cfg, given, progress=False)
    assert more is not given and all(torch.equal(v, given.state_dict()[k]) for k, v in before.items())
    assert not all(torch.equal(v, more.state_dict()[k]) for k, v in before.items())  # trained on from it


def test_a_missing_file_is_a_file_not_found_and_a_value_error_whichever_call_reads_it(tmp_path):
    """A missing file was a DataError or a CheckpointError (ValueErrors) from some calls, a FileNotFoundError
    from others: ``except FileNotFoundError`` missed the first, ``except ValueError`` the second (an audit's)."""
    from ucmfh.codes import load_codes
    from ucmfh.search.collection import read_queries

    missing = str(tmp_path / "nope")
    calls = {"load_dataset": ucmfh.load_dataset, "validate_file": ucmfh.validate_file,
             "load_model": lambda path: ucmfh.load_model(path, "hash"), "Encoder": ucmfh.Encoder,
             "load_codes": load_codes, "evaluate_codes_file": ucmfh.evaluate_codes_file, "Index.load": ucmfh.Index.load,
             "build_index": lambda path: ucmfh.build_index(path, path, str(tmp_path / "ix")),
             "read_queries": lambda path: read_queries(path, "img", {"img": 4, "txt": 4})}
    for name, call in calls.items():
        with pytest.raises(FileNotFoundError, match=r"nope: no such ") as caught:
            call(missing)
        assert isinstance(caught.value, ValueError), name


@pytest.mark.parametrize("given, error, said", [
    ("1GB", TypeError, r"^load_dataset: max_memory_bytes must be an int or None \(bytes, e.g. 8 \* 2\*\*30\), got "
                       r"str '1GB'$"),
    (-5, ValueError, r"^load_dataset: max_memory_bytes must be a positive number of bytes \(None: every split in "
                     r"memory\), got -5$"),  # as 0: every split was streamed without a word; '1GB' failed deep inside
])
def test_a_memory_threshold_that_is_no_size_is_refused_naming_it(tiny_path, given, error, said):
    with pytest.raises(error, match=said):
        ucmfh.load_dataset(tiny_path, max_memory_bytes=given)


def test_a_model_given_features_of_other_widths_says_so(tiny, trained, tmp_path):
    """torch's own refusal, deep in the first layer, named neither the model's widths nor the split's."""
    from ucmfh.data.synthetic import SyntheticSpec, make_synthetic

    other = ucmfh.load_dataset(make_synthetic(tmp_path / "wide.h5", SyntheticSpec(
        n_query=10, n_retrieval=40, n_train=20, d_img=tiny.d_img + 3, d_txt=tiny.d_txt)))
    widths = f"the model takes {tiny.d_img}-d image and {tiny.d_txt}-d text features, the split has " \
             f"{tiny.d_img + 3}-d and {tiny.d_txt}-d"
    for call, name in ((lambda: ucmfh.evaluate_hashing(trained, other), "evaluate_hashing"),
                       (lambda: ucmfh.encode_split(trained, other.query), "encode_split")):
        with pytest.raises(ValueError, match=f"^{name}: {widths}"):
            call()


def test_a_trained_model_s_codes_and_scores_are_one_call_each(tiny, trained):
    img, txt = ucmfh.encode_split(trained, tiny.query)  # unimodal: each modality's codes from itself
    assert img.shape == txt.shape == (len(tiny.query.img), 16)
    assert set(img.unique().tolist()) <= {-1.0, 1.0}
    assert all(torch.equal(a, b) for a, b in zip((img, txt), trained.codes(tiny.query.img, tiny.query.txt, "unimodal")))
    [row] = ucmfh.evaluate_hashing(trained, tiny, protocols=["unimodal"])
    assert row["protocol"] == "unimodal" and 0 < row["map_i2t"] <= 1 and 0 < row["map_t2i"] <= 1
    with pytest.raises(ValueError, match=r"unknown protocol\(s\) \['both'\]"):
        ucmfh.encode_split(trained, tiny.query, "both")
    with pytest.raises(ValueError, match=r"^no protocol given"):  # no rows, where scores were asked for
        ucmfh.evaluate_hashing(trained, tiny, protocols=[])
    assert ucmfh.evaluate_hashing(trained, tiny, protocols="unimodal") == [row]  # one protocol as itself
    assert ucmfh.evaluate_hashing(trained, tiny) == [row]  # leak-free: unimodal alone, as train-hash scores it
    # numpy's integer as k, as every metric takes it (it was 'k must be an int, got int64')
    assert ucmfh.evaluate_hashing(trained, tiny, k=np.int64(row["k"])) == [row]
    for settings, said in [({"n_bits": [16, 64]}, r"n_bits must be one code length, an int \(several: "
                                                  r"stage_configs\(method, n_bits=\[16, 64\]\)\), got \[16, 64\]"),
                           ({"dataset": 5}, r"dataset must be a dataset's name or file, got int"),
                           ({"hidden": 2 ** 31}, r"hidden must be in \[0, 2147483647\] \(0: a linear head\)")]:
        with pytest.raises(ucmfh.SettingError, match=said):
            ucmfh.hash_config("two-tower", **settings)


def test_a_history_and_an_encoder_print_what_they_hold(tiny, trained, tmp_path):
    _, history = ucmfh.fit_hashing(tiny, method_config("two-tower", epochs=2), progress=False)
    assert repr(history) == (f"History(2 epochs, loss {history[0]:.4g} -> {history[1]:.4g}, kept epoch "
                             f"{history.best_epoch}, validation {history.best_score:.4f}, chosen "
                             f"{history.chosen!r} of 2)")
    # without a validation split the first candidate is trained alone: it said "chosen 't0.3' of 0"
    _, alone = ucmfh.fit_hashing(tiny, method_config("two-tower", epochs=1, val_fraction=0), progress=False)
    assert repr(alone).endswith(f", {alone.chosen!r}, the first candidate (no validation split to choose on))")
    path = ucmfh.save_checkpoint(tmp_path / "hash16.pt", trained, None, method_config("two-tower", epochs=1))
    assert repr(ucmfh.Encoder(path)) == f"Encoder('two-tower', 16 bits, image 48-d, text 32-d, on cpu; {path})"


def test_the_library_page_s_python_block_runs(tiny_path, tmp_path, monkeypatch):
    """docs/library.md's first block, on the tiny dataset for 2 epochs at 16 bits: what it promises runs."""
    page = open(os.path.join(os.path.dirname(__file__), "..", "docs", "library.md"), encoding="utf-8").read()
    block = page.split("```python\n", 1)[1].split("```", 1)[0]
    small = (block.replace('"../shared/data/wiki.h5"', repr(tiny_path)).replace("n_bits=64)", "n_bits=16, epochs=2)")
             .replace("n_bits=[64])", "n_bits=[16], epochs=2, device='cpu')"))
    assert small.count(repr(tiny_path)) == 1 and small.count("epochs=2") == 3
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(small, "docs/library.md", "exec"), scope)
    assert scope["img"].shape == (len(scope["data"].query), 16) and len(scope["rows"]) == 1
    assert ucmfh.load_model("wiki64.pt", "hash")[2] == scope["cfg"]
    assert scope["ucmfh_cfg"].method == "ucmfh" and scope["fusion_cfg"].epochs == scope["ucmfh_cfg"].epochs == 2
    assert len(scope["history"]) == 2  # UCMFH's reference holds out no validation part: its last epoch is kept
    assert scope["released"].method_params["fusion_start"] == "random" and scope["model"].fusion is not None


def test_scoring_a_model_leaves_it_in_its_mode_and_on_its_device(tiny, trained, monkeypatch):
    """A custom loop validates between two epochs: encode_split had set the whole model to eval mode, and on a
    GPU moved it there, for good."""
    from cuda_standin import cuda_standin, on_cuda

    trained.train()
    trained.img_head.eval()  # a frozen part stays frozen
    try:
        with cuda_standin(monkeypatch):
            img, _ = ucmfh.encode_split(trained, tiny.query, device="cuda")
            assert on_cuda(img)
            assert all(not on_cuda(p) for p in trained.parameters())
        ucmfh.evaluate_hashing(trained, tiny, device="cpu")  # the stand-in's torch.cuda stays until the test ends
        assert trained.training and not trained.img_head.training and trained.txt_head.training
    finally:
        trained.eval()


def test_a_split_made_by_hand_is_taken_or_refused_in_words(tiny, trained):
    from dataclasses import replace

    import numpy as np

    query = tiny.query
    as_given = ucmfh.encode_split(trained, query)
    for made in (replace(query, img=query.img.double(), txt=query.txt.double()),
                 replace(query, img=query.img.numpy(), txt=query.txt.numpy()),
                 # labels and ids as lists (said to be 'a row for each of its items, got list'; an audit's)
                 replace(query, labels=query.labels.tolist(), ids=None if query.ids is None else query.ids.tolist())):
        assert all(torch.equal(a, b) for a, b in zip(ucmfh.encode_split(trained, made), as_given))
    half = replace(query, img=query.img.half())  # float16 features: read as float32, where torch refused Half
    assert all(torch.equal(a, b) for a, b in zip(ucmfh.encode_split(trained, half),
                                                 ucmfh.encode_split(trained, replace(query, img=half.img.float()))))
    nan = query.img.clone()
    nan[3, 1] = float("nan")
    refused = [(replace(query, img=nan), ucmfh.DataError, r"^encode_split: split.img holds NaN or infinity"),
               (query.subset(slice(0, 0)), ValueError, r"^encode_split: the split has no items$"),
               (replace(query, txt=query.txt[:5]), ValueError, r"^encode_split: split.img has \d+ rows, split.txt 5$"),
               (replace(query, labels=query.labels[:5]), ValueError,
                r"^encode_split: split.labels must have a row for each of its \d+ items, got 5 rows$"),
               (replace(query, img=np.zeros(3)), ValueError,
                r"^encode_split: split.img must be 2-D floating-point features \[N, d\], got Tensor of shape \(3,\)")]
    for split, error, message in refused:
        with pytest.raises(error, match=message):
            ucmfh.encode_split(trained, split)
    # said by the entry point called, not by the encoder it calls ('encode_split: split.img' from evaluate_hashing)
    with pytest.raises(ucmfh.DataError, match=r"^evaluate_hashing: data.query.img holds NaN or infinity"):
        ucmfh.evaluate_hashing(trained, replace(tiny, query=replace(query, img=nan)))
    with pytest.raises(ValueError, match=r"^encode_split: batch_size must be a positive whole number, got 0$"):
        ucmfh.encode_split(trained, query, batch_size=0)


def test_a_training_split_of_one_item_is_said_by_its_method():
    """'training needs at least 2 items, got 1' came from the batches, naming neither method nor stage."""
    from ucmfh.data.h5 import Split
    from ucmfh.trainer import fit

    one = Split(torch.randn(1, 6), torch.randn(1, 4), None)
    with pytest.raises(ValueError, match=r"^method 'two-tower': 1 training item; training needs at least 2$"):
        fit(lambda setup: pytest.fail("a plan was made"), one, ucmfh.hash_config("two-tower", n_bits=16, val_fraction=0))


def test_a_fit_refuses_what_trained_a_model_of_nan_or_was_ignored_and_takes_numpy_and_no_grad(tiny, tiny_path,
                                                                                              trained):
    """An audit as a notebook user: NaN among the training features trained a model of NaN without a word (its
    validation score and MAP reported all the same); a fusion encoder given to two-tower was ignored, one of other
    widths failed deep in its first layer; a fit inside torch.no_grad() ended in 'element 0 of tensors does not
    require grad', one inside torch.inference_mode() blamed its method, one of numpy features was an
    AttributeError."""
    from dataclasses import replace

    cfg = method_config("two-tower", epochs=1)
    nan = tiny.train.img.clone()
    nan[7, 3] = float("nan")
    fusion = FusionEncoder.from_config(tiny.d_img, tiny.d_txt, ucmfh.FusionConfig(device="cpu"))
    other = FusionEncoder.from_config(tiny.d_img + 1, tiny.d_txt, ucmfh.FusionConfig(device="cpu"))
    for call, error, message in [
        (lambda: ucmfh.fit_hashing(replace(tiny, train=replace(tiny.train, img=nan)), cfg, progress=False),
         ucmfh.DataError, r"^fit_hashing: data.train.img holds NaN or infinity \(features must be finite\)$"),
        (lambda: ucmfh.fit_fusion(replace(tiny, train=replace(tiny.train, img=nan)),
                                  ucmfh.FusionConfig(device="cpu", epochs=1), progress=False),
         ucmfh.DataError, r"^fit_fusion: data.train.img holds NaN"),
        (lambda: ucmfh.fit_hashing(tiny, cfg, fusion, progress=False), ValueError,
         r"^fit_hashing: method 'two-tower' learns from the features alone; it takes no fusion encoder"),
        (lambda: ucmfh.fit_hashing(tiny, method_config("ucmfh", epochs=1), other, progress=False), ValueError,
         rf"^fit_hashing: the fusion encoder takes {tiny.d_img + 1}-d image and {tiny.d_txt}-d text features, "
         rf"data.train has {tiny.d_img}-d and {tiny.d_txt}-d")]:
        with pytest.raises(error, match=message):
            call()
    as_numpy = replace(tiny, train=replace(tiny.train, img=tiny.train.img.numpy(), txt=tiny.train.txt.numpy(),
                                           labels=tiny.train.labels.numpy()))
    with torch.no_grad():
        model, _ = ucmfh.fit_hashing(as_numpy, cfg, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), trained.state_dict().values()))
    # inside torch.inference_mode(), data read there too (inference tensors): it blamed the method, "its plan's
    # loss(batch) ... returned a tensor of shape [] with no gradient (computed under no_grad, or detached)"
    with torch.inference_mode():
        inside = ucmfh.load_dataset(tiny_path)
        assert inside.train.img.is_inference()
        model, _ = ucmfh.fit_hashing(inside, cfg, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), trained.state_dict().values()))
    assert not any(t.is_inference() for t in model.state_dict().values())  # weights a later fit can train on


def test_a_training_whose_loss_is_no_longer_finite_stops_and_says_so(tiny):
    """A learning rate beyond reason made every weight NaN, and the run went on to its end, its codes one code."""
    cfg = method_config("two-tower", epochs=3, lr_head=1e38, val_fraction=0.0)
    with pytest.raises(ValueError, match=r"^two-tower \d+ bits: the training loss is nan at epoch 1: the training "
                                         r"diverged"):
        ucmfh.fit_hashing(tiny, cfg, progress=False)


def test_code_lengths_and_devices_are_settings_checked_where_they_are_given():
    assert [c.n_bits for c in ucmfh.stage_configs("two-tower", n_bits=16).hashes] == [16]
    for call, message in [(lambda: ucmfh.hash_config(n_bits=0), r"^n_bits must be in \[8, 256\], got 0$"),
                          (lambda: ucmfh.stage_configs("two-tower", n_bits=[16, 300]), r"got 300$"),
                          (lambda: ucmfh.stage_configs("two-tower", n_bits=[]), r"^n_bits: no code length given$"),
                          (lambda: ucmfh.hash_config(device="gpu"),
                           r"^device must be auto, cpu, cuda or cuda:N, got 'gpu'$")]:
        with pytest.raises(ucmfh.SettingError, match=message):
            call()
    assert ucmfh.hash_config(device="cuda:1").device == "cuda:1"  # a spelling; the machine decides when it is used


def test_a_caption_set_s_missing_labels_and_mixed_codes_are_said_as_such():
    codes = torch.ones(4, 16)
    with pytest.raises(TypeError, match=r"^query_labels: None; .* use map_at_k_by_id, recall_at_ranks or "):
        ucmfh.map_at_k(codes, codes, None, None)
    with pytest.raises(ValueError, match=r"^the query set is empty$"):  # its MAP was 0.0, read as a score
        ucmfh.map_at_k(codes[:0], codes, torch.ones(0, 2), torch.ones(4, 2))
    packed = torch.full((4, 2), 255, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"the query codes are packed, the others not$"):
        ucmfh.map_at_k(packed, codes, torch.ones(4, 2), torch.ones(4, 2))


def test_the_names_loaded_on_first_use_are_listed():
    assert {"fit_hashing", "Index", "Split", "Dataset", "History", "separate_draws", "save_codes", "load_codes"} <= \
        set(dir(ucmfh))
    assert not [name for name in dir(ucmfh) if name.startswith("_") and not name.startswith("__")]  # nor its own
    assert "import_module" not in dir(ucmfh)
    # what a fit stopped by a signal raises, which docs/library.md names (it was not a name of the package)
    assert ucmfh.TrainingInterrupted.__module__ == "ucmfh.signals"
    assert issubclass(ucmfh.TrainingInterrupted, KeyboardInterrupt)
    assert all(hasattr(ucmfh, name) for name in ucmfh.__all__)


def test_the_metrics_package_loads_its_names_and_modules_when_asked():
    """``ucmfh.metrics`` imports its modules on first use (the light ones without torch), and a module of it is
    an attribute of the package, as when the package imported them all."""
    code = ("import sys, ucmfh.metrics as m\nassert 'torch' not in sys.modules\n"
            "assert m.ranking.map_at_k is m.map_at_k and m.intervals.paired_bootstrap\n"
            "try:\n    m.no_such_name\nexcept AttributeError as err:\n    print(err)")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "module 'ucmfh.metrics' has no attribute 'no_such_name'\n"


def test_scoring_s_progress_bar_steps_a_chunk_of_queries_at_a_time_to_its_total(tiny, trained, tmp_path,
                                                                                monkeypatch):
    """The cosine diagnostic took 36 s of 48 at 5,000 queries × 100,000 items, its bar of two steps (rankings)
    standing at the first: the bar counts the queries ranked, a chunk at a time, and ends at its total, on a
    labelled set and a caption set, for the codes and cosine rankings and a fusion encoder's."""
    from conftest import caption_file
    from ucmfh import evaluation
    from ucmfh.metrics import ranking

    bars = []

    class Bar:  # the scoring bars; the encoding's are iterated over
        def __init__(self, iterable=(), total=None, desc="", **kwargs):
            self.iterable, self.total, self.steps = iterable, total, []
            if desc.startswith("scoring") and not kwargs.get("disable"):
                bars.append(self)

        def __iter__(self):
            return iter(self.iterable)

        def update(self, n=1):
            self.steps.append(n)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(evaluation, "tqdm", Bar)
    monkeypatch.setitem(ranking.scores_by_rule.__kwdefaults__, "chunk_size", 16)  # several chunks a direction
    captions = ucmfh.load_dataset(caption_file(tmp_path / "captions.h5", n_query=20))
    fusion = FusionEncoder.from_config(tiny.d_img, tiny.d_txt, ucmfh.FusionConfig(device="cpu"))
    for data in (tiny, captions):
        model = trained if data is tiny else ucmfh.fit_hashing(data, method_config("two-tower", epochs=1),
                                                                 progress=False)[0]
        bars.clear()
        rows = evaluation.evaluate_hashing(model, data, progress=True, real_valued=True)
        queries = 2 * len(data.query) if data is tiny else 2 * (20 + 60)  # a caption set: per database
        assert [bar.total for bar in bars] == [2 * queries] and sum(bars[0].steps) == 2 * queries
        assert len(bars[0].steps) > 4 and max(bars[0].steps) <= 16, bars[0].steps
        assert rows == evaluation.evaluate_hashing(model, data, real_valued=True)  # the same scores without a bar
    bars.clear()
    evaluation.evaluate_fusion(fusion, tiny, protocols=["unimodal"], progress=True)
    assert [bar.total for bar in bars] == [2 * len(tiny.query)] and sum(bars[0].steps) == 2 * len(tiny.query)
