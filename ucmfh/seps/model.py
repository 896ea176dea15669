"""SEPS: patch selection, aggregation and fine-grained alignment of image and word tokens.

docs/reference.md §8 is the contract; docs/seps.md says how this module departs from the released
code. The model scores image–text *pairs*, so it is a matcher, not a hash: ucmfh uses it to re-rank
the Hamming top-M candidates of the hashing stage and on its own for the R@K protocol of §7.

Cost (the released code's defect 3). Everything that depends on one side only is computed once per
image or text (:meth:`SEPS.encode_images`, :meth:`SEPS.encode_texts`): the projections, s_im, the
predictor, and the aggregation MLP's logits, which work token by token. A pair then needs only its
selection and a few small contractions: its image-side tokens (the N_c aggregated tokens and the extra
token; the global token is one per image) are weightings ``R`` of the image's normalised patches, so
the pair's word–token similarities are ``(words · patchesᵀ) Rᵀ``, normalised by ``sqrt(diag(R G Rᵀ))``
with G the image's patch Gram matrix. No [pairs, N_c, C] tensor is ever built, and
:meth:`SEPS.grid` scores every (text, image) pair of two batches with one matrix product for
``words · patchesᵀ``; no Python loop over captions or images.

Selection (defect 2). 'frozen' is the released code: the scores carry no gradient and a hard top-K
decides. 'learned' and 'gumbel' keep the hard top-K forward but give the decision mask D a gradient
(straight through a sigmoid of each score's margin to the K-th, or the paper's Gumbel-softmax);
the aggregation then weights patch n by ``D_n exp(l_n) / Σ D exp(l)`` (DynamicViT's masked softmax,
equal to a softmax over the kept patches forward), and the extra token by ``(1 − D_n) exp(s_n)``, so
the loss reaches the scores — the predictor MLP, the projections — through what is kept and dropped.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ucmfh.config import SepsConfig
from ucmfh.similarity import normalize
from ucmfh.utils import known_host_copy, to_device

State = Dict[str, torch.Tensor]
_EPS = 1e-12


def _mlp(d_in: int, d_hidden: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_out))


def _chunk_plan(txt: State, masks: List[str], text_chunk: int) -> Tuple[torch.Tensor, List[List[int]]]:
    """The texts in order of length (of the sparse mask; ties by position) and, for each chunk of
    ``text_chunk`` of them, its longest row of each mask in ``masks``. From the masks' host copies where
    the inputs kept them (:func:`ucmfh.seps.scoring.text_inputs`): no wait for the device; else on the
    device, with one sync for every chunk's width."""
    hosts = [known_host_copy(txt[key]) for key in masks]
    on_host = all(host is not None for host in hosts)
    lengths = [mask.sum(dim=1) for mask in (hosts if on_host else [txt[key] for key in masks])]
    order = lengths[masks.index("mask_sparse")].argsort(stable=True)
    widths = torch.stack([torch.stack([length[index].max() for length in lengths])
                          for index in order.split(text_chunk)]).clamp(min=1).tolist()
    return (to_device(order, txt["mask_sparse"].device) if on_host else order), widths


