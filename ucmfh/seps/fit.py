"""SEPS training on token features (:func:`fit_seps`).

Training follows the released code (VSE++ hinge with ids as positives, max-violation from the second
epoch, AdamW), keeps the best epoch on a validation part of the training split (rSum of the validation
images against the validation captions) and never looks at the query split.
"""
from __future__ import annotations

import os
from typing import Optional, Tuple, Union

import numpy as np
import torch

from ucmfh.config import SepsConfig
from ucmfh.data.format import DataError, first_of_each_id
from ucmfh.data.h5 import Dataset
from ucmfh.data.tokens import Tokens, check_dense_of_images
from ucmfh.distributed import Group, current_group
from ucmfh.losses.triplet import vse_hinge
from ucmfh.seps.model import SEPS, State
from ucmfh.seps.scoring import Side, evaluate_pairs, image_inputs, text_inputs
from ucmfh.similarity import positive_mask
from ucmfh.selection import History, validation_items
from ucmfh.batches import BatchReads
from ucmfh.amp import autocast
from ucmfh.trainer import Batch, Plan, start, train
from ucmfh.training_state import StateFile
from ucmfh.run_draws import run_under_way
from ucmfh.utils import check_argument, host_index, resolve_device, to_device


def build_model(tokens: Tokens, cfg: SepsConfig) -> SEPS:
    """A SEPS model for the token shapes of ``tokens``; the file's root attribute ``image_tokens_cls``
    says whether image token 0 is a [CLS] token."""
    cls = bool(tokens.attrs.get("image_tokens_cls", False))
    return SEPS(tokens.d_img, tokens.d_txt, tokens.n_image_tokens, cfg, image_cls=cls, dense=tokens.has_dense)


def _check_dense(tokens: Tokens, cfg: SepsConfig) -> None:
    if cfg.dense_text != "none" and not tokens.has_dense:
        raise DataError(f"{tokens.path}: /{tokens.split}: dense_text={cfg.dense_text!r} but the file has no "
                        "dense_text_tokens")
    if cfg.dense_text != "none":
        check_dense_of_images(tokens.path, tokens.attrs, cfg.dense_text)


def check_dense_text(path: str, cfg: SepsConfig) -> None:
    """Say before a run starts, as its fit would once started, that ``cfg.dense_text`` asks for dense text tokens
    the file lacks."""
    if cfg.dense_text == "none":
        return
    tokens = Tokens(path, "train", check_values=False)
    try:
        _check_dense(tokens, cfg)
    finally:
        tokens.close()


def gather_state(group: Group, state: State, n: int) -> State:
    """The state of a global batch of ``n`` items from each rank's part of it (:meth:`Group.local`),
    with gradient, word axes padded to the longest of any rank."""
    if group.world_size == 1:
        return state
    keys = sorted(state)
    padded = [key for key in keys if key.startswith(("words_", "mask_"))]
    widths = dict(zip(padded, group.max([state[key].shape[1] for key in padded], state[keys[0]].device)))
    parts, shapes = [], {}
    for key in keys:
        value = state[key].float()
        if key in widths:
            value = torch.nn.functional.pad(value, (0, 0) * (value.dim() - 2) + (0, widths[key] - value.shape[1]))
        shapes[key] = value.shape[1:]
        parts.append(value.reshape(len(value), -1))
    gathered = group.gather(parts, n)
    return {key: (part.reshape(n, *shapes[key]) > 0.5 if state[key].dtype == torch.bool
                  else part.reshape(n, *shapes[key]).to(state[key].dtype))
            for key, part in zip(keys, gathered)}


