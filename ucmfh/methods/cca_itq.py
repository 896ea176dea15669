"""Method 'cca-itq' (Gong & Lazebnik, CVPR 2011): the classic leak-free cross-modal hashing baseline.

Each modality is centred (and PCA-reduced when it is wide), CCA (scikit-learn's, computed on the features'
products: :func:`cca`) finds paired directions on the training split, and ITQ learns one rotation of the
stacked projected training items that minimises quantisation error. Codes are the signs of the rotated
projections: image codes from images alone and text codes from texts alone. The whole map is linear, so the
fitted model is a :class:`~ucmfh.models.hashing.FeatureHasher` with linear heads: it is saved, loaded,
encoded and scored like any other hashing model.
"""
from __future__ import annotations

import random
from typing import TYPE_CHECKING, Callable, Optional, Tuple

import numpy as np
import torch

from ucmfh.config import FusionConfig, HashConfig
from ucmfh.data.h5 import Dataset, Split
from ucmfh.methods.base import Method
from ucmfh.methods.registry import register
from ucmfh.models.fusion import FusionEncoder
from ucmfh.models.hashing import FeatureHasher
from ucmfh.run_draws import building_to_replace, setting_up
from ucmfh.signals import TrainingInterrupted
from ucmfh.training_state import StateFile
from ucmfh.selection import History

if TYPE_CHECKING:  # imported where it runs: scikit-learn adds ~1 s to every `ucmfh` start
    from sklearn.decomposition import PCA


@register
class CcaItq(Method):
    """PCA (at most ``max_pca`` dims, without directions of no variance), CCA and an ITQ rotation, fitted
    in closed form on the whole training split (no epochs, so nothing to select on a validation split)."""

    name = "cca-itq"
    description = "the linear baseline: PCA, CCA and an ITQ rotation fitted on the training split (no epochs)"
    params = {"max_pca": 128, "iterations": 50}
    # a linear map whatever was asked (e.g. one --set for every method of a grid), fitted once; the
    # settings of training by steps do nothing here, so they stay HashConfig's and never split a run's identity
    fixed = {"hidden": 0, "epochs": 1, "val_fraction": 0.0, "patience": 0,
             **{name: value for name, value in vars(HashConfig()).items() if name in (
                 "dropout", "modality_dropout", "relaxation", "beta_schedule", "beta_gamma",
                 "beta_step_iters", "beta_step_epochs", "loss", "loss_params", "supervised",
                 "batch_size", "lr_fusion", "lr_head", "betas", "amp", "refit")}}
    takes_loss = False
    closed_form = True
    in_memory = "fits in closed form on the whole training split"

    def check(self, cfg: HashConfig) -> None:
        super().check(cfg)
        params = self.method_params(cfg.method_params)
        if params["max_pca"] < 1 or params["iterations"] < 0:
            raise ValueError(f"method 'cca-itq': max_pca must be >= 1 and iterations >= 0, got {params}")

    def build_model(self, d_img: int, d_txt: int, cfg: HashConfig,
                    fusion_cfg: Optional[FusionConfig] = None) -> FeatureHasher:
        return FeatureHasher(d_img, d_txt, cfg.n_bits, cfg.hidden, cfg.dropout)

    def fit(self, data: Dataset, cfg: HashConfig, fusion: Optional[FusionEncoder] = None, progress: bool = True,
            state: Optional[StateFile] = None) -> Tuple[FeatureHasher, History]:
        params = self.method_params(cfg.method_params)
        try:
            model, filled = fit_cca_itq(data.train, cfg.n_bits, params["max_pca"], params["iterations"], cfg.seed,
                                        data.path or data.name)
        except KeyboardInterrupt as err:  # no step to stop at, and nothing to save: said as a run's interrupt is
            raise TrainingInterrupted(f"{self.name} {cfg.n_bits} bits interrupted while fitting (a fit keeps no "
                                      "state: the same command fits it again)", None,
                                      getattr(err, "signum", None)) from None
        history = History()
        if filled < cfg.n_bits:  # the other bits are +1 for every item: said, not hidden in the codes
            history.filled_bits = filled
        return model, history


