"""Feature extraction: inputs checked by name, bad images never become features, resumable, CLIP end to end."""
import dataclasses
import io
import json
import logging
import os
import re
import socket
import sys
import warnings

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

Image = pytest.importorskip("PIL.Image", reason="pillow is not installed (pip install 'ucmfh[extract]')")

from conftest import dead_pid
from test_data_errors import user_error
from ucmfh.app.cli import main
from ucmfh.config import SettingError
from ucmfh.data import DataError, load_dataset
from ucmfh.data.annotations import check_images_there, list_images, read_captions, read_labels
from ucmfh.data.extract import ExtractConfig, extract_features
from ucmfh.data.splits import SplitSizes
from ucmfh.data.h5 import validate_file

CLASSES = ["sky", "sea", "tree"]
SIZES = SplitSizes(query=2, train=3)


def make_images(folder, n=7):
    """Small solid-colour images (PNG and JPEG), each with two captions and a label line."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    names = []
    for i in range(n):
        name = f"img{i}.png" if i % 2 else f"img{i}.jpg"
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        Image.new("RGB", (40, 30 + i), colour).save(folder / name)
        names.append(name)
    return names


def write_inputs(tmp_path, names, bad=()):
    caps = tmp_path / "captions.tsv"
    caps.write_text("".join(f"{n}\ta photo number {i}\n{n}\tpicture {i} of {CLASSES[i % 3]}\n"
                            for i, n in enumerate(names)))
    labels = tmp_path / "labels.tsv"
    labels.write_text("".join(f"{n}\t{CLASSES[i % 3]},{CLASSES[(i + 1) % 3]}\n" for i, n in enumerate(names)))
    return caps, labels


class FakeEncoder:
    """Deterministic features: an image's mean colour and size; a caption's length and checksum."""

    name = "fake"

    def __init__(self, fail_after=None):
        self.calls = {"image": 0, "text": 0}
        self.fail_after = fail_after

    def _tick(self, kind):
        if self.fail_after is not None and sum(self.calls.values()) >= self.fail_after:
            raise KeyboardInterrupt
        self.calls[kind] += 1

    def encode_images(self, images):
        self._tick("image")
        return np.stack([np.r_[np.asarray(im, dtype=np.float32).mean(axis=(0, 1)), im.size] for im in images])

    def encode_texts(self, texts):
        self._tick("text")
        return np.array([[len(t), sum(map(ord, t)) % 97] for t in texts], dtype=np.float32)


def test_captions_and_labels_formats(tmp_path):
    names = ["a.jpg", "b.jpg"]
    (tmp_path / "c.json").write_text(json.dumps({"b.jpg": "one", "a.jpg": ["two", "three"]}))
    captions, image_of = read_captions(tmp_path / "c.json", names)
    assert captions == ["two", "three", "one"] and image_of.tolist() == [0, 0, 1]
    (tmp_path / "r.json").write_text(json.dumps([{"image": "a.jpg", "caption": "x"}, {"image": "b.jpg", "caption": "y"}]))
    assert read_captions(tmp_path / "r.json", names)[0] == ["x", "y"]
    # the field's own files as they come: Flickr8k's token file (a caption's number after '#') and COCO's
    # captions_*.json (records by image id), which were refused as naming no image (an audit's)
    (tmp_path / "token.txt").write_text("a.jpg#0\ttwo\nb.jpg#0\tone\na.jpg#1\tthree\n")
    captions, image_of = read_captions(tmp_path / "token.txt", names)
    assert captions == ["two", "three", "one"] and image_of.tolist() == [0, 0, 1]
    coco = {"info": {}, "images": [{"id": 7, "file_name": "b.jpg"}, {"id": 3, "file_name": "a.jpg"}],
            "annotations": [{"image_id": 3, "id": 1, "caption": "two"}, {"image_id": 7, "id": 2, "caption": "one"},
                            {"image_id": 3, "id": 5, "caption": "three"}]}
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    captions, image_of = read_captions(tmp_path / "coco.json", names)
    assert captions == ["two", "three", "one"] and image_of.tolist() == [0, 0, 1]
    coco["annotations"].append({"image_id": 9, "caption": "lost"})
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    with pytest.raises(DataError, match=r"coco\.json: annotations record 4: expected an image_id of its images"):
        read_captions(tmp_path / "coco.json", names)
    (tmp_path / "l.tsv").write_text("a.jpg\tsea, sky\nb.jpg\ttree\n")
    labels, classes = read_labels(tmp_path / "l.tsv", names)
    assert classes == ["sea", "sky", "tree"] and labels.tolist() == [[1, 1, 0], [0, 0, 1]]
    labels, classes = read_labels(tmp_path / "l.tsv", names, classes=["tree", "sky", "sea", "sand"])
    assert labels.tolist() == [[0, 1, 1, 0], [1, 0, 0, 0]]


def test_input_mismatches_name_file_and_problem(tmp_path):
    names = ["a.jpg", "b.jpg"]
    (tmp_path / "c.tsv").write_text("a.jpg\tone\n")
    with pytest.raises(DataError, match=r"c\.tsv: 1 of 2 images has no caption \(first: 'b\.jpg'\)"):
        read_captions(tmp_path / "c.tsv", names)
    (tmp_path / "c.tsv").write_text("a.jpg\tone\nb.jpg\ttwo\nz.jpg\tthree\n")
    with pytest.raises(DataError, match=r"c\.tsv: 1 caption names an image that is not in the image list "
                                        r"\(first: 'z\.jpg'\)"):
        read_captions(tmp_path / "c.tsv", names)
    (tmp_path / "c.tsv").write_text("a.jpg one\n")
    with pytest.raises(DataError, match=r"c\.tsv: line 1: expected 'image_name<TAB>caption'"):
        read_captions(tmp_path / "c.tsv", names)
    (tmp_path / "l.tsv").write_text("a.jpg\tsea\nb.jpg\tlava\n")
    with pytest.raises(DataError, match=r"l\.tsv: line/record 2: unknown label 'lava' for 'b\.jpg'"):
        read_labels(tmp_path / "l.tsv", names, classes=["sea", "sky"])
    (tmp_path / "l.tsv").write_text("a.jpg\tsea\n")
    with pytest.raises(DataError, match=r"l\.tsv: 1 image has no labels line \(first: 'b\.jpg'\)"):
        read_labels(tmp_path / "l.tsv", names)
    # a line of an image not listed (a header line too) made a class of no image, where its caption is refused; a
    # NUL character failed the extraction at its very end, without naming the file (an audit's)
    (tmp_path / "l.tsv").write_text("file\tlabels\na.jpg\tsea\nb.jpg\tsky\nghost.jpg\tzebra\n")
    with pytest.raises(DataError, match=r"l\.tsv: 2 of its lines name images that are not in the image list \(first: "
                                        r"'file', line/record 1\); images and labels do not match$"):
        read_labels(tmp_path / "l.tsv", names)
    (tmp_path / "l.tsv").write_bytes(b"a.jpg\tsea\nb.jpg\ts\x00ky\n")
    with pytest.raises(DataError, match=r"l\.tsv: line 2: a NUL character, which no text of the features file can "
                                        r"hold \(UTF-16 text\? save the file as UTF-8\)$"):
        read_labels(tmp_path / "l.tsv", names)
    (tmp_path / "c.json").write_text(json.dumps({"a.jpg": "one", "b.jpg": ["two", "t\u0000wo"]}))
    with pytest.raises(DataError, match=r"c\.json: record 2: a NUL character \(\\u0000\) in the caption of 'b\.jpg', "
                                        r"which no text of the features file can hold$"):
        read_captions(tmp_path / "c.json", names)
    # a third column (an index, a score) went into the caption, and a JSON key given twice kept its last value:
    # an image's first captions lost, its labels another line's, without a word
    (tmp_path / "c.tsv").write_text("a.jpg\tone\t\nb.jpg\t7\ttwo\n")  # a trailing tab is no field
    with pytest.raises(DataError, match=r"c\.tsv: line 2: 3 tab-separated fields; expected 'image_name<TAB>"
                                        r"caption', the caption without a tab$"):
        read_captions(tmp_path / "c.tsv", names)
    (tmp_path / "c.json").write_text('{"a.jpg": "first", "b.jpg": "one", "a.jpg": "second"}')
    with pytest.raises(DataError, match=r"c\.json: 'a\.jpg' is a key twice in one JSON object, which keeps only its "
                                        r"last value; give each image once, its captions as a list$"):
        read_captions(tmp_path / "c.json", names)
    (tmp_path / "l.json").write_text('{"a.jpg": ["sky"], "b.jpg": ["sea"], "a.jpg": ["tree"]}')
    with pytest.raises(DataError, match=r"l\.json: 'a\.jpg' is a key twice in one JSON object, which keeps only its "
                                        r"last value; give each image once$"):
        read_labels(tmp_path / "l.json", names)
    (tmp_path / "c.tsv").write_text("a.jpg\tone\t\nb.jpg\ttwo\n")
    assert read_captions(tmp_path / "c.tsv", names)[0] == ["one", "two"]
    (tmp_path / "c.tsv").write_text("a\tone\nb.jpg\ttwo\n")  # a name without an extension: no such hint
    with pytest.raises(DataError, match=r"first: 'a'\); images and captions do not match$"):
        read_captions(tmp_path / "c.tsv", names)
    (tmp_path / "c.tsv").write_text("a.jpg\t\tone\nb.jpg\ttwo \t \n")  # tabs that align, or end a line: no field
    assert read_captions(tmp_path / "c.tsv", names)[0] == ["one", "two"]
    # a photo of a kind not read (.heic) was said as a mismatch alone; one image given as IMAGES was read as a list
    (tmp_path / "c.tsv").write_text("a.jpg\tone\nb.jpg\ttwo\nc.heic\tthree\n")
    with pytest.raises(DataError, match=r"c\.tsv: 1 caption names an image that is not in the image list \(first: "
                                        r"'c\.heic'\); images and captions do not match; 'c\.heic' is not listed as an "
                                        r"image by its extension \(images are \.jpg, .*: convert it to one\)$"):
        read_captions(tmp_path / "c.tsv", names)
    Image.new("RGB", (4, 4)).save(tmp_path / "one.jpg")
    with pytest.raises(DataError, match=r"one\.jpg: an image file; IMAGES is a folder of images or a text file "
                                        r"listing their paths$"):
        list_images(tmp_path / "one.jpg")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty: no image files"):
        list_images(tmp_path / "empty")


def test_a_folder_of_images_that_cannot_be_read_is_said_not_left_out(tmp_path, monkeypatch):
    """os.walk passed over a subfolder it could not read: its images were left out without a word, and the
    captions said 'images and captions do not match'."""
    names = make_images(tmp_path / "imgs", 2)
    (tmp_path / "imgs" / "locked").mkdir()
    scandir = os.scandir

    def refused(path="."):
        if os.fspath(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refused)
    with pytest.raises(DataError, match=r"imgs/locked: cannot read this folder of IMAGES \(Permission denied\)$"):
        list_images(tmp_path / "imgs")
    monkeypatch.undo()
    assert list_images(tmp_path / "imgs")[0] == sorted(names)
    # a linked folder is followed (its images were left out without a word), a link to a folder above it once
    (tmp_path / "more").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "more" / "m.png")
    os.symlink(tmp_path / "more", tmp_path / "imgs" / "linked")
    os.symlink(tmp_path / "imgs", tmp_path / "more" / "up")  # round and round
    assert list_images(tmp_path / "imgs")[0] == sorted([*names, "linked/m.png"])


def test_image_list_file(tmp_path):
    names = make_images(tmp_path / "imgs", 3)
    (tmp_path / "list.txt").write_text("".join(f"imgs/{n}\n" for n in names))
    listed, paths = list_images(tmp_path / "list.txt")
    assert listed == [f"imgs/{n}" for n in names] and all(Image.open(p) for p in paths)
    # paths that are not there were found once the model had loaded, as unreadable images (an audit's)
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "list.txt").write_text("".join(f"imgs/{n}\n" for n in names))  # from the wrong folder
    with pytest.raises(FileNotFoundError, match=r"list\.txt: 3 of its 3 images are not there \(first: "
                                                r"'imgs/img0\.jpg'\); a relative path is read from the list's "
                                                r"folder, .*lists$"):
        check_images_there(tmp_path / "lists" / "list.txt", *list_images(tmp_path / "lists" / "list.txt"))


def test_fake_encoder_end_to_end_and_captions_share_ids(tmp_path):
    names = make_images(tmp_path / "imgs")
    caps, labels = write_inputs(tmp_path, names)
    out = tmp_path / "set.h5"
    report = extract_features(tmp_path / "imgs", caps, labels, out, sizes=SIZES, encoder=FakeEncoder(),
                              config=ExtractConfig(batch_size=2, chunk_items=3, workers=1), progress=False)
    assert report.rows == {"train": 6, "query": 4, "retrieval": 10} and report.n_captions == 14
    ds = load_dataset(out)
    assert ds.attrs["classes"] == sorted(CLASSES) and "seed=2023" in ds.attrs["split"]
    assert not (tmp_path / "set.h5.parts").exists()
    for _, part in ds.splits():
        for i in part.ids.tolist():
            rows = (part.ids == i).nonzero().flatten()
            assert len(rows) == 2  # both captions of the image, with the same image feature
            assert (part.img[rows[0]] == part.img[rows[1]]).all() and (part.txt[rows[0]] != part.txt[rows[1]]).any()
            colour = np.asarray(Image.open(tmp_path / "imgs" / names[i]).convert("RGB"), np.float32).mean(axis=(0, 1))
            np.testing.assert_allclose(part.img[rows[0]][:3].numpy(), colour, rtol=1e-6)


def test_resume_recomputes_only_unfinished_chunks(tmp_path):
    names = make_images(tmp_path / "imgs")
    caps, labels = write_inputs(tmp_path, names)
    cfg = ExtractConfig(batch_size=2, chunk_items=3, workers=1)
    ref = extract_features(tmp_path / "imgs", caps, labels, tmp_path / "ref.h5", sizes=SIZES, encoder=FakeEncoder(),
                           config=cfg, progress=False)
    # 7 images: chunks of 3 = 3 chunks, batches of 2 = 5 calls; 14 captions: 5 chunks, 9 calls.
    # Interrupted in the 2nd batch of the 1st caption chunk: only the image chunks are finished.
    with pytest.raises(KeyboardInterrupt):
        extract_features(tmp_path / "imgs", caps, labels, tmp_path / "set.h5", sizes=SIZES,
                         encoder=FakeEncoder(fail_after=6), config=cfg, progress=False)
    assert not (tmp_path / "set.h5").exists()
    assert sorted(p.name for p in (tmp_path / "set.h5.parts").glob("*.npz")) == [
        "image-000000.npz", "image-000001.npz", "image-000002.npz"]
    again = FakeEncoder()
    report = extract_features(tmp_path / "imgs", caps, labels, tmp_path / "set.h5", sizes=SIZES, encoder=again,
                              config=cfg, progress=False)
    assert again.calls == {"image": 0, "text": 9} and (report.chunks_reused, report.chunks_computed) == (3, 5)
    a, b = load_dataset(ref.path), load_dataset(report.path)
    for (_, pa), (_, pb) in zip(a.splits(), b.splits()):
        assert (pa.img == pb.img).all() and (pa.txt == pb.txt).all() and (pa.ids == pb.ids).all()


def test_scratch_of_other_inputs_is_not_reused(tmp_path, monkeypatch):
    names = make_images(tmp_path / "imgs")
    caps, labels = write_inputs(tmp_path, names)
    cfg = ExtractConfig(chunk_items=4, workers=1, keep_scratch=True)
    monkeypatch.chdir(tmp_path)
    extract_features("imgs", caps, labels, tmp_path / "set.h5", sizes=SIZES, encoder=FakeEncoder(),
                     config=cfg, progress=False)
    # the same folder written otherwise is the same images (it was refused as other inputs; an audit's)
    same = extract_features("./imgs/", caps, labels, tmp_path / "set.h5", sizes=SIZES, encoder=FakeEncoder(),
                            config=cfg, overwrite=True, progress=False)
    assert same.chunks_computed == 0
    caps.write_text(caps.read_text().replace("photo", "drawing"))
    # what differs is named (it was "other inputs, model or settings", whatever it was)
    with pytest.raises(DataError, match=r"set\.h5\.parts: scratch of a different extraction \(it differs from this "
                                        r"one in its captions\)$"):
        extract_features("imgs", caps, labels, tmp_path / "set.h5", sizes=SIZES, encoder=FakeEncoder(),
                         config=cfg, overwrite=True, progress=False)
    with pytest.raises(DataError, match=r"scratch of a different extraction \(it differs from this one in its "
                                        r"chunk size, captions\)$"):
        extract_features("imgs", caps, labels, tmp_path / "set.h5", sizes=SIZES, encoder=FakeEncoder(),
                         config=dataclasses.replace(cfg, chunk_items=5), overwrite=True, progress=False)
    extract_features(tmp_path / "imgs", caps, labels, tmp_path / "set.h5", sizes=SIZES, encoder=FakeEncoder(),
                     config=cfg, overwrite=True, restart=True, progress=False)
    # a scratch folder that is a link (kept on a larger disk): --restart failed in rmtree's words (an audit's)
    os.rename(tmp_path / "set.h5.parts", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", tmp_path / "set.h5.parts")
    with pytest.raises(DataError, match=r"set\.h5\.parts: a link to a folder of chunks; a restart removes the "
                                        r"chunks of a folder, not a link's: delete them yourself to start over$"):
        extract_features(tmp_path / "imgs", caps, labels, tmp_path / "set.h5", sizes=SIZES, encoder=FakeEncoder(),
                         config=cfg, overwrite=True, restart=True, progress=False)


def test_a_scratch_of_no_chunk_says_so_and_an_older_one_is_said_as_before(tmp_path):
    """--restart loses nothing where no chunk was finished (a run stopped as it loaded its model): said."""
    from ucmfh.data.scratch import Scratch

    folder, out = str(tmp_path / "o.h5.parts"), str(tmp_path / "o.h5")
    Scratch(folder, "a", out, parts={"images": "1", "captions": "1"})
    with pytest.raises(DataError, match=r"parts: scratch of a different extraction \(it differs from this one in its "
                                        r"images; it holds no finished chunk\)$"):
        Scratch(folder, "b", out, parts={"images": "2", "captions": "1"})
    (tmp_path / "o.h5.parts" / "image-000000.npz").write_bytes(b"")
    with pytest.raises(DataError, match=r"scratch of a different extraction \(other inputs, model or settings\)$"):
        Scratch(folder, "b", out)  # parts not given (or an older manifest without them): not named


def test_a_chunk_whose_image_changed_since_is_computed_again_and_said(tmp_path, caplog):
    """An image replaced after a run (or while it was interrupted) kept its old feature: its finished chunk was
    reused. Each image chunk keeps its files' sizes and times: a chunk of an image changed since is computed
    again, that image named; the others are reused, and a merge (which reads no image) takes them as they are."""
    names = make_images(tmp_path / "imgs")
    caps, labels = write_inputs(tmp_path, names)
    cfg = ExtractConfig(chunk_items=4, workers=1, keep_scratch=True)  # 7 images: 2 image chunks, 14 captions: 4
    args = (tmp_path / "imgs", caps, labels, tmp_path / "set.h5")
    extract_features(*args, sizes=SIZES, encoder=FakeEncoder(), config=cfg, progress=False)
    same = extract_features(*args, sizes=SIZES, encoder=FakeEncoder(), config=cfg, overwrite=True, progress=False)
    assert same.chunks_computed == 0  # untouched: every chunk reused
    Image.new("RGB", (40, 30), (0, 255, 0)).save(tmp_path / "imgs" / names[5])  # in the second image chunk
    with caplog.at_level("WARNING"):
        again = extract_features(*args, sizes=SIZES, encoder=FakeEncoder(), config=cfg, overwrite=True,
                                 progress=False)
    assert again.chunks_computed == 1 and again.chunks_reused == 5
    assert f"image chunk 1: 1 of its files changed since it was computed (first: {names[5]}); computed again" in \
        caplog.text
    fresh = extract_features(*args[:3], tmp_path / "fresh.h5", sizes=SIZES, encoder=FakeEncoder(),
                             config=ExtractConfig(chunk_items=4, workers=1), progress=False)
    got, want = load_dataset(again.path), load_dataset(fresh.path)
    for split in ("train", "query", "retrieval"):  # the new picture's features, as a run from the start gives
        assert np.array_equal(getattr(got, split).img.numpy(), getattr(want, split).img.numpy())


def test_an_image_is_loaded_as_a_viewer_shows_it(tmp_path):
    """PIL's convert('RGB') alone clipped 16-bit grey at 255 (a ramp became white), kept a phone photo on its side
    (EXIF orientation), showed the colour under a transparent pixel, and read a float image as black and white."""
    from ucmfh.data.clip_encoder import load_image

    ramp = np.tile(np.linspace(0, 65535, 64).astype(np.uint16), (8, 1))
    Image.fromarray(ramp).save(tmp_path / "g16.png")
    Image.fromarray(((ramp.astype(np.int64) * 255 + 32767) // 65535).astype(np.uint8)).save(tmp_path / "g8.png")
    assert Image.open(tmp_path / "g16.png").mode == "I;16"
    assert np.array_equal(np.asarray(load_image(tmp_path / "g16.png")), np.asarray(load_image(tmp_path / "g8.png")))
    sideways = Image.new("RGB", (80, 40))
    exif = sideways.getexif()
    exif[0x0112] = 6  # rotated 90°: shown 40 wide, 80 high
    sideways.save(tmp_path / "phone.jpg", exif=exif)
    assert load_image(tmp_path / "phone.jpg").size == (40, 80)
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., 0], rgba[:2, :, 3] = 255, 255  # red: the top half opaque, the bottom transparent
    Image.fromarray(rgba, "RGBA").save(tmp_path / "t.png")
    shown = np.asarray(load_image(tmp_path / "t.png"))
    assert shown[0, 0].tolist() == [255, 0, 0] and shown[3, 3].tolist() == [255, 255, 255]  # over white, as CLIP's
    # PIL's warning of a 'decompression bomb' named no image, with its own file and line: said of the image
    import PIL.Image

    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as heard:
        warnings.simplefilter("always")
        patch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 300)  # below the ramp's 512
        load_image(tmp_path / "g8.png")
    assert [str(w.message) for w in heard] == [f"{tmp_path / 'g8.png'}: an image of 0.000512 megapixels, which PIL "
                                               "warns of as a possible decompression bomb; read whole"]
    Image.fromarray(np.ones((4, 4), np.float32)).save(tmp_path / "f.tif")
    with pytest.raises(OSError, match=r"f\.tif: a floating-point image \(mode F\), whose values have no range"):
        load_image(tmp_path / "f.tif")
    Image.fromarray(np.full((4, 4), 200, np.int32)).save(tmp_path / "i8.tif")  # 32-bit integers of 8-bit values
    assert np.asarray(load_image(tmp_path / "i8.tif"))[0, 0].tolist() == [200, 200, 200]  # not scaled to 1
    Image.fromarray(np.full((4, 4), 70000, np.int32)).save(tmp_path / "i.tif")
    with pytest.raises(OSError, match=r"i\.tif: a 32-bit integer image \(mode I\) of values beyond 16 bits"):
        load_image(tmp_path / "i.tif")


def break_images(folder, names):
    """One truncated JPEG and one file that is no image at all."""
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buf, "JPEG")
    (folder / names[0]).write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    (folder / names[2]).write_bytes(b"not an image")


def test_bad_images_fail_by_name_or_are_skipped_never_zero(tmp_path, caplog):
    names = make_images(tmp_path / "imgs", 9)
    break_images(tmp_path / "imgs", names)
    caps, labels = write_inputs(tmp_path, names)
    cfg = ExtractConfig(batch_size=4, chunk_items=4, workers=2)
    with pytest.raises(DataError, match=r"img0\.jpg: unreadable image") as info:
        extract_features(tmp_path / "imgs", caps, labels, tmp_path / "set.h5", sizes=SIZES, encoder=FakeEncoder(),
                         config=cfg, progress=False)
    # the setting that would accept it travels beside the message, which names no Python keyword
    assert info.value.remedy[:2] == ("bad_images", "skip") and "bad_images=" not in str(info.value)
    cfg.bad_images = "skip"
    with caplog.at_level(logging.WARNING):
        report = extract_features(tmp_path / "imgs", caps, labels, tmp_path / "set.h5", sizes=SIZES,
                                  encoder=FakeEncoder(), config=cfg, progress=False)
    assert report.skipped_images == ["img0.jpg", "img2.jpg"]
    assert "img0.jpg: unreadable image" in caplog.text and "skipped 2 unreadable images" in caplog.text
    ds = load_dataset(report.path)
    ids = set()
    for _, part in ds.splits():
        ids |= set(part.ids.tolist())
        assert (part.img.abs().sum(dim=1) > 0).all()
    assert ids == set(range(9)) - {0, 2}


def test_empty_split_is_a_clear_error(tmp_path):
    """Refused before any feature is computed (it came after all of them: hours on a large collection)."""
    names = make_images(tmp_path / "imgs", 3)
    caps, labels = write_inputs(tmp_path, names)
    encoder = FakeEncoder()
    with pytest.raises(SettingError, match=r"captions\.tsv: split asks for query 3 of 3 distinct ids: retrieval "
                                         r"would be empty"):
        extract_features(tmp_path / "imgs", caps, labels, tmp_path / "set.h5", sizes=SplitSizes(3, 2),
                         encoder=encoder, config=ExtractConfig(workers=1), progress=False)
    assert encoder.calls == {"image": 0, "text": 0} and not (tmp_path / "set.h5.parts").exists()


# ------------------------------------------------------------------ real CLIP code path, tiny random weights


def _byte_chars():
    """CLIP's byte-to-unicode table: with every byte as a token, any text tokenises without merges."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    others = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + n) for n in range(len(others))]


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    """A randomly initialised 1-layer CLIP saved like a hub model, with an offline byte-level tokenizer."""
    pytest.importorskip("transformers", reason="transformers is not installed (pip install 'ucmfh[extract]')")
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

    folder = tmp_path_factory.mktemp("tiny_clip")
    chars = _byte_chars()
    vocab = {c: i for i, c in enumerate(chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"])}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    eos, bos = vocab["<|endoftext|>"], vocab["<|startoftext|>"]
    config = CLIPConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=32, eos_token_id=eos, bos_token_id=bos,
                         pad_token_id=eos),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=16),
        projection_dim=8,
    )
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(folder, safe_serialization=True)  # the default from transformers 4.35 only
    tokenizer.save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    return str(folder)


