"""`ucmfh extract --tokens`: CLIP image and word tokens in the layout of reference §9, on a tiny random CLIP."""
import h5py
import numpy as np
import pytest
from click.testing import CliRunner

Image = pytest.importorskip("PIL.Image", reason="pillow is not installed (pip install 'ucmfh[extract]')")
torch = pytest.importorskip("torch")

from test_data_errors import user_error
from test_extract import SIZES, break_images, make_images, tiny_clip, write_inputs  # noqa: F401 - a fixture
from test_extract_shards import assert_same_file
from ucmfh.app.cli import main
from ucmfh.data import DataError, load_dataset
from ucmfh.data.clip_encoder import ClipEncoder
from ucmfh.data.extract import ExtractConfig, _gather_rows, extract_features
from ucmfh.data.tokens import Tokens

# 7 images in chunks of 3: 3 image chunks; 14 captions: 5 text chunks; batches of 2
N_IMAGES = 7


def config(tiny_clip, **kwargs):
    return ExtractConfig(**{"model": tiny_clip, "batch_size": 2, "chunk_items": 3, "device": "cpu", "workers": 1,
                            "tokens": True, **kwargs})


class Interrupted(ClipEncoder):
    """The real encoder, stopped like Ctrl-C at its ``fail_at``-th model call (1-based)."""

    def __init__(self, model, fail_at=None):
        super().__init__(model, "cpu")
        self.fail_at, self.calls = fail_at, {"image": 0, "text": 0}

    def _tick(self, kind):
        if self.fail_at is not None and sum(self.calls.values()) + 1 >= self.fail_at:
            raise KeyboardInterrupt
        self.calls[kind] += 1

    def encode_images_tokens(self, images):
        self._tick("image")
        return super().encode_images_tokens(images)

    def encode_texts_tokens(self, texts):
        self._tick("text")
        return super().encode_texts_tokens(texts)


@pytest.fixture
def inputs(tmp_path):
    names = make_images(tmp_path / "imgs", N_IMAGES)
    caps, labels = write_inputs(tmp_path, names)
    return tmp_path / "imgs", caps, labels


@pytest.fixture
def clip(tiny_clip):
    """The tiny CLIP loaded directly, with its tokenizer and image processor: the reference forward."""
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

    return (CLIPModel.from_pretrained(tiny_clip).eval(), AutoTokenizer.from_pretrained(tiny_clip),
            AutoImageProcessor.from_pretrained(tiny_clip))


def extract(inputs, out, tiny_clip, **kwargs):
    cfg = kwargs.pop("config", None) or config(tiny_clip)
    return extract_features(*inputs, out, sizes=SIZES, config=cfg, progress=False, **kwargs)


