"""Click commands for data files: ``ucmfh make-synthetic``, ``validate``, ``convert pkl|mat|npz`` and ``extract``.

Thin: each command parses options and calls one library function. The ``ucmfh`` group
(:mod:`ucmfh.app.cli`) imports this module when one of them runs. Bad input ends in one line and exit code 2
(:func:`ucmfh.app.errors.user_errors`).
"""
from __future__ import annotations

import logging
import os
import re
from typing import Dict, Optional, Tuple

import click

from ucmfh.app.errors import user_errors, warn
from ucmfh.app.options import DEVICE_HELP, Count, given_flags, known_device, seed_type
from ucmfh.app.outputs import check_outputs
from ucmfh.config import SettingError
from ucmfh.data.annotations import list_images
from ucmfh.data.convert import CHUNK_ROWS, EMPTY_LABELS, ConvertReport, convert_arrays, convert_pkl, read_classes
from ucmfh.data.extract import BAD_IMAGES, ExtractConfig, extract_features
from ucmfh.data.format import SPLITS, DataError
from ucmfh.data.h5 import images_trained_on, relevance_warnings, validate_file
from ucmfh.data.scratch import RESTART, parse_shard
from ucmfh.data.splits import DEFAULT_SEED, STANDARD_SPLITS, resolve_sizes
from ucmfh.data.synthetic import SyntheticSpec, make_synthetic
from ucmfh.signals import stopped_by


def _split_sizes(standard_split, query, train, retrieval):
    """The split's sizes from the split options, an error naming them where they give none."""
    if standard_split is None and (query is None or train is None):
        raise click.UsageError("give the split: --standard-split NAME, or both --query and --train")
    for flag, size in (("--query", query), ("--train", train), ("--retrieval", retrieval)):
        if size is not None and size <= 0:  # the split's rule says 'query=0'; the flag that gave it
            raise click.BadParameter(f"a split's size must be positive, got {size}", param_hint=flag)
    try:
        return resolve_sizes(standard_split, query, train, retrieval)
    except ValueError as err:
        raise click.UsageError(str(err)) from None


def _sizes_said(err: SettingError, standard_split: Optional[str]) -> Exception:
    """Split sizes refused (``err``), said as the flags that gave them: sizes not typed are --standard-split's."""
    typed = given_flags({setting: f"--{setting}" for setting in err.settings})
    if standard_split is None or len(typed) == len(err.settings):
        return err
    return DataError(f"{err} (the sizes of --standard-split {standard_split}; --query, --train, --retrieval give "
                     "others)")


def _summary(report: ConvertReport) -> None:
    rows = ", ".join(f"{s} {n}" for s, n in report.rows.items())
    dropped = sum(report.dropped.values())
    click.echo(f"wrote {report.path}: {rows}" + (f"; dropped {dropped} rows without a label" if dropped else "")
               + f" ({report.seconds:.1f} s)")