def test_chunks_of_a_model_s_other_weights_in_its_folder_are_not_reused(tmp_path, tiny_clip):
    """Weights trained on into the model's folder between an interrupted extraction and its resume: the chunks of
    the old weights and of the new went into one file, without a word (the folder's name alone was checked; an
    audit's)."""
    import shutil

    import torch
    from transformers import CLIPModel

    model = tmp_path / "model"
    shutil.copytree(tiny_clip, model)
    names = make_images(tmp_path / "imgs", 6)
    caps, labels = write_inputs(tmp_path, names)
    cfg = ExtractConfig(model=str(model), batch_size=4, chunk_items=5, device="cpu", workers=1, keep_scratch=True)
    first = extract_features(tmp_path / "imgs", caps, labels, tmp_path / "a.h5", sizes=SIZES, config=cfg,
                             progress=False)
    again = extract_features(tmp_path / "imgs", caps, labels, tmp_path / "a.h5", sizes=SIZES, config=cfg,
                             progress=False, overwrite=True)  # the same files: every chunk reused
    assert first.chunks_computed > 0 and again.chunks_computed == 0
    torch.manual_seed(1)
    CLIPModel(CLIPModel.from_pretrained(model).config).save_pretrained(model, safe_serialization=True)
    with pytest.raises(DataError, match=r"a\.h5\.parts: scratch of other files of the same model \(its weights, "
                                        r"tokenizer or image processor have changed since its chunks were computed\)"):
        extract_features(tmp_path / "imgs", caps, labels, tmp_path / "a.h5", sizes=SIZES, config=cfg,
                         progress=False, overwrite=True)