def test_layout_dtypes_and_attributes(tmp_path, inputs, tiny_clip):
    report = extract(inputs, tmp_path / "tok.h5", tiny_clip)
    ds = load_dataset(report.path)  # validated: check_tokens on every split
    names = sorted(p.name for p in inputs[0].iterdir())
    captions = [line.split("\t")[1] for line in inputs[1].read_text().splitlines()]
    with h5py.File(report.path, "r") as f:
        assert f.attrs["image_tokens_cls"] == True  # noqa: E712 - a numpy bool
        for key in ("image_tokens", "text_tokens"):
            assert tiny_clip in f.attrs[key] and "float16" in f.attrs[key] and "NOT normalised" in f.attrs[key]
        assert "[N,5,16]" in f.attrs["image_tokens"] and "post_layernorm" in f.attrs["image_tokens"]
        assert "tokens_build" in f.attrs
        for split, part in ds.splits():
            g = f[split]
            n = len(part)
            ids = g["ids"][()]
            images = np.unique(ids)
            # image tokens: once per image, read through a virtual dataset over this file
            store, row, virtual = g["image_tokens_per_image"], g["image_row"], g["image_tokens"]
            assert store.shape == (len(images), 5, 16) and store.dtype == np.float16
            assert store.chunks == (1, 5, 16) and store.compression == "gzip" and store.compression_opts == 4
            assert row.dtype == np.int64 and row.shape == (n,)
            assert virtual.is_virtual and virtual.shape == (n, 5, 16) and virtual.dtype == np.float16
            assert {s.file_name for s in virtual.virtual_sources()} == {"."}
            assert {s.dset_name for s in virtual.virtual_sources()} == {f"/{split}/image_tokens_per_image"}
            np.testing.assert_array_equal(virtual[()], store[()][row[()]])
            picked = np.array([0, n - 1])
            np.testing.assert_array_equal(virtual[picked], store[()][row[()][picked]])
            files = g["image_files"].asstr()[()]
            assert list(files) == [names[i] for i in images]
            assert all(files[row[i]] == names[ids[i]] for i in range(n))  # item i reads its own image
            # word tokens: CSR
            text, offsets = g["text_tokens"], g["text_offsets"][()]
            assert text.dtype == np.float16 and text.chunks == (min(1024, text.shape[0]), 16)
            assert text.compression == "gzip" and offsets.dtype == np.int64 and offsets.shape == (n + 1,)
            assert offsets[0] == 0 and offsets[-1] == text.shape[0] and (np.diff(offsets) > 0).all()
            assert g["text_words"].shape == (text.shape[0],)
            raw = g["text_raw"].asstr()[()]
            assert list(raw) == [captions[2 * i + k] for i, k in zip(ids, _rank_within_id(ids))]
    with Tokens(report.path, "query") as tok:
        assert tok.n_image_tokens == 5 and tok.d_img == 16 and tok.d_txt == 16 and tok.attrs["image_tokens_cls"]
        words, mask = tok.texts(np.arange(tok.n_items))
        np.testing.assert_array_equal(mask.sum(dim=1).numpy(), tok.text_lengths())
        assert tok.images(np.arange(tok.n_items)).shape == (tok.n_items, 5, 16)


def _rank_within_id(ids):
    """0 for an id's first item, 1 for its second... (items of one id are adjacent)."""
    return np.arange(len(ids)) - np.searchsorted(ids, ids)


def test_tokens_equal_a_direct_forward(tmp_path, inputs, tiny_clip, clip):
    model, tokenizer, processor = clip
    report = extract(inputs, tmp_path / "tok.h5", tiny_clip, config=config(tiny_clip, chunk_items=4))
    names = sorted(p.name for p in inputs[0].iterdir())
    with h5py.File(report.path, "r") as f:
        for split in ("query", "retrieval"):
            g = f[split]
            ids, offsets = g["ids"][()], g["text_offsets"][()]
            raw, words = g["text_raw"].asstr()[()], g["text_words"].asstr()[()]
            for i in range(len(ids)):
                # each caption alone, unpadded: what the batched, padded extraction must equal
                enc = tokenizer([raw[i]], return_tensors="pt")
                with torch.no_grad():
                    hidden = model.text_model(**enc).last_hidden_state[0, 1:-1]
                rows = slice(offsets[i], offsets[i + 1])
                np.testing.assert_allclose(g["text_tokens"][rows].astype(np.float32), hidden.numpy(),
                                           rtol=2e-3, atol=2e-3)
                assert list(words[rows]) == tokenizer.convert_ids_to_tokens(enc["input_ids"][0, 1:-1].tolist())
            i = 0
            pixels = processor(images=[Image.open(inputs[0] / names[ids[i]]).convert("RGB")], return_tensors="pt")
            with torch.no_grad():
                vision = model.vision_model(pixel_values=pixels["pixel_values"])
                tokens = model.vision_model.post_layernorm(vision.last_hidden_state)[0]
                pooled = model.visual_projection(vision.pooler_output)[0]
            stored = g["image_tokens"][i].astype(np.float32)
            np.testing.assert_allclose(stored, tokens.numpy(), rtol=2e-3, atol=2e-3)
            # token 0 is [CLS]: projected, it is the pooled image feature
            projected = model.visual_projection(torch.from_numpy(stored[0])).detach().numpy()
            np.testing.assert_allclose(projected, g["image"][i], rtol=1e-2, atol=1e-2)
            np.testing.assert_allclose(g["image"][i], pooled.numpy(), rtol=1e-4, atol=1e-5)