def _minmax(s: torch.Tensor) -> torch.Tensor:
    """Min–max normalisation over the last axis (the patches)."""
    low, high = s.amin(dim=-1, keepdim=True), s.amax(dim=-1, keepdim=True)
    return (s - low) / (high - low + 1e-8)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the last axis of the entries where ``mask``; 0 where none is."""
    m = mask.to(x.dtype)
    return (x * m).sum(dim=-1) / m.sum(dim=-1).clamp(min=1.0)


class TokenAggregation(nn.Module):
    """The weights of N_c aggregated tokens, per patch: LayerNorm → Linear → GELU → Linear, × scale.

    Token by token, so :meth:`SEPS.encode_images` computes them once per image. Shape: [B, N, C] -> [B, N, N_c].
    """

    def __init__(self, dim: int, hidden: int, n_out: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, n_out))
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.net(tokens) * self.scale


class SEPS(nn.Module):
    """The SEPS matcher on frozen tokens (docs/reference.md §8).

    Args:
        d_img, d_txt: token widths of the two sides (each projected to ``cfg.embed_dim``).
        n_image_tokens: T, the image tokens per item.
        cfg: the :class:`SepsConfig` (version, selection, dense text, ratios).
        image_cls: whether image token 0 is a [CLS] token (a ViT's); otherwise the global
            token of the image side is the mean of its patches (``cfg.aggregate`` 'normalised'; 'raw', the
            released code's, has none).
        dense: whether the data hold dense descriptions (``cfg.dense_text`` then says whose).

    Example:
        >>> model = SEPS(1280, 384, 49, SepsConfig())
        >>> img = model.encode_images(torch.randn(3, 49, 1280))
        >>> txt = model.encode_texts(torch.randn(4, 7, 384), torch.ones(4, 7, dtype=torch.bool))
        >>> model.grid(img, txt)[0].shape   # [texts, images]
        torch.Size([4, 3])
    """

    def __init__(self, d_img: int, d_txt: int, n_image_tokens: int, cfg: SepsConfig,
                 image_cls: bool = False, dense: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        self.image_cls = image_cls
        self.dense = dense and cfg.dense_text != "none"
        self.n_patches = n_image_tokens - int(image_cls)
        if self.n_patches < 1:
            raise ValueError(f"{n_image_tokens} image tokens leave no patch")
        c = cfg.embed_dim
        self.n_keep = math.ceil(self.n_patches * cfg.keep_ratio)
        self.n_aggr = max(1, int(self.n_patches * cfg.keep_ratio * cfg.aggr_ratio))
        self.img_proj = nn.Linear(d_img, c)
        self.txt_proj = nn.Linear(d_txt, c)
        hidden = max(1, int(c * cfg.aggr_hidden_ratio))
        branches = ["sparse", "dense"] if self.dense else ["sparse"]
        self.aggr = nn.ModuleDict({b: TokenAggregation(c, hidden, self.n_aggr) for b in branches})
        if cfg.version == "paper":
            self.predictor = _mlp(c, max(1, c // 4), 1)
            k = cfg.hrpa_top_k
            self.row_mlp, self.col_mlp = _mlp(k, 2 * k, 1), _mlp(k, 2 * k, 1)

    # ---------------------------------------------------------------- one side at a time

    def encode_images(self, tokens: torch.Tensor, dense_words: Optional[torch.Tensor] = None,
                      dense_mask: Optional[torch.Tensor] = None) -> State:
        """Per-image quantities. Shape: tokens [V, T, d_img]; dense_* [V, L_d, d_txt], [V, L_d] (the
        descriptions *of these images*, ``dense_text='image'``)."""
        v = self.img_proj(tokens)
        patches = v[:, int(self.image_cls):]
        basis = normalize(patches)  # [V, N, C]: the scores' and selection's patches
        s_im = basis @ normalize(patches.mean(dim=1)).unsqueeze(-1)  # [V, N, 1]
        # what a pair's tokens weigh: the normalised patches, or (the released code's) the raw ones
        raw = self.cfg.aggregate == "raw"
        weighed = patches if raw else basis
        # the global token: [CLS] when there is one, else the patches' mean (ucmfh's); the released code has
        # none without a [CLS]. (Made before the Gram matrix and the aggregation, as it always was: the order
        # of a tensor's uses is the order its gradient's parts are summed in, and a model's last bits.)
        glob = {"glob_token": normalize(v[:, 0]) if self.image_cls else normalize(basis.mean(dim=1))} \
            if self.image_cls or not raw else {}
        state = {"basis": basis, "gram": weighed @ weighed.transpose(1, 2), "s_im": s_im.squeeze(-1), **glob,
                 **({"tokens": patches} if raw else {}), **{f"aggr_{b}": m(weighed) for b, m in self.aggr.items()}}
        if self.cfg.version == "paper":
            state["pred"] = torch.sigmoid(self.predictor(basis)).squeeze(-1)
        if self.dense and self.cfg.dense_text == "image":
            if dense_words is None:
                raise ValueError("dense_text='image' needs the dense descriptions of the images")
            state.update(self._words(dense_words, dense_mask, "dense"))
        return state

    def encode_texts(self, words: torch.Tensor, mask: torch.Tensor, dense_words: Optional[torch.Tensor] = None,
                     dense_mask: Optional[torch.Tensor] = None) -> State:
        """Per-text quantities. Shape: words [T, L, d_txt], mask [T, L] bool; dense_* the descriptions
        of each caption's own image (``dense_text='leak'`` only)."""
        state = self._words(words, mask, "sparse")
        if self.dense and self.cfg.dense_text == "leak":
            if dense_words is None:
                raise ValueError("dense_text='leak' needs the dense description of each caption's image")
            state.update(self._words(dense_words, dense_mask, "dense"))
        return state

    def _words(self, words: torch.Tensor, mask: torch.Tensor, name: str) -> State:
        # every row projected and the padding zeroed: selecting the real rows by the mask would make the
        # host wait for the device to count them (bfloat16 under autocast)
        w = torch.where(mask.unsqueeze(-1), self.txt_proj(words), 0)
        m = mask.to(w.dtype).unsqueeze(-1)
        glob = normalize((w * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0))
        return {f"words_{name}": normalize(w) * m, f"mask_{name}": mask, f"glob_{name}": glob}

    # ---------------------------------------------------------------- pairs

    def grid(self, img: State, txt: State, text_chunk: int = 32) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Scores of every (text, image) pair: ``[T, V]``, and the mean of the soft selection mask
        (the ratio loss's input; None unless ``selection='learned'``).

        Texts are scored ``text_chunk`` at a time in order of length, each chunk padded to its own
        longest caption only.
        """
        n_text = txt["mask_sparse"].shape[0]
        if n_text <= text_chunk:
            return self._grid(img, txt)
        masks = [key for key in txt if key.startswith("mask_")]
        order, widths = _chunk_plan(txt, masks, text_chunk)
        chunks = order.split(text_chunk)
        sims, softs = [], []
        for index, width in zip(chunks, widths):
            part = {}
            for key, value in txt.items():
                value = value[index]
                if key.startswith("words_") or key.startswith("mask_"):
                    value = value[:, :width[masks.index("mask_" + key.split("_", 1)[1])]]
                part[key] = value
            s, soft = self._grid(img, part)
            sims.append(s)
            softs.append(soft)
        out = torch.empty_like(sims[0].new_empty(n_text, sims[0].shape[1]))
        out = out.index_copy(0, order, torch.cat(sims))
        soft = None if softs[0] is None else torch.stack(
            [s * len(i) for s, i in zip(softs, order.split(text_chunk))]).sum() / n_text
        return out, soft

    def _grid(self, img: State, txt: State) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        n = self.n_patches
        s_im = img["s_im"][None]  # [1, V, N]
        s_st = torch.einsum("tc,vnc->tvn", txt["glob_sparse"], img["basis"][:, :n])
        s_dt = None
        if self.dense:
            holder = img if self.cfg.dense_text == "image" else txt
            glob = holder["glob_dense"]
            s_dt = (torch.einsum("vc,vnc->vn", glob, img["basis"][:, :n])[None] if holder is img
                    else torch.einsum("tc,vnc->tvn", glob, img["basis"][:, :n]))
        if self.cfg.version == "paper":
            attention = _minmax(s_st) + 2 * _minmax(s_im) + (0 if s_dt is None else _minmax(s_dt))
            score = (1 - 2 * self.cfg.beta) * img["pred"][None] + self.cfg.beta * attention
            parts, soft = self._select(score, img["aggr_sparse"], joint=self.dense)
            if self.dense:  # one joint aggregation: the two aggregators' tokens add
                parts[0] = parts[0] + self._select(score, img["aggr_dense"], joint=True)[0][0]
            return self._hrpa(parts, img, txt, "sparse"), soft
        parts, soft = self._select(s_im + s_st, img["aggr_sparse"])
        sims = self._hrpa(parts, img, txt, "sparse")
        if self.dense:  # the released code's second branch: its own selection and tokens, scored on its text
            parts_d, soft_d = self._select(s_im + s_dt.expand_as(s_st), img["aggr_dense"])
            sims = sims + self._hrpa(parts_d, img, txt, "dense")
            soft = None if soft is None else (soft + soft_d) / 2
        return sims, soft

    def _select(self, score: torch.Tensor, aggr_logits: torch.Tensor,
                joint: bool = False) -> Tuple[List[torch.Tensor], Optional[torch.Tensor]]:
        """The selected image-side tokens of every pair, as weights over the image's patches.

        Shape: score [T, V, N]; aggr_logits [V, N, N_c] -> parts ``[aggregated [T, V, N_c, N]]``, plus
        ``extra [T, V, 1, N]`` when patches are dropped; and the soft mask's mean or None. A token is
        normalised later, so its weights need not sum to 1; ``joint`` makes the aggregated ones do (two
        aggregations are then added).
        """
        cfg = self.cfg
        n, k = self.n_patches, self.n_keep
        if cfg.selection == "frozen":
            score = score.detach()  # the released code selects under torch.no_grad()
        noisy = score
        if k < n and cfg.selection == "gumbel" and self.training:  # straight through: the forward keeps the top K
            noise = -torch.log(-torch.log(torch.rand_like(score) + 1e-9) + 1e-9)  # of the noisy scores, a sample
            noisy = score + noise
        top = noisy.topk(k, dim=-1)
        hard = torch.zeros_like(score).scatter_(-1, top.indices, 1.0)
        soft_mean = None
        mask = hard
        if k < n and cfg.selection == "learned":
            kth = top.values[..., -1:]
            next_best = score.masked_fill(hard.bool(), -math.inf).amax(dim=-1, keepdim=True)
            threshold = ((kth + next_best) / 2).detach()
            soft = torch.sigmoid((score - threshold) / cfg.select_temperature)
            mask = hard + soft - soft.detach()
            soft_mean = soft.mean()
        elif k < n and cfg.selection == "gumbel":
            soft = torch.softmax(noisy / cfg.select_temperature, dim=-1)
            mask = hard + soft - soft.detach()
        # aggregation: a softmax over the kept patches, written as D exp(l) / Σ D exp(l)
        logits = aggr_logits.transpose(1, 2)[None]  # [1, V, N_c, N]
        aggr = mask[:, :, None, :] * torch.exp(logits - logits.amax(dim=-1, keepdim=True).detach())
        if joint:
            aggr = aggr / aggr.sum(dim=-1, keepdim=True).clamp(min=_EPS)
        parts = [aggr]
        if k < n:  # the dropped patches, softmax(score)-weighted, as one extra token
            parts.append(((1 - mask) * torch.exp(score - score.amax(dim=-1, keepdim=True).detach()))[:, :, None, :])
        return parts, soft_mean

    def _hrpa(self, parts: List[torch.Tensor], img: State, txt: State, branch: str) -> torch.Tensor:
        """HRPA of every pair: ``mean_i max_j A_ij + mean_j max_i A_ij`` (+ the paper's top-K MLPs).

        A = words · tokensᵀ, the tokens normalised: the image's global token (where it has one), then each
        part's tokens ``weights · patches`` (the normalised patches, or with ``cfg.aggregate`` 'raw' the raw
        ones), whose word products come from ``words · patchesᵀ`` and whose norms from the patches' Gram matrix.
        """
        holder = txt if f"words_{branch}" in txt else img  # dense words may belong to the image
        words, mask = holder[f"words_{branch}"], holder[f"mask_{branch}"]
        basis, gram = img.get("tokens", img["basis"]), img["gram"]  # the patches the tokens weigh (aggregate)
        if holder is txt:
            t, m, c = words.shape
            v, n = basis.shape[:2]
            flat = mask.reshape(-1)
            if words.is_cuda:  # every word's products, the padding's zeroed: a boolean index waits for its values
                g = (words.reshape(t * m, c) @ basis.reshape(v * n, c).T).masked_fill(~flat[:, None], 0.0)
            else:  # one matrix product over the real words only (captions are padded to the longest)
                g = words.new_zeros(t * m, v * n)
                g[flat] = words.reshape(t * m, c)[flat] @ basis.reshape(v * n, c).T
            g = g.reshape(t, m, v, n)
            columns = [torch.einsum("tmc,vc->tvm", words, img["glob_token"])[..., None]] if "glob_token" in img else []
            word_mask = mask[:, None, :]  # [T, 1, M]
            contract = "tmvn,tvjn->tvmj"
        else:  # [V, M, N] per image
            g = torch.einsum("vmc,vnc->vmn", words, basis)
            columns = ([torch.einsum("vmc,vc->vm", words, img["glob_token"])[None, ..., None]] if "glob_token" in img
                       else [])
            word_mask = mask[None]  # [1, V, M]
            contract = "vmn,tvjn->tvmj"
        for weights in parts:
            t, v, j, n = weights.shape  # squared norms of the tokens: diag(R G Rᵀ), one product per image
            rg = weights.transpose(0, 1).reshape(v, t * j, n) @ gram
            sq = (rg.reshape(v, t, j, n).transpose(0, 1) * weights).sum(dim=-1)
            columns.append(torch.einsum(contract, g, weights) / sq.clamp(min=_EPS).sqrt()[:, :, None, :])
        a = torch.cat([col.expand(*columns[-1].shape[:3], col.shape[-1]) for col in columns], dim=-1)
        if self.cfg.version == "code":
            a = F.leaky_relu(a, negative_slope=0.1)
        row = a.amax(dim=-1)  # each word's best token: [T, V, M]
        col = a.masked_fill(~word_mask[..., None], -math.inf).amax(dim=-2)  # each token's best word: [T, V, J]
        col = col.masked_fill(torch.isinf(col), 0.0)  # a text without words
        word_mask = word_mask.expand_as(row)
        sims = _masked_mean(row, word_mask) + col.mean(dim=-1)
        if self.cfg.version == "paper":
            sims = sims + self._top_mlp(self.row_mlp, row.masked_fill(~word_mask, -math.inf))
            sims = sims + self._top_mlp(self.col_mlp, col)
        return sims

    def _top_mlp(self, mlp: nn.Module, maxima: torch.Tensor) -> torch.Tensor:
        k = self.cfg.hrpa_top_k
        top = maxima.topk(min(k, maxima.shape[-1]), dim=-1).values
        top = top.masked_fill(torch.isinf(top), 0.0)
        if top.shape[-1] < k:  # fewer words than k
            top = F.pad(top, (0, k - top.shape[-1]))
        return mlp(top).squeeze(-1)