def fit_seps(path: Union[str, "os.PathLike[str]", Dataset], cfg: SepsConfig, progress: bool = True,
             state: Optional[StateFile] = None) -> Tuple[SEPS, History]:
    """Train SEPS on the ``train`` split of ``path``, a dataset file with token features (or the
    :class:`Dataset` read from one: SEPS reads its tokens from the file, a batch at a time); returns the model
    (on CPU, the best validation epoch's weights when ``cfg.val_fraction`` > 0) and its :class:`History`.

    Under ``torchrun`` each rank encodes its part of the global batch (its images and its captions);
    the image states are gathered with gradient, each rank scores its captions against every image
    of the batch, and the score rows are gathered with gradient, so the hinge sees the whole batch's
    negatives and one step equals one process's step (docs/distributed.md). The caller's global generators are
    left as they were (:func:`ucmfh.run_draws.run_under_way`)."""
    check_argument("fit_seps", "path", path, (str, os.PathLike, Dataset), "a dataset file's path, with tokens")
    check_argument("fit_seps", "cfg", cfg, SepsConfig, "ucmfh.config.SepsConfig(...)")
    if isinstance(path, Dataset):
        if path.path is None:
            raise ValueError("fit_seps: the Dataset given was made in memory; SEPS reads its tokens from a file: "
                             "give the file's path (ucmfh.write_dataset writes one)")
        path = path.path
    path = os.fspath(path)
    # its start is not one piece under setting_up: runs in threads would interleave it, whatever the block
    with run_under_way(resolve_device(cfg.device), keeps_apart=False):
        return _fit(path, cfg, progress, state)


def _fit(path: str, cfg: SepsConfig, progress: bool, state: Optional[StateFile]) -> Tuple[SEPS, History]:
    device, generator = start(cfg)
    group = current_group()
    tokens = Tokens(path, "train")
    _check_dense(tokens, cfg)
    ids = tokens.ids
    if cfg.val_fraction > 0:
        rest, val = validation_items(ids, cfg.val_fraction, cfg.seed)
    else:
        rest, val = np.arange(tokens.n_items), None
    model = build_model(tokens, cfg).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    def read(index: torch.Tensor) -> Tuple:
        """A batch's items and the token rows of this rank's part of it, on their way to the device."""
        items = rest[host_index(index).numpy()]
        mine = group.local(torch.from_numpy(items)).numpy()  # this rank's part of the global batch
        return (items, to_device(torch.from_numpy(ids[items]), device), image_inputs(model, tokens, mine, device),
                text_inputs(model, tokens, mine, device))

    reads = BatchReads(read)

    def loss(batch: Batch) -> torch.Tensor:
        items, batch_ids, image_in, text_in = reads(batch.index)
        with autocast(device, cfg.amp):  # the forward pass; the gathers and the hinge in float32
            img = gather_state(group, model.encode_images(*image_in), len(items))
            sims, soft_mean = model.grid(img, model.encode_texts(*text_in))  # [my texts, images]
        sims, soft_mean = sims.float(), None if soft_mean is None else soft_mean.float()
        sims = group.gather((sims,), len(items))[0]
        if soft_mean is not None and group.world_size > 1:  # the mean over every pair of the batch
            mean_of_mine = (soft_mean * len(text_in[0])).reshape(1, 1)
            soft_mean = group.gather((mean_of_mine,), group.world_size)[0].sum() / len(items)
        out = vse_hinge(sims.T, positive_mask(len(items), batch_ids, device=device), cfg.margin,
                        batch.epoch >= cfg.max_violation_from)
        if soft_mean is not None and cfg.ratio_weight:
            out = out + cfg.ratio_weight * (soft_mean - cfg.keep_ratio) ** 2
        return out

    val_images = None if val is None else val[first_of_each_id(ids[val])]

    def validate() -> float:
        row = evaluate_pairs(model, Side(tokens, val_images), Side(tokens, val), device, cfg.pair_chunk)
        model.train()
        return row["rsum"]

    plan = Plan("seps", model, {"model": model}, optimizer, len(rest), loss=loss,
                validate=None if val is None else validate, ahead=reads.ahead)
    try:
        history = train(plan, cfg, device, generator, state, progress)
    finally:
        tokens.close()
    return model.cpu().eval(), history