def _linear_map(fn: Callable[[np.ndarray], np.ndarray], mean: np.ndarray) -> np.ndarray:
    """The matrix M of an affine ``fn`` centred at ``mean``: fn(x) = fn(mean) + (x - mean) M. Shape: [d, k]."""
    at_mean = fn(mean[None])
    return fn(mean[None] + np.eye(mean.shape[0])) - at_mean


def _pca(x: np.ndarray, max_dims: int, seed: int) -> "PCA":
    """PCA to at most ``max_dims``, without directions of no variance (features that sum to one,
    like Wiki's topic proportions, have one): CCA would scale their rounding noise up to whole bits."""
    with setting_up():  # no run side by side steps meanwhile (ucmfh.run_draws)
        state = random.getstate()
        try:  # here, not at the top (above); scikit-learn loads rich, where it is installed, which draws from
            # Python's generator as it loads: a notebook's next draws after its first cca-itq fit were others
            from sklearn.decomposition import PCA  # noqa: F811
        finally:
            random.setstate(state)
    pca = PCA(min(x.shape[1], max_dims), random_state=seed).fit(x)
    kept = int((pca.explained_variance_ > 1e-10 * pca.explained_variance_[0]).sum())
    return pca if kept == pca.n_components_ else PCA(kept, random_state=seed).fit(x)


def cca(x: np.ndarray, y: np.ndarray, n_components: int, max_iter: int = 1000,
        tol: float = 1e-06) -> Tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]:
    """scikit-learn's ``CCA(n_components, max_iter=max_iter, tol=tol).fit(x, y)``, as its ``transform`` of each
    side: the same power method (mode B), sign, deflations and rotations, computed on the ``[d, d]`` products of
    the standardised features instead of the ``[N, d]`` matrices themselves. Every step of it is a product with
    the features, so each is one with ``XᵀX``, ``YᵀY`` or ``XᵀY`` (the pseudo-inverses by eigenvalues, directions
    below 1e-6 of the largest singular value left out: a deflated one); a deflation updates them by rank one. The
    projections agree with scikit-learn's to 1e-12, with the same number of iterations per component, on wiki,
    mirflickr730, flickr8k1000 and flickr8k at 16 to 128 components; full Flickr8k's 128 take 0.5 s, not
    scikit-learn's 220 s (whose every iteration is a product with 35,455 rows, and every component an SVD)."""
    eps = np.finfo(np.float64).eps
    means, stds, grams = [], [], []
    for z in (x, y):
        mean = z.mean(0)
        std = (z - mean).std(0, ddof=1)
        std[std == 0.0] = 1.0
        means.append(mean)
        stds.append(std)
        grams.append((z - mean) / std)
    xs, ys = grams
    gx, gy, c = xs.T @ xs, ys.T @ ys, xs.T @ ys
    weights = [np.zeros((x.shape[1], n_components)), np.zeros((y.shape[1], n_components))]
    loadings = [np.zeros((x.shape[1], n_components)), np.zeros((y.shape[1], n_components))]
    for k in range(n_components):
        gx_pinv, gy_pinv = _gram_pinv(gx), _gram_pinv(gy)
        x_u, x_old = c[:, 0], 100  # Xᵀu, u y's score: its first column to begin with
        for _ in range(max_iter):
            x_w = gx_pinv @ x_u
            x_w /= np.sqrt(x_w @ x_w) + eps
            y_w = gy_pinv @ (c.T @ x_w)
            y_w /= np.sqrt(y_w @ y_w) + eps
            x_u = (c @ y_w) / (y_w @ y_w + eps)  # u = Y y_w / y_wᵀy_w
            step = x_w - x_old
            if step @ step < tol or y.shape[1] == 1:
                break
            x_old = x_w
        sign = np.sign(x_w[np.argmax(np.abs(x_w))])
        x_w, y_w = x_w * sign, y_w * sign
        tt, uu = x_w @ gx @ x_w, y_w @ gy @ y_w  # the scores' squared norms, t = X x_w and u = Y y_w
        p, q = gx @ x_w / tt, gy @ y_w / uu  # the loadings; X -= t pᵀ and Y -= u qᵀ, on the products
        c = c - np.outer(c @ y_w, q) - np.outer(p, x_w @ c) + (x_w @ c @ y_w) * np.outer(p, q)
        gx, gy = gx - tt * np.outer(p, p), gy - uu * np.outer(q, q)
        weights[0][:, k], weights[1][:, k], loadings[0][:, k], loadings[1][:, k] = x_w, y_w, p, q
    from scipy.linalg import pinv

    rotations = [w @ pinv(l.T @ w, check_finite=False) for w, l in zip(weights, loadings)]
    return tuple((lambda z, m=m, s=s, r=r: (z - m) / s @ r) for m, s, r in zip(means, stds, rotations))