def _common(f):
    options = [
        click.option("--name", help="Dataset name (default: the output file's stem)."),
        click.option("--classes", "classes_file", type=click.Path(exists=True, dir_okay=False),
                     help="Class names, one per line, in label-column order."),
        click.option("--image-feature", help="Describes the image feature (root attribute)."),
        click.option("--text-feature", help="Describes the text feature (root attribute)."),
        click.option("--empty-labels", type=click.Choice(EMPTY_LABELS), default="drop", show_default=True,
                     help="Rows with no label: drop them (count is logged) or fail."),
        click.option("--overwrite", is_flag=True, help="Replace an existing output file."),
        click.option("--quiet", is_flag=True, help="No progress bar."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@click.command("make-synthetic")
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--n-query", default=SyntheticSpec.n_query, show_default=True, help="Query items (the test split).")
@click.option("--n-retrieval", default=SyntheticSpec.n_retrieval, show_default=True,
              help="Retrieval items (the database).")
@click.option("--n-train", default=SyntheticSpec.n_train, show_default=True,
              help="Training items, drawn from the retrieval items.")
@click.option("--n-classes", default=SyntheticSpec.n_classes, show_default=True, help="Classes (multi-label).")
@click.option("--d-img", default=SyntheticSpec.d_img, show_default=True, help="Image feature dimensions.")
@click.option("--d-txt", default=SyntheticSpec.d_txt, show_default=True, help="Text feature dimensions.")
@click.option("--seed", default=SyntheticSpec.seed, show_default=True, type=seed_type,
              help="The data's seed: the same seed and sizes give the same file on every machine.")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@user_errors
def make_synthetic_cmd(out: str, overwrite: bool, **sizes: int) -> None:
    """Write a deterministic synthetic dataset (MIRFlickr-shaped by default) to OUT."""
    check_outputs({"OUT": out}, overwrite=overwrite, new=("OUT",))
    try:
        spec = SyntheticSpec(**sizes)
    except SettingError as err:  # the settings refused, said as the flags that set them
        message = str(err)
        for name in (name for name in err.settings if name in sizes):  # the command's own options only
            message = re.sub(rf"\b{name}\b", "--" + name.replace("_", "-"), message)
        raise click.UsageError(message) from None
    path = make_synthetic(out, spec, overwrite=overwrite)
    click.echo(f"wrote {path}")


@click.command("validate")
@click.argument("path", type=click.Path(dir_okay=False))
@user_errors
def validate_cmd(path: str) -> None:
    """Check a dataset file against the ucmfh HDF5 format, a codes file (ucmfh encode), or a search collection
    (docs/search.md)."""
    try:
        attrs = validate_file(path)
    except ValueError as err:
        if not os.path.isfile(path):  # nothing else to read it as (a pipe waits for ever)
            raise err from None
        described = _as_codes(path) or _as_collection(path)  # a file without /train: codes, or a collection to index
        if described is None:
            raise err from None
        click.echo(described)
        return
    import h5py

    with h5py.File(path, "r") as f:  # the shapes alone: the features were read once, by the check
        rows = {split: f[split]["image"].shape[0] for split in ("train", "query", "retrieval")}
        widths = f["train"]["image"].shape[1], f["train"]["text"].shape[1]
        classes = f["train"]["labels"].shape[1] if "labels" in f["train"] else None
        tokens, wordless = _tokens_of(f)
        relevance = relevance_warnings(f["query"]["labels"], f["retrieval"]["labels"]) if classes is not None else []
    kind = "a caption set (relevance: same id)" if classes is None else f"{classes} classes"
    click.echo(f"{path}: valid ({attrs.get('name', '?')}: d_img {widths[0]}, d_txt {widths[1]}, {kind}; "
               + ", ".join(f"{split} {n}" for split, n in rows.items()) + f"; {tokens})")
    for line in relevance:  # valid, but those queries' scores say nothing of the codes
        warn(f"{path}: {line}")
    seen, n = images_trained_on(path)
    if seen:  # valid (the field's splits hold a few), but said: those image->text queries are not of unseen images
        warn(f"{path}: {seen} of the {n} query rows have the image features of a /train row (the same picture under "
             "another id and text): their image→text queries rank by an image trained on")
    for split, n in wordless.items():  # valid, but SEPS scores such texts by nothing
        warn(f"{path}: /{split}: {n} of {rows[split]} texts have no word tokens" + (" (none has one)" if n ==
                                                                                      rows[split] else ""))


def _tokens_of(f) -> Tuple[str, Dict[str, int]]:
    """What ``validate`` says of a file's token features (SEPS, rerank): their shapes or their absence, and per
    split the texts without a word token."""
    from ucmfh.data.tokens import texts_without_words

    if "image_tokens" not in f["train"] and "text_tokens" not in f["train"]:
        return "no token features", {}
    said = []
    if "image_tokens" in f["train"]:
        said.append("image {} x {}".format(*f["train"]["image_tokens"].shape[1:]))
    if "text_tokens" in f["train"]:
        said.append(f"text {f['train']['text_tokens'].shape[1]}-d word tokens")
    if "dense_text_tokens" in f["train"]:
        said.append(f"dense descriptions {f['train']['dense_text_tokens'].shape[1]}-d")
    wordless = texts_without_words(f.filename)
    return "tokens: " + ", ".join(said), {split: n for split, (n, _) in wordless.items() if n}


def _as_codes(path: str) -> Optional[str]:
    """What ``validate`` says of a codes file (``ucmfh encode``), checked as ``evaluate --codes`` reads it: None when
    the file is not one."""
    import h5py

    from ucmfh.codes import load_codes
    from ucmfh.data.format import CODES_FORMAT

    try:
        with h5py.File(path, "r") as f:
            # a codes file's groups without its format attribute (written by hand): said as evaluate --codes says
            # it, where '/train: missing group' spoke of a dataset
            laid_out = "train" not in f and all(isinstance(f.get(group), h5py.Group) and "img" in f[group] and
                                                "txt" in f[group] for group in ("query", "retrieval"))
            if f.attrs.get("format") != CODES_FORMAT and not laid_out:
                return None
    except OSError:
        return None
    codes = load_codes(path)  # its own problem, said in one line
    rows = ", ".join(f"{group} {codes.packed[(group, 'img')].shape[0]}" for group in ("query", "retrieval"))
    relevance = "a caption set (relevance: same id)" if codes.caption_set else "labelled"
    return (f"{path}: a valid codes file of 'ucmfh encode' (not a training dataset): {codes.n_bits} bits, {relevance}; "
            f"{rows}; 'ucmfh evaluate --codes {path}' scores it")


def _as_collection(path: str) -> Optional[str]:
    """What ``validate`` says of a search collection (no training splits): None when the file is not one."""
    import h5py

    from ucmfh.search.collection import open_collection

    try:
        with h5py.File(path, "r") as f:
            if "train" in f:
                return None  # a dataset: its own error stands
            flat = "image" in f or "text" in f  # features at the root: a collection, whatever else is wrong
    except OSError:
        return None
    try:
        coll = open_collection(path)
    except ValueError:
        if flat:
            raise  # the collection's own problem (rows, shapes, ids), not a dataset's missing /train
        return None
    # every feature finite, every label 0/1 and every string UTF-8, as 'ucmfh index' will want them (a DataError
    # names one)
    for name in ("image", "text", "labels", "text_raw", "paths"):
        for start in range(0, len(coll) if coll.has(name) else 0, 1 << 16):
            coll.read(name, start, min(start + (1 << 16), len(coll)))
    widths = ", ".join(f"{name} {coll.columns[name]}-d" for name in ("image", "text") if coll.has(name))
    extra = [name for name in ("ids", "labels", "text_raw", "paths") if coll.has(name)]
    return (f"{path}: a valid search collection for 'ucmfh index' (not a training dataset: no /train): "
            f"{len(coll)} rows in {', '.join(coll.groups)}; {widths}" + (f"; {', '.join(extra)}" if extra else ""))


class _Lines(logging.Formatter):
    """A log record as every other line of the command says it: a warning ``warning: ...``, news as it is."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {text}"


def _log_lines() -> None:
    """The library's log (conversion, extraction) said on stderr in the command's words ('WARNING x' before)."""
    handler = logging.StreamHandler()
    handler.setFormatter(_Lines("%(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


@click.group()
def convert() -> None:
    """Convert released feature files into the ucmfh HDF5 format."""
    _log_lines()


@convert.command("pkl")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@_common
@user_errors
def convert_pkl_cmd(folder, out, name, classes_file, image_feature, text_feature, empty_labels, overwrite, quiet):
    """UCMFH's FOLDER/{train,query,retrieval}.pkl -> OUT, split as released."""
    check_outputs({"OUT": out}, inputs={"FOLDER": [os.path.join(folder, f"{s}.pkl") for s in SPLITS],
                                        "--classes": classes_file}, overwrite=overwrite, new=("OUT",))
    kwargs = {k: v for k, v in (("image_feature", image_feature), ("text_feature", text_feature)) if v}
    _summary(convert_pkl(folder, out, name=name, classes=read_classes(classes_file) if classes_file else None,
                         empty_labels=empty_labels, overwrite=overwrite, **kwargs))


def _arrays_command(kind: str, help_text: str):
    @click.argument("image", type=click.Path(exists=True, dir_okay=False))
    @click.argument("text", type=click.Path(exists=True, dir_okay=False))
    @click.argument("labels", type=click.Path(dir_okay=False))
    @click.argument("out", type=click.Path(dir_okay=False))
    @click.option("--image-key", help="Variable / array name of the image matrix (default: IAll, image, ... or the only one).")
    @click.option("--text-key", help="Variable / array name of the text matrix (default: YAll, text, ...).")
    @click.option("--labels-key", help="Variable / array name of the label matrix (default: LAll, labels, ...).")
    @click.option("--ids", type=click.Path(exists=True, dir_okay=False),
                  help="Item ids, one a row: rows of one id are one image (its captions), kept in one split, the "
                       "sizes counted in ids. With LABELS 'none': a caption set (relevance: same id).")
    @click.option("--ids-key", help="Variable / array name of the ids (default: ids, id, ...).")
    @click.option("--standard-split", type=click.Choice(sorted(STANDARD_SPLITS)),
                  help="Standard split sizes; --query/--train/--retrieval override them.")
    @click.option("--query", type=int, help="Query items.")
    @click.option("--train", type=int, help="Train items, drawn from retrieval.")
    @click.option("--retrieval", type=int, help="Retrieval items (default: all not in query).")
    @click.option("--split-index", type=click.Path(exists=True, dir_okay=False),
                  help="Use a given split: .npz with query/retrieval/train arrays of source rows, numbered from 0.")
    @click.option("--seed", type=seed_type, default=DEFAULT_SEED, show_default=True, help="Seed of the drawn split.")
    @click.option("--chunk-rows", type=Count(min=1), default=CHUNK_ROWS, show_default=True, help="Rows read per block.")
    @_common
    @user_errors
    def command(image, text, labels, out, image_key, text_key, labels_key, ids, ids_key, standard_split, query, train,
                retrieval, split_index, seed, chunk_rows, name, classes_file, image_feature, text_feature,
                empty_labels, overwrite, quiet):
        if labels == "none":  # a caption set: its ids are its relevance
            if ids is None:
                raise click.UsageError("LABELS 'none' makes a caption set, which needs --ids (rows of one id are one "
                                       "image)")
            labels = None
        elif not os.path.isfile(labels):
            raise click.BadParameter(f"{labels}: no such file ('none' for a caption set, with --ids)",
                                     param_hint="LABELS")
        check_outputs({"OUT": out}, inputs={"IMAGE": image, "TEXT": text, "LABELS": labels, "--ids": ids,
                                            "--split-index": split_index, "--classes": classes_file},
                      overwrite=overwrite, new=("OUT",))
        sizes = None
        if split_index is None:
            sizes = _split_sizes(standard_split, query, train, retrieval)
        else:  # the split is given: a size or a seed of a drawn split would be ignored (--query 0 was, silently)
            drawn = given_flags({"standard_split": "--standard-split", "query": "--query", "train": "--train",
                                 "retrieval": "--retrieval", "seed": "--seed"})
            if drawn:
                raise click.UsageError(f"--split-index gives the split; drop {', '.join(drawn)} (of a drawn split)")
        try:
            report = convert_arrays(
                image, text, labels, out, ids=ids, image_key=image_key, text_key=text_key, labels_key=labels_key,
                ids_key=ids_key, sizes=sizes, split_index=split_index, seed=seed, name=name,
                classes=read_classes(classes_file) if classes_file else None, image_feature=image_feature,
                text_feature=text_feature, empty_labels=empty_labels, chunk_rows=chunk_rows, overwrite=overwrite,
                progress=not quiet,
            )
        except SettingError as err:
            raise _sizes_said(err, standard_split) from None
        _summary(report)

    command.__doc__ = help_text
    return convert.command(kind)(command)


_ARRAYS = ("Each matrix has a row an item: IMAGE [N, d], TEXT [N, d'], LABELS [N, C] of 0/1 (multi-hot; class "
           "indices as numpy.eye(C)[classes]); LABELS 'none' and --ids IDS: a caption set.")
_arrays_command("mat", "Whole-set .mat matrices (DJSRH/UCCH, v5 or v7.3) IMAGE TEXT LABELS -> OUT with a seeded split."
                       "\n\n" + _ARRAYS + " A v7.3 file stores MATLAB's [N, d] as [d, N] in HDF5: it is read back as "
                       "[N, d].")
_arrays_command("npz", "Whole-set .npy/.npz arrays IMAGE TEXT LABELS -> OUT with a seeded split.\n\n" + _ARRAYS)


def _shard(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[Tuple[int, int]]:
    """--shard I/N parsed as it is given, a refusal naming the flag."""
    try:
        return parse_shard(value) if value else None
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


@click.command()
@click.argument("images", type=click.Path(exists=True))
@click.argument("captions", type=click.Path(exists=True, dir_okay=False))
@click.argument("labels", type=click.Path(exists=True, dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--model", default=ExtractConfig.model, show_default=True,
              help="Hugging Face CLIP model name or a local save_pretrained folder.")
@click.option("--batch-size", type=Count(min=1), default=ExtractConfig.batch_size, show_default=True)
@click.option("--chunk-items", type=Count(min=1), default=ExtractConfig.chunk_items, show_default=True,
              help="Items per resumable chunk.")
@click.option("--device", default="auto", show_default=True, callback=known_device, help=DEVICE_HELP)
@click.option("--normalize/--no-normalize", default=ExtractConfig.normalize, show_default=True,
              help="L2-normalise the features.")
@click.option("--bad-images", type=click.Choice(BAD_IMAGES), default=ExtractConfig.bad_images, show_default=True,
              help="Unreadable or truncated image: fail, or skip it and its captions (named in the log).")
@click.option("--workers", type=Count(min=1), default=ExtractConfig.workers, show_default=True, help="Image-decoding threads.")
@click.option("--tokens", is_flag=True,
              help="Also store CLIP's image tokens ([CLS] + patches, once per image) and the captions' word tokens "
                   "(docs/data.md; what SEPS trains on).")
@click.option("--keep-scratch", is_flag=True, help="Keep OUT.parts/ after success.")
@click.option("--restart", is_flag=True, help="Discard finished chunks in OUT.parts/ and start over.")
@click.option("--shard", metavar="I/N", callback=_shard,
              help="Compute only shard I of N (chunks c with c % N == I) into OUT.parts/, then stop; under "
                   "torchrun the ranks are the shards and rank 0 merges.")
@click.option("--merge", is_flag=True, help="Write OUT from the chunks the shards finished; computes none.")
@click.option("--standard-split", type=click.Choice(sorted(STANDARD_SPLITS)), help="Standard split sizes (in images).")
@click.option("--query", type=int, help="Query images.")
@click.option("--train", type=int, help="Train images, drawn from retrieval.")
@click.option("--retrieval", type=int, help="Retrieval images (default: all not in query).")
@click.option("--seed", type=seed_type, default=DEFAULT_SEED, show_default=True, help="Seed of the drawn split.")
@click.option("--first-id", type=click.IntRange(min=0), default=0, show_default=True,
              help="The first image's id (an image's id is its index among the images, a folder's sorted by name "
                   "and a list file's in its order, plus this): a later batch of a collection, numbered after the "
                   "first, is added to the same index.")
@click.option("--name", help="Dataset name (default: the output file's stem).")
@click.option("--classes", "classes_file", type=click.Path(exists=True, dir_okay=False),
              help="Class names, one per line (fixes the label columns; unknown names in LABELS fail).")
@click.option("--empty-labels", type=click.Choice(EMPTY_LABELS), default="drop", show_default=True,
              help="Images with no label: drop them (count is logged) or fail.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output file.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@user_errors
def extract(images, captions, labels, out, model, batch_size, chunk_items, device, normalize, bad_images, workers,
            tokens, keep_scratch, restart, shard, merge, standard_split, query, train, retrieval, seed, first_id, name,
            classes_file, empty_labels, overwrite, quiet):
    """CLIP features of IMAGES (folder or list file) and CAPTIONS (TSV/JSON), LABELS (TSV/JSON) -> OUT.

    Sharded (docs/data.md): run '--shard I/N' for every I (any machines sharing OUT.parts/), then
    '--merge'; or 'torchrun --nproc-per-node N -m ucmfh extract ...'.
    """
    _log_lines()
    try:  # the images themselves are inputs too, whether IMAGES is their folder or a list of them
        image_paths = list_images(images)[1]
    except ValueError:
        image_paths = []  # said by the extraction, in its words
    # a local model's files are inputs too: OUT named as its weights replaced them, with --overwrite
    model_files = [os.path.join(model, name) for name in os.listdir(model)] if os.path.isdir(model) else []
    check_outputs({"OUT": out}, inputs={"CAPTIONS": captions, "LABELS": labels, "--classes": classes_file,
                                        "IMAGES": [*([] if os.path.isdir(images) else [images]), *image_paths],
                                        "--model": model_files},
                  overwrite=overwrite, new=("OUT",))
    if shard is not None and merge:  # a shard that merged would wait for the others' chunks without end
        raise click.UsageError("--shard and --merge go apart: run each --shard I/N (they compute), then --merge "
                               "alone (it writes OUT from their chunks)")
    parts = f"{out}.parts"  # the folder of its chunks: a file there was found once the model had loaded
    if os.path.exists(parts) and not os.path.isdir(parts):
        raise click.BadParameter(f"{parts}: a file is where OUT's folder of chunks goes; move it away",
                                 param_hint="OUT")
    try:
        shard_of = shard
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if shard_of is None and world > 1 and not merge:  # torchrun: ranks are the shards, rank 0 merges
            rank = int(os.environ.get("RANK", "0"))
            shard_of, merge = (rank, world), rank == 0
            from ucmfh.distributed import use_local_gpu  # noqa: PLC0415 - torch only when extracting

            use_local_gpu(int(os.environ.get("LOCAL_RANK", "0")))
        if restart and (shard_of or merge):
            raise ValueError(f"--restart would discard the chunks of every shard; delete {out}.parts/ yourself to "
                             "start the shards over")
        sizes = _split_sizes(standard_split, query, train, retrieval)
        config = ExtractConfig(model=model, batch_size=batch_size, chunk_items=chunk_items, device=device,
                               normalize=normalize, bad_images=bad_images, workers=workers,
                               keep_scratch=keep_scratch, tokens=tokens)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    try:
        report = extract_features(images, captions, labels, out, sizes=sizes, seed=seed, classes=classes_file,
                                  config=config, name=name, empty_labels=empty_labels, restart=restart,
                                  overwrite=overwrite, shard=shard_of, merge=merge, progress=not quiet,
                                  first_id=first_id)
    except SettingError as err:
        raise _sizes_said(err, standard_split) from None
    except DataError as err:
        if getattr(err, "remedy", None) == RESTART and (shard_of or merge):  # --restart is refused for shards
            raise DataError(f"{err}; delete {out}.parts/ yourself to start the shards over") from None
        raise
    except KeyboardInterrupt as err:
        parts = f"{out}.parts"
        kept = os.path.isdir(parts) and any(os.scandir(parts))
        said = str(err) or "interrupted"  # Ctrl-C's says nothing, SIGTERM's 'terminated'
        raise stopped_by(f"{said}: the finished chunks are kept in {parts}; run the same command to continue"
                         if kept else f"{said}: no chunk was finished", getattr(err, "signum", None)) from None
    if report.path is None:
        click.echo(f"shard {shard_of[0]}/{shard_of[1]} done: chunks computed {report.chunks_computed}, reused "
                   f"{report.chunks_reused} ({report.seconds:.1f} s); write {out} with --merge once every shard "
                   f"is done")
        return
    rows = ", ".join(f"{s} {n}" for s, n in report.rows.items())
    copies = f"; {len(report.duplicate_images)} copies of other images, each in the split of the image it copies" \
        if report.duplicate_images else ""
    click.echo(f"wrote {report.path}: {rows} ({report.n_images} images, {report.n_captions} captions; "
               f"{len(report.skipped_images)} unreadable images skipped{copies}; chunks computed "
               f"{report.chunks_computed}, reused {report.chunks_reused}; {report.seconds:.1f} s)")