def test_pooled_features_unchanged_by_tokens(tmp_path, inputs, tiny_clip):
    plain = extract(inputs, tmp_path / "plain.h5", tiny_clip, config=config(tiny_clip, tokens=False))
    tokens = extract(inputs, tmp_path / "tok.h5", tiny_clip)
    with h5py.File(plain.path, "r") as a, h5py.File(tokens.path, "r") as b:
        assert "image_tokens" not in a["train"] and "image_tokens" not in a.attrs
        for split in ("train", "query", "retrieval"):
            assert set(a[split]) < set(b[split])
            for name in a[split]:
                np.testing.assert_array_equal(a[split][name][()], b[split][name][()], err_msg=f"{split}/{name}")
        for key in a.attrs:
            if key != "name":
                np.testing.assert_array_equal(a.attrs[key], b.attrs[key])


def test_csr_row_gather():
    offsets = np.array([0, 2, 2, 5, 6])
    for items in ([0, 2], [1], [3, 0, 2], []):
        expected = [r for i in items for r in range(offsets[i], offsets[i + 1])]
        assert _gather_rows(offsets, np.array(items, dtype=np.int64)).tolist() == expected


def test_interrupted_run_resumes_from_token_chunks(tmp_path, inputs, tiny_clip):
    ref = extract(inputs, tmp_path / "ref" / "tok.h5", tiny_clip)
    out, parts = tmp_path / "tok.h5", tmp_path / "tok.h5.parts"
    # 7 images: chunks of 3 with batches of 2 = calls 1-2, 3-4, 5; the 6th call (1st text batch) stops it
    with pytest.raises(KeyboardInterrupt):
        extract(inputs, out, tiny_clip, encoder=Interrupted(tiny_clip, fail_at=6))
    assert not out.exists()
    assert sorted(p.name for p in parts.glob("*.npz")) == [f"image-00000{c}.npz" for c in range(3)]
    with np.load(parts / "image-000000.npz") as chunk:
        assert chunk["tokens_image"].shape == (3, 5, 16) and chunk["tokens_image"].dtype == np.float16
    again = Interrupted(tiny_clip)
    report = extract(inputs, out, tiny_clip, encoder=again)
    assert again.calls == {"image": 0, "text": 9} and (report.chunks_reused, report.chunks_computed) == (3, 5)
    assert_same_file(ref.path, report.path)


def test_pooled_scratch_is_refused_by_a_token_run(tmp_path, inputs, tiny_clip):
    args = ["extract", *inputs, tmp_path / "o.h5", "--model", tiny_clip, "--device", "cpu", "--workers", "1",
            "--query", "2", "--train", "3", "--chunk-items", "3", "--batch-size", "2", "--keep-scratch"]
    assert CliRunner().invoke(main, [str(a) for a in args]).exit_code == 0
    (tmp_path / "o.h5").unlink()
    user_error(args + ["--tokens"], "o.h5.parts: scratch of a different extraction",
               "; use --restart to discard it and start over")
    assert not (tmp_path / "o.h5").exists()
    result = CliRunner().invoke(main, [str(a) for a in args + ["--tokens", "--restart"]])
    assert result.exit_code == 0, result.output
    assert "chunks computed 8, reused 0" in result.output
    assert_same_file(extract(inputs, tmp_path / "ref" / "o.h5", tiny_clip).path, tmp_path / "o.h5")


def test_a_chunk_without_tokens_is_one_line(tmp_path, inputs, tiny_clip):
    cfg = config(tiny_clip, keep_scratch=True)
    extract(inputs, tmp_path / "o.h5", tiny_clip, config=cfg)
    chunk = tmp_path / "o.h5.parts" / "text-000001.npz"
    with np.load(chunk) as old:
        kept = {k: old[k] for k in old.files if k != "tokens_words"}
    with open(chunk, "wb") as f:
        np.savez(f, **kept)
    with pytest.raises(DataError, match=r"text-000001\.npz: no tokens_words member .*damaged scratch chunk"):
        extract(inputs, tmp_path / "o.h5", tiny_clip, config=cfg, overwrite=True)