def _gram_pinv(gram: np.ndarray) -> np.ndarray:
    """The pseudo-inverse of ``gram`` (``ZᵀZ``), without the directions whose singular value of Z is below 1e-6 of
    the largest (a deflated direction: 0 but for rounding)."""
    values, vectors = np.linalg.eigh(gram)
    kept = values > values.max() * 1e-12
    return (vectors[:, kept] / values[kept]) @ vectors[:, kept].T


def fit_cca_itq(train: Split, n_bits: int, max_pca: int = 128, iterations: int = 50,
                seed: int = 0, source: str = "the training split") -> Tuple[FeatureHasher, int]:
    """Fit CCA-ITQ on a training split; PCA keeps at most ``max_pca`` dims and a quarter of the items.

    Returns the model and the number of bits CCA could fill: ``min(n_bits, PCA dims of each
    modality)``. Bits beyond it are constant (+1), so they never change a Hamming ranking
    (Wiki's 10-d topic proportions, which sum to one, give 9 informative bits at any length).
    """
    img, txt = train.img.numpy().astype(np.float64), train.txt.numpy().astype(np.float64)
    n = img.shape[0]
    if n < 8:
        raise ValueError(f"{source}: method 'cca-itq' needs at least 8 training items (PCA keeps a quarter of "
                         f"them), got {n}")
    for modality, x in (("image", img), ("text", txt)):  # else PCA keeps no direction, and says so in warnings
        if not np.ptp(x, axis=0).any():
            raise ValueError(f"{source}: every training item has the same {modality} features: method 'cca-itq' "
                             "finds no direction to learn a bit from")
    pca_img, pca_txt = _pca(img, min(max_pca, n // 4), seed), _pca(txt, min(max_pca, n // 4), seed)
    n_components = min(n_bits, pca_img.n_components_, pca_txt.n_components_)
    reduced = pca_img.transform(img), pca_txt.transform(txt)
    from threadpoolctl import threadpool_limits  # scikit-learn's own dependency
    # thousands of products of a [d, d] matrix and a vector: a second BLAS thread only adds its wait, the longer
    # where a core is busy (a grid's other cell): 128 components of flickr8k1000 took 1.2 s with two threads
    # beside a busy core, 0.4 s with one
    with threadpool_limits(1, user_api="blas"):
        cca_img, cca_txt = cca(*reduced, n_components)
    proj = np.vstack([cca_img(reduced[0]), cca_txt(reduced[1])])
    rng = np.random.default_rng(seed)
    rotation, _ = np.linalg.qr(rng.normal(size=(n_components, n_components)))
    for _ in range(iterations):
        codes = np.where(proj @ rotation >= 0, 1.0, -1.0)
        u, _, vt = np.linalg.svd(proj.T @ codes)
        rotation = u @ vt
    # the whole map of each modality as one matrix on the centred features; PCA centres on the
    # training mean, so CCA's own offset is zero up to rounding and the map has no bias
    img_map = _linear_map(lambda x: cca_img(pca_img.transform(x)), pca_img.mean_) @ rotation
    txt_map = _linear_map(lambda y: cca_txt(pca_txt.transform(y)), pca_txt.mean_) @ rotation
    with building_to_replace():  # the caller's draws as they were (its initial weights are replaced below)
        model = FeatureHasher(img.shape[1], txt.shape[1], n_bits, hidden=0)  # one linear map per modality
    with torch.no_grad():
        model.img_mean.copy_(torch.from_numpy(pca_img.mean_))
        model.txt_mean.copy_(torch.from_numpy(pca_txt.mean_))
        for head, matrix in ((model.img_head, img_map), (model.txt_head, txt_map)):
            layer = head.net[0]
            layer.weight.zero_()
            layer.bias.zero_()
            layer.weight[:n_components] = torch.from_numpy(matrix.T)
    return model.eval(), n_components
