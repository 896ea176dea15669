"""CCA-ITQ (Gong & Lazebnik, CVPR 2011): the classic leak-free cross-modal hashing baseline.

Each modality is centred (and PCA-reduced when it is wide), CCA finds paired
directions on the training split, and ITQ learns one rotation of the stacked
projected training items that minimises quantisation error. Codes are the
signs of the rotated projections: image codes from images alone and text
codes from texts alone, like the ``unimodal`` protocol.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np
import torch
from sklearn.cross_decomposition import CCA
from sklearn.decomposition import PCA

from ucmfh.data.h5 import Dataset, Split
from ucmfh.similarity import sign_codes


@dataclass
class CCAITQ:
    """A fitted CCA-ITQ model; ``n_bits`` may be fewer than asked where the feature dims cap CCA."""

    pca_img: PCA
    pca_txt: PCA
    cca: CCA
    rotation: np.ndarray  # [n_bits, n_bits]

    @property
    def n_bits(self) -> int:
        return self.rotation.shape[0]

    def codes(self, split: Split) -> Tuple[torch.Tensor, torch.Tensor]:
        """±1 image codes from images alone and text codes from texts alone. Shape: -> two [N, n_bits]."""
        img, txt = self.cca.transform(self.pca_img.transform(split.img.numpy()), self.pca_txt.transform(split.txt.numpy()))
        return (sign_codes(torch.from_numpy(img @ self.rotation)),
                sign_codes(torch.from_numpy(txt @ self.rotation)))


def fit_cca_itq(data: Dataset, n_bits: int, max_pca: int = 128, iterations: int = 50, seed: int = 0) -> CCAITQ:
    """Fit CCA-ITQ on ``data.train``; PCA keeps at most ``max_pca`` dims and a quarter of the items per modality."""
    img, txt = data.train.img.numpy().astype(np.float64), data.train.txt.numpy().astype(np.float64)
    n = img.shape[0]
    pca_img = PCA(min(img.shape[1], max_pca, n // 4), random_state=seed).fit(img)
    pca_txt = PCA(min(txt.shape[1], max_pca, n // 4), random_state=seed).fit(txt)
    img, txt = pca_img.transform(img), pca_txt.transform(txt)
    n_components = min(n_bits, img.shape[1], txt.shape[1])
    cca = CCA(n_components, max_iter=1000).fit(img, txt)
    proj = np.vstack(cca.transform(img, txt))
    rng = np.random.default_rng(seed)
    rotation, _ = np.linalg.qr(rng.normal(size=(n_components, n_components)))
    for _ in range(iterations):
        codes = np.where(proj @ rotation >= 0, 1.0, -1.0)
        u, _, vt = np.linalg.svd(proj.T @ codes)
        rotation = u @ vt
    return CCAITQ(pca_img, pca_txt, cca, rotation)
