"""How much class information one modality's features hold: a supervised ceiling for image→text.

For a single-label set (Wiki), a classifier is trained on one modality's *training* features and
*labels* (which no unsupervised method sees), its settings chosen on a seeded tenth of the training
split, never on the query split. Each query is then ranked against the retrieval items by the
probability the classifier gives to each item's true label: the retrieval side is an oracle that
knows every item's class, as no text code does. Its MAP@50 bounds what a code of that modality's
queries can reach as far as this classifier can read the features; for a single-label set it is close
to the classifier's query accuracy (the top 50 are all of the predicted class).

    python scripts/feature_ceiling.py ../shared/data/wiki.h5 --modality img

Run on Wiki's 128-d SIFT image features it says how far any image code can go there, e.g. whether
CCA-ITQ + 0.05 image→text is within reach.
"""
from __future__ import annotations

import argparse
import json
import warnings

import numpy as np
import torch
from sklearn.calibration import CalibratedClassifierCV
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.svm import SVC

from ucmfh.data.h5 import load_dataset
from ucmfh.metrics import map_at_k
from ucmfh.metrics.arguments import DEFAULT_K
from ucmfh.selection import validation_items

FEATURE_MAPS = {"raw": lambda x: x, "sqrt": lambda x: np.sqrt(np.clip(x, 0, None))}  # sqrt: Hellinger, for histograms
CLASSIFIERS = {
    "logistic": lambda c: LogisticRegression(C=c, max_iter=3000),
    "svm-rbf": lambda c: CalibratedClassifierCV(SVC(C=c), ensemble=False),  # probabilities by Platt scaling
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="a single-label ucmfh HDF5 file")
    parser.add_argument("--modality", choices=("img", "txt"), default="img")
    parser.add_argument("--k", type=int, default=DEFAULT_K)
    parser.add_argument("--seed", type=int, default=2023, help="seed of the validation split")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=ConvergenceWarning)

    data = load_dataset(args.dataset)
    if data.caption_set or (data.train.labels.sum(1) != 1).any():
        raise SystemExit(f"{args.dataset}: needs a single-label set (one class per item)")
    features = {name: getattr(getattr(data, name), args.modality).numpy() for name in ("train", "query")}
    classes = {name: getattr(data, name).labels.argmax(1).numpy() for name in ("train", "query")}
    rest, val = validation_items(np.arange(len(data.train)), 0.1, args.seed)

    trials = []
    for (map_name, fmap), (clf_name, make), c in (
        (m, k, c) for m in FEATURE_MAPS.items() for k in CLASSIFIERS.items() for c in (0.1, 1.0, 10.0, 100.0)
    ):
        x = fmap(features["train"])
        clf = make(c).fit(x[rest], classes["train"][rest])
        trials.append({"features": map_name, "classifier": clf_name, "C": c,
                       "val_accuracy": float((clf.predict(x[val]) == classes["train"][val]).mean())})
    best = max(trials, key=lambda t: t["val_accuracy"])
    fmap = FEATURE_MAPS[best["features"]]
    clf = CLASSIFIERS[best["classifier"]](best["C"]).fit(fmap(features["train"]), classes["train"])
    probs = clf.predict_proba(fmap(features["query"]))
    onehot = np.eye(probs.shape[1])[data.retrieval.labels.argmax(1).numpy()]  # cosine = P(query, item's class)
    oracle = map_at_k(torch.from_numpy(probs), torch.from_numpy(onehot), data.query.labels, data.retrieval.labels,
                      k=args.k, ranking="cosine")
    print(json.dumps({"dataset": args.dataset, "modality": args.modality, "chosen_on_validation": best,
                      "query_accuracy": float((probs.argmax(1) == classes["query"]).mean()),
                      f"oracle_map@{args.k}": oracle, "trials": trials}, indent=1))


if __name__ == "__main__":
    main()