def test_captions_longer_than_the_model_s_context_are_said_to_be_cut(tmp_path, tiny_clip, caplog):
    """A caption past CLIP's context (77 tokens; the tiny model's 32) was cut to it without a word: its feature is
    of its first words alone (an audit's)."""
    names = make_images(tmp_path / "imgs", 6)
    caps, labels = write_inputs(tmp_path, names)
    long = " ".join(["waves"] * 40)
    caps.write_text(caps.read_text() + f"{names[2]}\t{long}\n")
    cfg = ExtractConfig(model=tiny_clip, batch_size=4, chunk_items=5, device="cpu", workers=1)
    with caplog.at_level("WARNING"):
        extract_features(tmp_path / "imgs", caps, labels, tmp_path / "clip.h5", sizes=SIZES, config=cfg,
                         progress=False)
    assert "1 of the 13 captions are longer than the model's context of 32 tokens, and are cut to it (first: " \
           "'waves waves" in caplog.text


def test_clip_extraction_end_to_end_on_cpu(tmp_path, tiny_clip):
    import torch
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

    names = make_images(tmp_path / "imgs", 6)
    caps, labels = write_inputs(tmp_path, names)
    (tmp_path / "classes.txt").write_text("\n".join(CLASSES))
    cfg = ExtractConfig(model=tiny_clip, batch_size=4, chunk_items=5, device="cpu", workers=1)
    report = extract_features(tmp_path / "imgs", caps, labels, tmp_path / "clip.h5", sizes=SIZES,
                              classes=tmp_path / "classes.txt", config=cfg, progress=False)
    ds = load_dataset(report.path)
    assert ds.d_img == 8 and ds.d_txt == 8 and ds.attrs["classes"] == CLASSES
    assert tiny_clip in ds.attrs["image_feature"] and report.rows == {"train": 6, "query": 4, "retrieval": 8}
    # the stored features are CLIP's own, as computed directly
    model = CLIPModel.from_pretrained(tiny_clip).eval()
    processor, tokenizer = AutoImageProcessor.from_pretrained(tiny_clip), AutoTokenizer.from_pretrained(tiny_clip)
    part = ds.query
    i = int(part.ids[0])
    with torch.no_grad():
        pixels = processor(images=[Image.open(tmp_path / "imgs" / names[i]).convert("RGB")], return_tensors="pt")
        img = model.visual_projection(model.vision_model(pixel_values=pixels["pixel_values"]).pooler_output)
        tokens = tokenizer([f"a photo number {i}"], return_tensors="pt")
        txt = model.text_projection(model.text_model(**tokens).pooler_output)
    torch.testing.assert_close(part.img[0], img[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(part.txt[0], txt[0], rtol=1e-4, atol=1e-5)


def test_each_image_is_made_the_model_s_input_as_it_is_read_with_the_same_features(tmp_path, tiny_clip,
                                                                                    monkeypatch):
    """A batch held its decoded photos until the processor ran on all of them (64 of 24 megapixels: 11 GB), in
    one thread. Each image is now made the model's input as it is read, in the loading threads: the batch holds
    [3, S, S] pixel values, and the features are those of the whole batch processed at once, to the bit."""
    import torch

    from ucmfh.data.clip_encoder import ClipEncoder, load_image

    names = make_images(tmp_path / "imgs", 5)
    encoder = ClipEncoder(tiny_clip, "cpu")
    images = [load_image(tmp_path / "imgs" / name) for name in names]
    prepared = [encoder.prepare_image(image) for image in images]
    assert all(p.shape == (3, 32, 32) for p in prepared)
    assert np.array_equal(encoder.encode_images(prepared), encoder.encode_images(images))
    for a, b in zip(encoder.encode_images_tokens(prepared), encoder.encode_images_tokens(images)):
        assert np.array_equal(a, b)
    batches = []
    encode = ClipEncoder.encode_images
    monkeypatch.setattr(ClipEncoder, "encode_images", lambda self, batch: (batches.append(batch), encode(self, batch))[1])
    caps, labels = write_inputs(tmp_path, names)
    cfg = ExtractConfig(model=tiny_clip, batch_size=2, device="cpu", workers=2)
    report = extract_features(tmp_path / "imgs", caps, labels, tmp_path / "o.h5", sizes=SplitSizes(query=1, train=2),
                              config=cfg, progress=False)
    assert batches and all(isinstance(item, torch.Tensor) for batch in batches for item in batch)
    features = np.concatenate([encode(encoder, images[b:b + 2]) for b in range(0, len(images), 2)])  # its batches
    ds = load_dataset(report.path)
    for part in (ds.query, ds.retrieval):  # each item's image feature as its batch of PIL images gives it
        for row, i in zip(part.img.numpy(), part.ids.numpy()):
            assert np.array_equal(row, features[i])


def test_loading_the_model_prints_no_bar_of_its_own(tiny_clip, capfd):
    """transformers' 'Loading weights' bar stood above a search's results (search --text); its setting is kept."""
    from transformers.utils import logging as hf_logging

    from ucmfh.data.clip_encoder import ClipEncoder

    before = hf_logging.is_progress_bar_enabled()
    ClipEncoder(tiny_clip, device="cpu")
    assert "Loading" not in capfd.readouterr().err and hf_logging.is_progress_bar_enabled() == before


def test_extract_command(tmp_path, tiny_clip):
    from ucmfh.app.data_cli import extract

    names = make_images(tmp_path / "imgs", 5)
    caps, labels = write_inputs(tmp_path, names)
    result = CliRunner().invoke(extract, [str(tmp_path / "imgs"), str(caps), str(labels), str(tmp_path / "c.h5"),
                                          "--model", tiny_clip, "--device", "cpu", "--query", "1", "--train", "2",
                                          "--normalize", "--workers", "1"])
    assert result.exit_code == 0, result.output
    ds = load_dataset(tmp_path / "c.h5")
    import torch

    torch.testing.assert_close(ds.train.img.norm(dim=1), torch.ones(len(ds.train)))


# ------------------------------------------------------------------ bad input through the command


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a network connection fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture
def extract_inputs(tmp_path):
    names = make_images(tmp_path / "imgs", 5)
    caps, labels = write_inputs(tmp_path, names)
    return [tmp_path / "imgs", caps, labels]


def test_extract_scratch_chunks_leave_no_temp_file(tmp_path, extract_inputs, monkeypatch):
    parts = tmp_path / "o.h5.parts"
    parts.mkdir()
    stale = parts / f".image-000000.npz.tmp{dead_pid()}"  # left by a killed run
    stale.write_bytes(b"half a chunk")
    savez, calls = np.savez, []

    def disk_full_on_second_chunk(file, **arrays):
        calls.append(file)
        if len(calls) == 2:
            with open(file, "wb") if isinstance(file, (str, os.PathLike)) else file as f:
                f.write(b"half a chunk")
            raise OSError(28, "No space left on device")
        return savez(file, **arrays)

    monkeypatch.setattr(np, "savez", disk_full_on_second_chunk)
    with pytest.raises(OSError, match="No space left"):
        extract_features(*extract_inputs, tmp_path / "o.h5", sizes=SplitSizes(query=1, train=2), encoder=FakeEncoder(),
                         config=ExtractConfig(chunk_items=2, workers=1), progress=False)
    assert sorted(p.name for p in parts.iterdir()) == ["image-000000.npz", "manifest.json"]


def test_a_file_where_the_chunks_go_is_refused_before_the_model_loads(tmp_path, extract_inputs, monkeypatch):
    """OUT.parts a file: found once the model had loaded (seconds), where every output is checked first."""
    import ucmfh.app.data_cli as data_cli

    (tmp_path / "o.h5.parts").write_text("mine")
    monkeypatch.setattr(data_cli, "extract_features", lambda *a, **kw: pytest.fail("the extraction started"))
    user_error(["extract", *extract_inputs, tmp_path / "o.h5", "--query", "1", "--train", "2"],
               "Invalid value for OUT: ", "o.h5.parts: a file is where OUT's folder of chunks goes; move it away")
    assert (tmp_path / "o.h5.parts").read_text() == "mine"


def test_extract_missing_model_never_downloads(tmp_path, extract_inputs, no_network):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install 'ucmfh[extract]')")
    out = tmp_path / "o.h5"
    user_error(["extract", *extract_inputs, out, "--model", tmp_path / "no" / "model", "--query", "1", "--train", "2"],
               f"{tmp_path / 'no' / 'model'}: no such local model folder")
    user_error(["extract", *extract_inputs, out, "--model", "./clip-folder", "--query", "1", "--train", "2"],
               "./clip-folder: no such local model folder")
    user_error(["extract", *extract_inputs, out, "--model", "", "--query", "1", "--train", "2"],  # was 'Error: : no'
               "an empty model name; give a local model folder or a model in the Hugging Face cache")
    message = user_error(["extract", *extract_inputs, out, "--model", "someone/clip-not-cached", "--query", "1",
                          "--train", "2"], "someone/clip-not-cached: not found locally",
                         "not in the local Hugging Face cache", "does not download")
    assert "huggingface.co" not in message
    user_error(["extract", *extract_inputs, out, "--model", extract_inputs[1], "--query", "1", "--train", "2"],
               "captions.tsv: not a model folder (it is a file)")


def test_extract_bad_inputs(tmp_path, extract_inputs, tiny_clip):
    imgs, caps, labels = extract_inputs
    out = tmp_path / "o.h5"
    (tmp_path / "cp1252.tsv").write_bytes(caps.read_bytes().replace(b"photo", "caf\u00e9".encode("cp1252")))
    user_error(["extract", imgs, tmp_path / "cp1252.tsv", labels, out, "--query", "1", "--train", "2"],
               "cp1252.tsv: line 1: not UTF-8 text (byte 0xe9); save the file as UTF-8")
    (tmp_path / "other.tsv").write_text(caps.read_text() + "zzz.jpg\ta caption of no listed image\n")
    user_error(["extract", imgs, tmp_path / "other.tsv", labels, out, "--query", "1", "--train", "2"],
               "other.tsv: 1 caption names an image that is not in the image list (first: 'zzz.jpg')")
    (tmp_path / "c.json").write_text('{"img0.jpg": "one"')
    user_error(["extract", imgs, tmp_path / "c.json", labels, out, "--query", "1", "--train", "2"],
               "c.json: not valid JSON")
    (tmp_path / "empty.txt").write_text("")
    user_error(["extract", tmp_path / "empty.txt", caps, labels, out, "--query", "1", "--train", "2"],
               "empty.txt: empty image list")
    user_error(["extract", imgs, caps, labels, out, "--query", "1", "--train", "2", "--device", "nonsense"],
               "device 'nonsense'")
    user_error(["extract", imgs, caps, labels, out, "--query", "1"],  # no split: said by its flags
               "give the split: --standard-split NAME, or both --query and --train")
    (tmp_path / "o.h5.parts").write_text("a file where the scratch folder goes")
    user_error(["extract", imgs, caps, labels, out, "--query", "1", "--train", "2", "--device", "cpu",
                "--model", tiny_clip], "o.h5.parts: a file is where OUT's folder of chunks goes")


def test_a_missing_extra_is_named_not_the_model_folder(tmp_path, extract_inputs, tiny_clip, monkeypatch):
    """transformers without pillow: its image processor's ImportError (a paragraph) was said of the model folder
    ("not a complete CLIP model"), a text search's too (an audit of installs without extras)."""
    imgs, caps, labels = extract_inputs
    for module, package in (("PIL", "pillow"), ("transformers", "transformers")):
        with monkeypatch.context() as patched:
            patched.setitem(sys.modules, module, None)  # as if not installed: importing it raises ImportError
            message = user_error(["extract", imgs, caps, labels, tmp_path / "o.h5", "--query", "1", "--train", "2",
                                  "--device", "cpu", "--model", tiny_clip], f"feature extraction needs {package}: ")
        assert message.endswith("pip install 'ucmfh[extract]'") and tiny_clip not in message
    assert not (tmp_path / "o.h5").exists()


def test_extract_remedies_worded_as_options(tmp_path, extract_inputs, tiny_clip):
    imgs, caps, labels = extract_inputs
    out = tmp_path / "o.h5"
    args = ["extract", imgs, caps, labels, out, "--model", tiny_clip, "--device", "cpu", "--workers", "1",
            "--query", "1", "--train", "2"]
    assert CliRunner().invoke(main, [str(a) for a in args + ["--keep-scratch"]]).exit_code == 0
    caps.write_text(caps.read_text().replace("photo", "drawing"))
    message = user_error(args + ["--overwrite"], "o.h5.parts: scratch of a different extraction",
                         "; use --restart to discard it and start over")
    assert "restart=True" not in message
    break_images(imgs, sorted(p.name for p in imgs.iterdir()))
    message = user_error(args + ["--overwrite", "--restart"], "unreadable image",
                         "; use --bad-images skip to leave such images out")
    assert "bad_images=" not in message


def test_an_image_without_a_label_is_named_by_its_file():
    """extract --empty-labels fail named a row number of the label matrix, which the user never saw."""
    from ucmfh.data.convert import empty_label_rows

    labels = np.array([[1, 0], [0, 0], [0, 0]], dtype=np.uint8)
    with pytest.raises(DataError, match=r"^l\.tsv: 2 images have no label \(first: image b\.jpg\)$"):
        empty_label_rows(labels, "l.tsv", "fail", ["a.jpg", "b.jpg", "c.jpg"])
    with pytest.raises(DataError, match=r"^y\.npy: 2 rows have no label \(first: row 1\)$"):  # convert's arrays: rows
        empty_label_rows(labels, "y.npy", "fail")


def test_extraction_keeps_captions_and_image_files_and_numbers_ids_from_first_id(tmp_path):
    """Search results show an item's caption and image file: a file extracted without --tokens held neither,
    so hits were bare ids. Each split now holds text_raw and paths (relative to the file's folder: the two move
    together), and --first-id numbers a later batch after the first, so both go into one index."""
    names = make_images(tmp_path / "imgs")
    caps, labels = write_inputs(tmp_path, names)
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "set.h5"
    extract_features(tmp_path / "imgs", caps, labels, out, sizes=SIZES, encoder=FakeEncoder(), first_id=100,
                     config=ExtractConfig(batch_size=2, chunk_items=3, workers=1), progress=False)
    captions = [line.split("\t")[1] for line in caps.read_text().splitlines()]
    with h5py.File(out, "r") as f:
        for split in ("train", "query", "retrieval"):
            ids = f[split]["ids"][...]
            assert ids.min() >= 100
            paths = [p.decode() for p in f[split]["paths"][...]]
            texts = [t.decode() for t in f[split]["text_raw"][...]]
            assert paths == [f"../imgs/{names[i - 100]}" for i in ids]
            for i, text in zip(ids, texts):  # each row's caption is one of its image's two
                assert text in captions[2 * (i - 100): 2 * (i - 100) + 2]
    validate_file(out)  # a broken file raises


def test_copies_of_one_picture_are_drawn_into_one_split(tmp_path):
    """Two files of one picture, captioned alike: drawn apart, a query item equal to a training item, which
    validate refuses (and extract refused its own file, by the seed's luck). Images of equal features are
    drawn together and count once in the sizes."""
    names = make_images(tmp_path / "imgs", 8)
    import shutil

    shutil.copy(tmp_path / "imgs" / names[0], tmp_path / "imgs" / "zcopy.jpg")
    names = sorted([*names, "zcopy.jpg"])
    caps = tmp_path / "captions.tsv"
    caps.write_text("".join(f"{n}\ta photo\n" if n in ("img0.jpg", "zcopy.jpg") else f"{n}\tpicture {n}\n"
                            for n in names))
    labels = tmp_path / "labels.tsv"
    labels.write_text("".join(f"{n}\tsky\n" for n in names))
    copy, first = names.index("zcopy.jpg"), names.index("img0.jpg")
    for seed in range(12):
        out = tmp_path / f"set{seed}.h5"
        report = extract_features(tmp_path / "imgs", caps, labels, out, sizes=SplitSizes(query=3, train=4),
                                  seed=seed, encoder=FakeEncoder(), config=ExtractConfig(workers=1), progress=False)
        assert report.duplicate_images == [("zcopy.jpg", "img0.jpg")]
        with h5py.File(out, "r") as f:
            where = {split: set(f[split]["ids"][...].tolist()) for split in ("query", "retrieval")}
            query_images = len(where["query"])
        assert (first in where["query"]) == (copy in where["query"])  # together
        assert query_images == 3 + (first in where["query"])  # the copy counts once in the sizes
        validate_file(out)  # a broken file raises


def test_a_first_id_whose_ids_would_not_fit_int64_is_refused_before_any_work(tmp_path):
    names = make_images(tmp_path / "imgs", 3)
    caps, labels = write_inputs(tmp_path, names)
    encoder = FakeEncoder()
    with pytest.raises(ValueError, match=r"the first id, 9223372036854775806: the ids of 3 images from it would not "
                                         r"fit"):
        extract_features(tmp_path / "imgs", caps, labels, tmp_path / "o.h5", sizes=SplitSizes(query=1, train=1),
                         encoder=encoder, first_id=2**63 - 2, progress=False)
    assert encoder.calls == {"image": 0, "text": 0}


def test_a_model_folder_of_another_kind_damaged_or_mismatched_is_refused_in_one_line(tmp_path, tiny_clip):
    """A folder of another model with CLIP's tokenizer and processor became a CLIP of random weights (a report of
    78 lines, then features written, exit 0); a damaged weights file was a traceback (safetensors' own error);
    a processor of other images than the model's failed in the first batch without naming the model."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel, CLIPImageProcessor

    from ucmfh.data.clip_encoder import ClipEncoder

    other = tmp_path / "bert"
    shutil.copytree(tiny_clip, other)
    for name in ("config.json", "model.safetensors"):
        (other / name).unlink()
    BertModel(BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)) \
        .save_pretrained(other, safe_serialization=True)
    with pytest.raises(DataError, match=rf"^{re.escape(str(other))}: a model of type 'bert', not CLIP$"):
        ClipEncoder(str(other), device="cpu")
    weightless = tmp_path / "weightless"
    shutil.copytree(tiny_clip, weightless)
    (weightless / "model.safetensors").unlink()
    from safetensors.torch import save_file  # a CLIP's file holding one weight of its many
    save_file({"logit_scale": torch.zeros(())}, str(weightless / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(DataError, match=r"weightless: \d+ of the CLIP model's weights are not in the folder \(first: "
                                        r".*\): they would be random$"):
        ClipEncoder(str(weightless), device="cpu")
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_clip, damaged)
    (damaged / "model.safetensors").write_bytes((damaged / "model.safetensors").read_bytes()[:1000])
    with pytest.raises(DataError, match=r"damaged: not a complete CLIP model \(model, tokenizer and image processor\): "
                                        r"SafetensorError: "):
        ClipEncoder(str(damaged), device="cpu")
    larger = tmp_path / "larger"
    shutil.copytree(tiny_clip, larger)
    CLIPImageProcessor(size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64}).save_pretrained(larger)
    with pytest.raises(DataError, match=r"larger: its image processor makes images of 64 pixels, its model takes 32$"):
        ClipEncoder(str(larger), device="cpu")
    # a folder without its tokenizer's files: every caption was the same unknown tokens, its features one row
    untokened = tmp_path / "untokened"
    shutil.copytree(tiny_clip, untokened)
    for name in os.listdir(untokened):
        if name in ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            (untokened / name).unlink()
    with pytest.raises(DataError, match=r"untokened: its tokenizer knows \d+ tokens, its model \d+: the tokenizer's "
                                        r"files \(tokenizer.json, or vocab.json and merges.txt\) are missing"):
        ClipEncoder(str(untokened), device="cpu")