def test_skipped_images_leave_no_token_rows(tmp_path, tiny_clip):
    names = make_images(tmp_path / "imgs", 9)
    break_images(tmp_path / "imgs", names)  # img0 and img2: one in the first chunk of 3, one in its last row
    caps, labels = write_inputs(tmp_path, names)
    report = extract((tmp_path / "imgs", caps, labels), tmp_path / "o.h5", tiny_clip,
                     config=config(tiny_clip, bad_images="skip"))
    assert report.skipped_images == ["img0.jpg", "img2.jpg"]
    load_dataset(report.path)  # finite tokens everywhere (validated)
    with h5py.File(report.path, "r") as f:
        files = {n for s in ("query", "retrieval") for n in f[s]["image_files"].asstr()[()]}
    assert files == set(names) - {"img0.jpg", "img2.jpg"}


def test_command_tokens_then_train_seps(tmp_path, tiny_clip):
    names = make_images(tmp_path / "imgs", 12)
    caps, labels = write_inputs(tmp_path, names)
    runner = CliRunner()
    result = runner.invoke(main, ["extract", str(tmp_path / "imgs"), str(caps), str(labels),
                                  str(tmp_path / "data" / "tiny.h5"), "--model", tiny_clip, "--device", "cpu",
                                  "--workers", "1", "--query", "3", "--train", "6", "--tokens"])
    assert result.exit_code == 0, result.output
    info = runner.invoke(main, ["validate", str(tmp_path / "data" / "tiny.h5")])
    assert info.exit_code == 0, info.output
    with Tokens(tmp_path / "data" / "tiny.h5", "train") as tok:
        assert tok.n_items == 12 and tok.n_images == 6
    out = runner.invoke(main, ["train-seps", "-d", "tiny", "--data-dir", str(tmp_path / "data"), "--quiet",
                               "--device", "cpu", "--out", str(tmp_path / "runs"), "--epochs", "1",
                               "--results", str(tmp_path / "r.jsonl"),
                               "--batch-size", "4", "--val-fraction", "0", "--patience", "0", "--set", "embed_dim=8"])
    assert out.exit_code == 0, out.output
    assert "seps-full" in out.output
    checkpoint = torch.load(next((tmp_path / "runs").rglob("seps.pt")), weights_only=False)
    assert checkpoint["image_cls"] is True and checkpoint["n_image_tokens"] == 5


def test_shards_with_tokens_merge_into_the_unsharded_file(tmp_path, inputs, tiny_clip):
    ref = extract(inputs, tmp_path / "ref" / "tok.h5", tiny_clip)
    out = tmp_path / "tok.h5"
    for shard in ((0, 2), (1, 2)):
        assert extract(inputs, out, tiny_clip, shard=shard).path is None
    merged = extract(inputs, out, tiny_clip, merge=True)
    assert merged.chunks_computed == 0
    assert_same_file(ref.path, merged.path)


def test_virtual_tokens_read_in_reopened_blocks(tmp_path, inputs, tiny_clip, monkeypatch):
    """Validation and the in-memory reader reopen a virtual dataset every few items (bounded HDF5 handles):
    the values are those of one read."""
    import ucmfh.data.tokens as tokens_module

    report = extract(inputs, tmp_path / "tok.h5", tiny_clip)
    with Tokens(report.path, "retrieval") as tok:
        whole = tok.images(np.arange(tok.n_items))
    monkeypatch.setattr(tokens_module, "_REOPEN_ITEMS", 2)
    load_dataset(report.path)
    with Tokens(report.path, "retrieval") as tok:
        assert tok.in_memory and tok.n_images > 2
        torch.testing.assert_close(tok.images(np.arange(tok.n_items)), whole, rtol=0, atol=0)
