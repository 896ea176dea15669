"""Planted bugs: does the test suite catch the slips that would break ucmfh's headline claims?

Each planted bug is a tiny textual patch (a file, an exact old text that occurs once in it, the new
text, one line saying what it breaks, and the test files that should notice). The script copies the
checkout (its tracked and untracked, not ignored, files, plus the compiled kernel
``ucmfh/metrics/_hamming*.so``) into a temporary folder, runs every selected bug's test files on the
unpatched copy (they must pass: else "baseline fails"), then for each bug in turn applies its patch,
runs ``python -m pytest <its tests> -q -x`` in the copy, and restores the file.

A bug is *caught* when pytest exits 1 with at least one test failing (a failure, or an error in a
test's set-up); a patch that no longer imports, or that makes pytest fail to collect, is a *broken
patch*, never counted as caught. Nothing is written into the checkout: the copy, pytest's temporary
folders and ``TMPDIR`` all live under one ``tempfile.mkdtemp()`` folder, removed at the end (also on
Ctrl-C) unless ``--keep``.

    OMP_NUM_THREADS=1 python scripts/planted_bugs.py --json /tmp/planted.json
    python scripts/planted_bugs.py --list
    python scripts/planted_bugs.py --only infonce-ignores-ids --only sign-of-zero

Exit status: 0 when every selected bug is caught, 1 when one is not (or the baseline fails), 2 for a
bad option or a patch whose old text is not in its file exactly once, 130 on Ctrl-C.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, NoReturn, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
KERNELS = "ucmfh/metrics/_hamming*.so"


@dataclass(frozen=True)
class Bug:
    """One planted bug: replace ``old`` (exactly once in ``file``) by ``new``; ``tests`` are pytest
    arguments (files or node ids) that should fail with it."""

    name: str
    file: str
    old: str
    new: str
    what: str
    tests: Tuple[str, ...]


REGISTRY_LEAK = "tests/methods/test_registry.py::test_a_leak_free_method_codes_each_modality_from_itself"
REGISTRY_RESUME = "tests/methods/test_registry.py::test_an_interrupted_run_resumes_to_the_same_model"
RUNS_SIGKILL = "tests/app/test_runs.py::test_sigkill_late_in_a_stage_then_resume_gives_identical_codes"
REGISTRY_HELD_OUT = "tests/methods/test_registry.py::test_validation_items_never_train_and_only_they_pick_the_epoch"
TRAIN_ONLY = "tests/methods/test_train_only.py"

BUGS: Tuple[Bug, ...] = (
    # --- leak-free: each modality's code from that modality alone (README, "Two evaluation protocols")
    Bug("hasher-text-via-image-head", "ucmfh/models/hashing.py",
        "        return self.txt_head(self.fusion.encode_txt(x))",
        "        return self.img_head(self.fusion.encode_txt(x))",
        "CrossModalHasher.modality_logits (index/search of a ucmfh checkpoint) hashes texts with the image head",
        ("tests/models/test_models.py", REGISTRY_LEAK)),
    Bug("fusion-unimodal-text-fused", "ucmfh/models/fusion.py",
        "            return self.encode_img(img), self.encode_txt(txt)",
        "            return self.encode_img(img), self(img, txt)[1]",
        "the unimodal protocol's text embeddings come from the fused pass (they see the paired image)",
        ("tests/models/test_models.py", REGISTRY_LEAK)),
    Bug("feature-hasher-text-uncentred", "ucmfh/models/hashing.py",
        "        return self.txt_head(normalize(x - self.txt_mean))",
        "        return self.txt_head(normalize(x))",
        "FeatureHasher.modality_logits (two-tower/distill index and search) forgets to centre the texts",
        ("tests/search/test_search.py", REGISTRY_LEAK)),
    Bug("search-text-as-image", "ucmfh/search/folder.py",
        "_SHORT = {full: short for short, full in NAMES.items()}",
        '_SHORT = {full: "img" for short, full in NAMES.items()}',
        "modality_name maps 'text' to the image side: search encodes text queries with the image encoder",
        ("tests/search/test_search.py", "tests/search/test_search_cli.py")),
    Bug("fusion-attends-across-batch", "ucmfh/models/fusion.py",
        "d_model, n_heads, d_ff, dropout, batch_first=True",
        "d_model, n_heads, d_ff, dropout, batch_first=False",
        "the fusion Transformer reads [B, 2, d] as [seq, batch, d]: items attend to other items of the batch",
        ("tests/models/test_models.py",)),
    Bug("fused-protocol-unimodal", "ucmfh/models/fusion.py",
        "            return self(img, txt)",
        "            return self.encode_img(img), self.encode_txt(txt)",
        "the fused protocol (UCMFH's own evaluation, to reproduce its numbers) silently encodes one modality alone",
        ("tests/models/test_models.py",)),
    Bug("fusion-ignores-separate", "ucmfh/models/fusion.py",
        "        out = self.encoder(tokens, mask=mask, is_causal=False)",
        "        out = self.encoder(tokens, is_causal=False)",
        "training's modality dropout does nothing: separated items still attend across modalities",
        ("tests/models/test_models.py",)),
    Bug("seed-not-applied", "ucmfh/utils.py",
        "    torch.manual_seed(seed)\n",
        "",
        "seed_everything leaves torch's global generator unseeded: weights and dropout differ run to run",
        ("tests/test_train.py",)),
    Bug("sign-of-zero", "ucmfh/similarity.py",
        "torch.where(x >= 0, 1.0, -1.0)",
        "torch.where(x > 0, 1.0, -1.0)",
        "sign(0) becomes -1, not +1 (docs/reference.md §5)",
        ("tests/models/test_models.py",)),
    # --- MAP@K: ties by retrieval index
    Bug("map-unstable-argsort", "ucmfh/metrics/ap.py",
        'np.argsort(dist.to(torch.uint8).numpy(), axis=1, kind="stable")',
        "np.argsort(dist.to(torch.uint8).numpy(), axis=1)",
        "MAP's CPU argsort of distances loses kind='stable': tied items no longer in index order",
        ("tests/metrics/test_metrics.py",)),
    Bug("topk-tie-group-order", "ucmfh/metrics/topk.py",
        "group_key = group_max * n_groups - torch.arange(n_groups, device=device)",
        "group_key = group_max * n_groups + torch.arange(n_groups, device=device)",
        "torch top-K prefers later groups among equal maxima: tied items not taken in index order",
        ("tests/metrics/test_metrics.py",)),
    # --- losses: the positives of a batch
    Bug("infonce-ignores-ids", "ucmfh/losses/infonce.py",
        "others = positive_mask(b, ids, device=img.device) & ~diag",
        "others = positive_mask(b, None, device=img.device) & ~diag",
        "InfoNCE ignores ids: captions of one image are pushed apart as negatives",
        ("tests/losses/test_losses.py",)),
    Bug("positive-mask-diagonal-only", "ucmfh/similarity.py",
        "    return ids[:, None] == ids[None, :]",
        "    return torch.eye(n, dtype=torch.bool, device=device)",
        "positive_mask forgets equal ids: only each pair itself is a positive, in every loss",
        ("tests/losses/test_losses.py",)),
    # --- distributed training
    Bug("gather-without-gradient", "ucmfh/distributed.py",
        "        dist.all_reduce(grad)  # every rank's loss depends on this rank's part\n",
        "",
        "the all-gather's backward keeps only this rank's own gradient (a gather without gradient)",
        ("tests/test_distributed.py::test_two_ranks_give_the_one_process_gradient",
         "tests/test_distributed.py::test_torchrun_train_hash_writes_once_and_matches_one_process")),
    Bug("check-device-world-size", "ucmfh/distributed.py",
        "    if local_world_size > gpus:",
        "    if world_size > gpus:",
        "check_device counts every machine's processes against this machine's GPUs",
        ("tests/test_distributed.py::test_cuda_under_torchrun_needs_one_gpu_per_process",)),
    # --- resume: a resumed run equals one never stopped
    Bug("resume-no-torch-rng", "ucmfh/trainer.py",
        "        torch.set_rng_state(rng.cpu())\n",
        "",
        "resume does not restore torch's random state (dropout masks differ after a resume)",
        (REGISTRY_RESUME, RUNS_SIGKILL)),
    Bug("resume-forgets-best", "ucmfh/trainer.py",
        '        self.best = BestEpoch(saved["best"])\n',
        "",
        "resume forgets the best-so-far validation record (best epoch and its weights)",
        (REGISTRY_RESUME,)),  # not RUNS_SIGKILL's: its best epoch is its last, so nothing forgotten is missed
    # --- honest selection: validation carved from the training split, disjoint from what trains
    Bug("validation-overlaps-training", "ucmfh/selection.py",
        "return np.flatnonzero(~member), np.flatnonzero(member)",
        "return np.arange(len(keys)), np.flatnonzero(member)",
        "validation_items leaves the validation items in the training part too",
        ("tests/test_train.py",)),
    Bug("two-tower-trains-on-validation", "ucmfh/methods/two_tower.py",
        "        train = setup.rest.to(device)\n",
        "        train = data.train.to(device)\n",
        "two-tower/distill train on the whole training split, validation items included",
        (REGISTRY_HELD_OUT, "tests/methods/test_methods.py", "tests/test_train.py")),
    Bug("ucmfh-trains-on-validation", "ucmfh/methods/ucmfh.py",
        "        train = setup.rest.to(device)\n",
        "        train = data.train.to(device)\n",
        "ucmfh's hashing stage trains on the whole training split, validation items included",
        (REGISTRY_HELD_OUT, "tests/methods/test_methods.py", "tests/test_train.py")),
    Bug("two-tower-validates-on-query", "ucmfh/methods/two_tower.py",
        "validate=validator(*validation_view(cfg), model, setup.val, setup.rest, device)",
        "validate=validator(*validation_view(cfg), model, data.query, setup.rest, device)",
        "two-tower/distill pick their epoch on the query (test) split",
        (REGISTRY_HELD_OUT, "tests/methods/test_methods.py", "tests/test_train.py")),
    # --- identity of a run
    Bug("run-identity-ignores-amp", "ucmfh/config.py",
        'NOT_IDENTITY = ("device",)',
        'NOT_IDENTITY = ("device", "amp")',
        "--amp is left out of a run's identity: a bf16 run reuses the float32 run's checkpoint",
        ("tests/app/test_runs.py::test_every_setting_is_part_of_a_runs_identity",)),
    # --- SEPS: which dense description a pair's score sees
    Bug("seps-leak-mode-no-leak", "ucmfh/seps/model.py",
        "each caption's image\")\n            state.update(self._words(dense_words, dense_mask, \"dense\"))",
        "each caption's image\")\n            state.update(self._words(words, mask, \"dense\"))",
        "dense_text='leak' (the reference's reproduction mode) uses the caption itself, not its image's description",
        ("tests/seps/test_seps.py",)),
    # --- plots
    Bug("pr-plot-draws-nothing", "ucmfh/metrics/plots.py",
        'curve = res.get(name, {}).get("pr_curve")',
        'curve = res.get(name, {}).get("pr")',
        "the precision-recall plot reads a wrong key and draws no curve",
        ("tests/test_codes.py",)),
    Bug("pk-plot-draws-nothing", "ucmfh/metrics/plots.py",
        'pk = res.get(name, {}).get("precision_at_k")',
        'pk = res.get(name, {}).get("precision_at")',
        "the precision@K plot reads a wrong key and draws no curve",
        ("tests/test_codes.py",)),
    # --- re-ranking order
    Bug("rerank-step-reversed", "ucmfh/search/rerank.py",
        "order = np.lexsort((positions, -scores), axis=1)[:, :k]",
        "order = np.lexsort((positions, scores), axis=1)[:, :k]",
        "the re-ranking step (`ucmfh search --rerank` and `ucmfh rerank`) puts the least similar candidates first",
        ("tests/search/test_search.py", "tests/search/test_search_cli.py", "tests/seps/test_seps.py")),
    Bug("two-stage-cosine-features-twice", "ucmfh/two_stage.py",
        'real = hasher.head_outputs(img, txt, "unimodal")\n',
        "real = hasher.logits(*hasher.inputs(img, txt))\n",
        "`ucmfh rerank`'s cosine stage centres and normalises the features twice (the defect this test found)",
        ("tests/search/test_search_seps.py",)),
    # --- tie-aware metrics (docs/evaluation.md)
    Bug("expected-ap-whole-normaliser", "ucmfh/metrics/ties.py",
        "denom = (cut_before_r + xs).double()",
        "denom = cut_before_r.double()",
        "expected AP@K divides by the whole groups' relevant items only, not R + x",
        ("tests/metrics/test_ties.py",)),
    Bug("hit-probability-cut-as-whole", "ucmfh/metrics/ties.py",
        "whole = ((taken == n) & (n > 0) & (r > 0)).any(dim=1)",
        "whole = ((taken > 0) & (n > 0) & (r > 0)).any(dim=1)",
        "hit_probability treats the group the cut splits as if it were whole (a sure hit)",
        ("tests/metrics/test_ties.py",)),
    Bug("one-ranking-ap-past-k", "ucmfh/metrics/ranking.py",
        'parts["index"]["ap"].append(average_precision_ranked(listed[:, :k]))',
        'parts["index"]["ap"].append(average_precision_ranked(listed))',
        "the one cosine ranking of every figure (scores_by_rule) scores AP over its lists' whole depth, R@10's "
        "where k is smaller, not over the first k",
        ("tests/metrics/test_ties.py",)),
    Bug("one-ranking-hits-one-late", "ucmfh/metrics/ranking.py",
        "cols = torch.tensor([min(r, n) - 1 for r in ks]",
        "cols = torch.tensor([min(r + 1, n) - 1 for r in ks]",
        "the one cosine ranking of every figure counts a hit among the first R + 1 items as one among the first R",
        ("tests/metrics/test_ties.py",)),
    Bug("bootstrap-fixed-queries", "ucmfh/metrics/intervals.py",
        "queries = rng.integers(0, p.shape[1], (b, p.shape[1]))",
        "queries = np.broadcast_to(np.arange(p.shape[1]), (b, p.shape[1]))",
        "paired_bootstrap resamples the seeds but not the queries",
        ("tests/app/test_compare.py",)),
    # --- UCMFH's settings as docs/reference.md states them
    Bug("ucmfh-adam-betas", "ucmfh/config.py",
        "    lr_head: float = 1e-3\n    betas: tuple = (0.5, 0.999)",
        "    lr_head: float = 1e-3\n    betas: tuple = (0.9, 0.999)",
        "the hashing stage's Adam betas become torch's default (0.9, 0.999), not UCMFH's (0.5, 0.999)",
        ("tests/test_reference.py",)),
    Bug("ucmfh-head-dropout", "ucmfh/config.py",
        "    dropout: float = 0.3\n",
        "    dropout: float = 0.1\n",
        "the hash head's dropout default becomes 0.1, not UCMFH's 0.3",
        ("tests/test_reference.py",)),
    # --- only the training split may shape a model
    Bug("cca-itq-fits-retrieval", "ucmfh/methods/cca_itq.py",
        "        model, filled = fit_cca_itq(data.train, cfg.n_bits,",
        "        model, filled = fit_cca_itq(data.retrieval, cfg.n_bits,",
        "cca-itq fits its PCA, CCA and ITQ rotation on the retrieval split, not the training split",
        (TRAIN_ONLY,)),
    Bug("fusion-trains-on-query-items", "ucmfh/fusion_stage.py",
        "        train = setup.rest.to(device)\n",
        "        rest = setup.rest\n"
        "        train = type(rest)(*(None if a is None else torch.cat([a, b[:8]]) for a, b in zip(\n"
        "            (rest.img, rest.txt, rest.labels, rest.ids),\n"
        "            (data.query.img, data.query.txt, data.query.labels, data.query.ids)))).to(device)\n",
        "the fusion stage trains on its training part plus 8 query items",
        (TRAIN_ONLY,)),
    Bug("feature-hasher-centred-on-retrieval", "ucmfh/methods/base.py",
        "        model.fit_feature_stats(setup.rest.img, setup.rest.txt)",
        "        model.fit_feature_stats(data.retrieval.img, data.retrieval.txt)",
        "the feature hashers' centring means (Method.initial_model) are fitted on the retrieval split",
        (TRAIN_ONLY,)),
    # --- results rows, atomic writes, no crash behind a passing test
    Bug("expected-twins-by-index", "ucmfh/evaluation.py",
        '        for row, twin in zip(rows, by_rule["expected"]):',
        '        for row, twin in zip(rows, by_rule["index"]):',
        "a results row's tie-aware twins (*_expected, what 'ucmfh runs' and 'ucmfh compare' lead with) and its "
        "per-query file are scored with ties by index",
        ("tests/metrics/test_results_row.py",)),
    Bug("cosine-ties-rightmost", "ucmfh/metrics/topk.py",
        "    width = torch.arange(m, 0, -1, device=scores.device)  # m - column\n",
        "    width = torch.arange(1, m + 1, device=scores.device)  # m - column\n",
        "a cosine top-k list cut inside a run of tied scores keeps the run's last items, not its first (ties by index)",
        ("tests/metrics/test_metrics.py",)),
    Bug("checkpoint-written-in-place", "ucmfh/checkpoint.py",
        "    with atomic_binary(path) as f:\n        torch.save(payload, f)\n",
        "    torch.save(payload, path)\n",
        "a checkpoint is written in place: a write that stops halfway leaves neither the old checkpoint nor the new",
        ("tests/test_atomic_writes.py",)),
    Bug("training-state-written-in-place", "ucmfh/training_state.py",
        '    with atomic_binary(path) as f:\n        torch.save({"format": STATE_FORMAT, **payload}, f)\n',
        '    torch.save({"format": STATE_FORMAT, **payload}, path)\n',
        "the training state is written in place: a save that stops halfway loses the state a resume needs",
        ("tests/test_atomic_writes.py",)),
    Bug("index-manifest-written-in-place", "ucmfh/search/folder.py",
        "            write_json_atomic(os.path.join(self.path, MANIFEST), self._manifest_from_disk())",
        '            with open(os.path.join(self.path, MANIFEST), "w") as f:\n'
        "                json.dump(self._manifest_from_disk(), f, indent=1, sort_keys=True)",
        "an append commits its rows by writing the index manifest in place: a commit cut short leaves no index",
        ("tests/test_atomic_writes.py",)),
    Bug("results-row-glued-to-a-cut-row", "ucmfh/files.py",
        'lines[0] = b"\\n" + lines[0]',
        "lines[0] = lines[0]",
        "a row appended after one cut short (a killed writer's) continues that line: a reader skips both",
        ("tests/test_atomic_writes.py",)),
    Bug("search-gone-checkpoint-crashes", "ucmfh/app/search_cli.py",
        'raise FileNotFoundError(f"{path}: its checkpoint {recorded} is gone; give it with --checkpoint")',
        'assert False, f"{path}: its checkpoint {recorded} is gone; give it with --checkpoint"',
        "'ucmfh search' of an index whose checkpoint was moved ends in a traceback and exit 1, not one line, exit 2",
        ("tests/search/test_search_cli.py::test_user_errors_are_one_line",)),
    Bug("compare-different-queries-crashes", "ucmfh/app/compare.py",
        "            if a.shape != b.shape:\n                raise ValueError(",
        "            if a.shape != b.shape:\n                raise AssertionError(",
        "'ucmfh compare' of runs scored on different queries ends in a traceback and exit 1, not one line, exit 2",
        ("tests/app/test_compare.py::test_compare_says_what_is_missing",)),
    # --- equal widths, paired comparisons, shard order, resume after the best epoch
    # image and text features of one width (CLIP's 512 and 512): a head chosen by width takes the wrong modality
    Bug("feature-hasher-search-head-by-width", "ucmfh/models/hashing.py",
        "        if modality == \"img\":\n            return self.img_head(normalize(x - self.img_mean))\n"
        "        return self.txt_head(normalize(x - self.txt_mean))",
        "        head = self.img_head if x.shape[-1] == self.d_img else self.txt_head\n"
        "        return head(normalize(x - (self.img_mean if modality == \"img\" else self.txt_mean)))",
        "FeatureHasher.modality_logits (index and search) picks the head by the features' width: with equal "
        "widths texts are hashed by the image head",
        ("tests/models/test_models.py", "tests/search/test_search.py", REGISTRY_LEAK)),
    Bug("feature-hasher-text-head-by-width", "ucmfh/models/hashing.py",
        "        img, txt = self.inputs(img, txt)\n        return self.img_head(img), self.txt_head(txt)",
        "        img, txt = self.inputs(img, txt)\n"
        "        return self.img_head(img), (self.img_head if txt.shape[-1] == self.d_img else self.txt_head)(txt)",
        "FeatureHasher.logits (training and every code) picks the text head by width: with equal widths the "
        "image head codes the texts",
        ("tests/models/test_models.py", "tests/search/test_search.py", REGISTRY_LEAK)),
    # the intervals of `ucmfh compare`: a difference paired by query (docs/evaluation.md)
    Bug("compare-unpaired", "ucmfh/app/compare.py",
        "paired_bootstrap([b - a for a, b in zip(",
        "paired_bootstrap([b[:, ::-1] - a for a, b in zip(",
        "`ucmfh compare` subtracts the base's scores from the other's queries reversed: the means stay, the "
        "interval and its verdict are those of an unpaired comparison",
        ("tests/app/test_compare.py",)),
    # extraction shards merged: chunk 10 after chunk 9, chunk 100 after chunk 99
    Bug("shard-merge-string-order", "ucmfh/data/scratch.py",
        "    parts = [scratch.load(kind, c) for c, _, _ in chunks(n_items, chunk_items)]",
        "    parts = [scratch.load(kind, c) for c in sorted((c for c, _, _ in chunks(n_items, chunk_items)), key=str)]",
        "an extraction's merge reads its chunks in string order (chunk 10 before chunk 2): rows past the tenth "
        "chunk hold other items' features",
        ("tests/data/test_extract_shards.py",)),
    Bug("shard-merge-two-digit-order", "ucmfh/data/scratch.py",
        "    parts = [scratch.load(kind, c) for c, _, _ in chunks(n_items, chunk_items)]",
        "    parts = [scratch.load(kind, c) for c in sorted((c for c, _, _ in chunks(n_items, chunk_items)),\n"
        "                                                     key=lambda c: f\"{c:02d}\")]",
        "an extraction's merge sorts its chunks by two-digit names: past 100 chunks, chunk 100 comes before 11",
        ("tests/data/test_extract_shards.py",)),
    # the captured step (a CUDA graph replayed): each full batch's inputs must reach the graph's static batch
    Bug("captured-step-replays-the-first-batch", "ucmfh/captured_step.py",
        "        self.static.index.copy_(batch.index)\n", "",
        "a captured step replays the batch it was captured on, not the batch of the step",
        ("tests/test_captured_step.py",)),
    Bug("captured-step-keeps-its-first-modality-dropout", "ucmfh/captured_step.py",
        "            self.static.separate.copy_(batch.separate)\n", "            pass\n",
        "a captured fusion step replays the modality-dropout draws of the batch it was captured on",
        ("tests/test_captured_step.py",)),
    Bug("captured-step-keeps-its-first-negatives", "ucmfh/captured_step.py",
        "            self.static.draws.copy_(batch.draws)\n", "            pass\n",
        "a captured UCCH step replays the negatives drawn for the batch it was captured on",
        ("tests/test_captured_step.py",)),
    Bug("captured-step-beta-never-fed", "ucmfh/captured_step.py",
        "            self.static.scalars[name].fill_(value)\n", "            pass\n",
        "a captured step's β (DJSRH's, JDSH's, by epoch or iteration) is never fed to the graph",
        ("tests/test_captured_step.py",)),
    Bug("captured-step-not-recaptured-for-held-values", "ucmfh/captured_step.py",
        "        if self.replay is None or held != self.held:\n", "        if self.replay is None:\n",
        "a captured step keeps the learning rate and scalars it was captured with when they change",
        ("tests/test_captured_step.py",)),
    # runs side by side in threads: each run's draws its own, the caller's generators as they were
    Bug("run-draws-restart-every-step", "ucmfh/run_draws.py",
        "                finally:\n                    self.state = torch.default_generator.get_state()\n",
        "                finally:\n",
        "a run side by side draws from where its set-up left its state at every step (the same dropout each step)",
        ("tests/test_run_draws.py",)),
    Bug("run-set-up-without-the-lock", "ucmfh/run_draws.py",
        "    with _LOCK if _ON[0] else _NOTHING:\n", "    with _NOTHING:\n",
        "a run's set-up (seeds, plan, initial weights) may interleave with another run's steps",
        ("tests/test_run_draws.py",)),
    Bug("run-leaves-the-cpu-generator-moved", "ucmfh/run_draws.py",
        "                torch.set_rng_state(cpu)\n", "",
        "a fit leaves torch's CPU generator where its own draws left it, not as the caller had it",
        ("tests/test_run_draws.py",)),
    Bug("side-by-side-draws-interleave", "ucmfh/side_by_side.py",
        "    with separate_draws(), stop_on_signals() as stop,", "    with stop_on_signals() as stop,",
        "candidates trained side by side draw each other's numbers",
        ("tests/test_side_by_side.py",)),
    Bug("side-by-side-error-leaves-the-other-training", "ucmfh/side_by_side.py",
        "                stop_threads(signal.SIGTERM, threads)\n", "                pass\n",
        "a candidate's error leaves the other candidate training to its end",
        ("tests/test_side_by_side.py",)),
    Bug("scoring-leaves-the-model-in-eval-mode", "ucmfh/utils.py",
        "            module.training = training\n", "            pass\n",
        "scoring a model mid-training leaves it in eval mode (its dropout off for the epochs after)",
        ("tests/test_cuda_standin.py",)),
    # UCMFH's released start (2026-11-30): its fresh encoder, and the keys of the runs recorded before it
    Bug("ucmfh-random-start-unstandardised", "ucmfh/methods/ucmfh.py",
        "            model.fusion.fit_feature_stats(setup.rest.img, setup.rest.txt)\n", "",
        "fusion_start=random builds its encoder without fitting the input standardisation on the training split",
        ("tests/methods/test_methods.py::"
         "test_ucmfh_starts_on_a_fusion_encoder_of_random_weights_as_its_release_does",)),
    Bug("ucmfh-random-start-trains-task-0-first", "ucmfh/app/experiment.py",
        '        prepare=lambda: load_or_train_fusion(data, run, opts, log)[0] if takes == "encoder" else\n'
        '        run.fusion_cfg if takes == "config" else None,\n',
        '        prepare=lambda: (load_or_train_fusion(data, run, opts, log), run.fusion_cfg)[1] if takes == "config" '
        'else load_or_train_fusion(data, run, opts, log)[0] if takes == "encoder" else None,\n',
        "fusion_start=random still trains the fusion stage first (its epochs wasted, a fusion.pt left)",
        ("tests/app/test_cli.py::test_ucmfh_as_released_trains_no_fusion_stage_from_either_front_door",)),
    Bug("params-added-later-change-keys", "ucmfh/config.py",
        "            if params.get(name) == before:\n                del params[name]\n",
        "            pass\n",
        "a method parameter added later (fusion_start) enters every run's identity: recorded runs lose their keys",
        ("tests/test_config.py::test_a_method_parameter_added_later_keeps_the_runs_recorded_before",)),
    Bug("gumbel-selection-ignores-noise", "ucmfh/seps/model.py",
        "        top = noisy.topk(k, dim=-1)\n", "        top = score.topk(k, dim=-1)\n",
        "SEPS gumbel keeps the scores' own top K whatever the noise (the noise reaches the gradient alone)",
        ("tests/seps/test_seps.py::"
         "test_gumbel_keeps_a_sample_of_the_patches_while_training_and_the_top_k_in_evaluation",)),
    Bug("lost-interrupt-dropped", "ucmfh/signals.py",
        "        send_again(signum)\n", "        pass\n",
        "an interrupt raised inside a weakref callback is dropped: the command goes on to exit 0 after SIGTERM",
        ("tests/app/test_user_files.py::test_a_sigterm_python_drops_in_a_callback_still_ends_the_command",)),
    Bug("signal-after-the-work-aborts", "ucmfh/app/cli.py",
        "            work_over()\n", "            pass\n",
        "a Ctrl-C once a command's work is over makes click say 'Aborted!' and exit 1; a SIGTERM kills it silently",
        ("tests/app/test_cli.py::test_a_signal_once_the_command_s_work_is_over_ends_it_with_its_output_whole",)),
    Bug("synthetic-made-twice", "ucmfh/app/environment.py",
        "            if os.path.exists(path):\n                return path\n            make_synthetic(path)\n",
        "            make_synthetic(path)\n",
        "two commands started together make the synthetic set twice, and the second is refused after the work",
        ("tests/data/test_data.py::"
         "test_the_synthetic_set_made_by_another_command_meanwhile_is_read_not_made_again",)),
    Bug("index-builds-side-by-side", "ucmfh/search/build.py",
        "            held.enter_context(locked(out, hidden=True, wait=False))\n", "            pass\n",
        "two builds of one index folder run at once: each refuses the other's rows, one deletes the folder",
        ("tests/search/test_search.py::test_a_build_beside_another_of_its_folder_is_refused_before_it_writes",)),
    Bug("temporary-file-of-another-machine-removed", "ucmfh/files.py",
        "    if match.group(3) in (None, _machine()):", "    if True:",
        "a container's temporary file is taken for a dead process's by a writer on its host, and removed mid-write",
        ("tests/test_atomic_writes.py::test_a_temporary_file_of_another_machine_is_left_until_untouched_for_a_day",)),
    Bug("older-rows-collapse-unsaid", "ucmfh/app/runs.py",
        "    if any(g.get(\"unchecked_seeds\") for g in groups):\n        lines.append(UNCHECKED_NOTE)\n", "",
        "rows of an older ucmfh, which counted no distinct codes, sit unmarked in a table without a word",
        ("tests/app/test_runs.py::test_collapsed_codes_are_said_and_recorded",)),
    Bug("resume-misses-a-nested-older-state", "ucmfh/app/stage.py",
        "    if mine.startswith(\"hash-\"):\n", "    if False:\n",
        "--resume after an upgrade says ucmfh's hashing stage was never started, its state under the old fusion key",
        ("tests/app/test_runs.py::test_resume_with_nothing_saved_names_the_stages_of_older_keys_nested_ones_too",)),
    Bug("register-takes-unknown-defaults", "ucmfh/methods/registry.py",
        "        if unknown:\n            raise ValueError(f\"method {cls.name!r}: its {attr} name",
        "        if False:\n            raise ValueError(f\"method {cls.name!r}: its {attr} name",
        "a method whose defaults misspell a setting is registered, and fails once a run starts",
        ("tests/methods/test_plugins.py::test_a_method_the_lifecycle_could_not_run_is_refused_when_registered",)),
    Bug("index-drops-an-id-s-other-images", "ucmfh/search/build.py",
        "            if modality == \"img\" and one_image is not None:\n"
        "                one_image.check(x, start, coll)\n",
        "",
        "an id of several images is indexed as its first image, the others dropped without a word",
        ("tests/search/test_search.py::"
         "test_an_id_of_several_images_and_labels_of_other_values_are_refused_and_the_index_left",)),
    Bug("caption-set-numbered-by-caption", "ucmfh/data/h5.py",
        "    if 2 * int(several.sum()) > len(ids):\n", "    if False:\n",
        "a caption set whose ids number its captions, not its images, passes validation",
        ("tests/data/test_data.py::test_validation_names_file_dataset_and_problem",)),
    Bug("codes-query-ids-in-database", "ucmfh/codes.py",
        "        if labels[\"query\"] is None:  # a caption set's relevance is the id: a query item found as a "
        "database one\n",
        "        if False:\n",
        "a caption set's codes file whose query ids are its database's scores as found (rSum 600)",
        ("tests/test_codes.py::test_load_errors_name_file_dataset_problem",)),
    Bug("grid-parses-the-whole-file-a-cell", "ucmfh/app/table.py",
        "    mine = [json.dumps(key) for key in keys] if all(isinstance(key, str) for key in keys) else None\n",
        "    mine = None\n",
        "a grid parses the whole results file after every cell to find the cell's rows (14 s a cell at 100,000 rows)",
        ("tests/app/test_grid.py::test_a_cell_s_rows_are_looked_for_among_the_lines_naming_its_run_alone",)),
    Bug("grid-holds-every-row", "ucmfh/app/grid.py",
        "on_skip=warn, containing=[json.dumps(key_of(run.hash_identity))",
        "on_skip=warn, containing=None and [json.dumps(key_of(run.hash_identity))",
        "a grid reads and holds every row of a lab's results file to learn which of its cells are finished (1.3 GB)",
        ("tests/app/test_grid.py::test_a_grid_reads_the_rows_of_its_own_cells_alone",)),
    Bug("compare-drops-unpaired-cells-unsaid", "ucmfh/app/compare.py",
        "    if out and unpaired:", "    if False:",
        "a dataset of both methods without a seed of both vanishes from compare's table without a word",
        ("tests/app/test_compare.py::test_compare_pairs_each_query_with_itself_which_can_change_the_verdict",)),
    Bug("compare-hides-settings-beyond-defaults", "ucmfh/app/compare.py",
        "        if defaults:  # a run cut short", "        if False:  # a run cut short",
        "a two-tower of 3 epochs sits behind CCA-ITQ in compare's table, nothing saying it was cut short",
        ("tests/app/test_compare.py::test_a_run_beyond_its_method_s_defaults_is_said_beside_the_comparison",)),
    Bug("metrics-refused-after-the-search", "ucmfh/app/search_cli.py",
        "    if with_metrics:  # before the search", "    if False:  # before the search",
        "search --metrics of queries from none of a grown index's files fails after the whole search",
        ("tests/search/test_search_cli.py::"
         "test_queries_of_no_file_of_a_grown_index_are_refused_metrics_before_the_search",)),
    Bug("rerank-blocks-misnumber-scanned-queries", "ucmfh/search/results.py",
        "first + np.asarray(value)", "np.asarray(value)",
        "a cosine re-ranking a block of queries at a time says the scan served the first block's queries again",
        ("tests/search/test_search.py::test_search_queries_refuses_other_checkpoints_dims_and_extractors",)),
    Bug("candidate-bars-unnumbered", "ucmfh/methods/base.py",
        "        shown = f\"{name}, candidate {names.index(name) + 1} of {len(names)}\" if len(names) > 1 else name\n",
        "        shown = name\n",
        "the default's second candidate's bar starts without a word of it being the second of two",
        ("tests/app/test_cli.py::test_a_run_of_several_candidates_says_how_many_trainings_and_each_bar_which_it_is",)),
    Bug("pk-axis-as-mathtext", "ucmfh/metrics/plots.py",
        "        ax.xaxis.set_major_formatter(ticker.FuncFormatter(", "        (lambda _: None)(ticker.FuncFormatter(",
        "precision@K's K axis drawn as raw '$\\mathdefault{10^{1}}$' text, overlapping (mathtext off for names)",
        ("tests/test_codes.py::test_precision_at_k_plot_stops_at_the_retrieval_set_size",)),
    Bug("recall-percent-after-division", "ucmfh/metrics/ap.py",
        "math.fsum(r) * scale / len(r) for r", "math.fsum(r) / len(r) * scale for r",
        "R@K of 55 hits in 100 queries is 55.00000000000001 %",
        ("tests/metrics/test_captions.py::test_a_recall_of_whole_hits_is_their_share_in_percent_to_the_last_digit",)),
    Bug("protocol-typo-dropped", "ucmfh/methods/settings.py",
        '    if given.get("protocol", PROTOCOLS[0]) not in PROTOCOLS:', "    if False:",
        "hash_config(protocol='fuse') returns a config, the typo dropped without a word",
        ("tests/methods/test_settings.py::test_hash_config_is_one_code_length_of_stage_configs",)),
    Bug("torchrun-runs-evaluate-on-every-rank", "ucmfh/app/cli.py",
        "    if problem:\n        raise UserError(problem)\n", "",
        "under torchrun each rank runs evaluate or rerank whole and appends its rows (a row as many times as ranks)",
        ("tests/test_distributed.py::test_a_command_of_one_process_is_refused_under_torchrun",)),
    Bug("rendezvous-deaf-to-signals", "ucmfh/app/environment.py",
        "signal.signal(s, signal.SIG_DFL) for s in", "signal.getsignal(s) for s in",
        "a rank waiting for peers that never come ignores SIGTERM and SIGINT (killed with -9 alone)",
        ("tests/test_distributed.py::test_a_rank_waiting_for_its_peers_says_so_and_a_signal_ends_it",)),
    Bug("encode-exists-before-input", "ucmfh/app/outputs.py",
        "            if not folder:  # an input first",
        "            if flag in new and not overwrite and os.path.exists(path):\n"
        "                raise FileExistsError(f\"{path}: exists; not replaced\")\n            if not folder:  # an input first",
        "encode -o CHECKPOINT says 'pass --overwrite', which then refuses it as an input",
        ("tests/app/test_user_files.py::test_an_output_that_is_an_input_is_refused_even_with_overwrite",)),
    Bug("runs-reads-with-collector-on", "ucmfh/files.py",
        "    with f, _no_cycle_collection(), locked(", "    with f, locked(",
        "reading a lab's 100,000-row results file walks every row at each collection (24 s, where 8 s do)",
        ("tests/test_atomic_writes.py::test_a_read_pauses_the_cycle_collector_and_leaves_it_as_it_was",)),
    Bug("extract-scratch-blind-to-image-changes", "ucmfh/data/extract.py",
        "files=lambda start, stop: file_states(paths[start:stop]), names=names)", "names=names)",
        "an image replaced since an extraction keeps its old feature: its finished chunk is reused",
        ("tests/data/test_extract.py::test_a_chunk_whose_image_changed_since_is_computed_again_and_said",)),
    Bug("extract-16-bit-clipped", "ucmfh/data/clip_encoder.py",
        '    if im.mode in _SIXTEEN_BIT or im.mode == "I":', '    if im.mode == "I;16 never":',
        "16-bit grey images are converted by PIL alone: every value over 255 white",
        ("tests/data/test_extract.py::test_an_image_is_loaded_as_a_viewer_shows_it",)),
    Bug("captions-json-last-key-wins", "ucmfh/data/annotations.py",
        "json.loads(text, object_pairs_hook=once_each)", "json.loads(text)",
        "a JSON captions file naming an image twice keeps its last captions alone, without a word",
        ("tests/data/test_extract.py::test_input_mismatches_name_file_and_problem",)),
    Bug("writer-nul-in-strings", "ucmfh/data/writer.py",
        'nul = next((i for i, v in enumerate(values) if "\\0" in v), None)', "nul = None",
        "a caption with a NUL ends write_dataset in h5py's traceback",
        ("tests/data/test_data.py::test_captions_and_image_paths_are_written_for_search_to_show",)),
    Bug("search-page-bidi-raw", "ucmfh/search/html.py",
        "    return html.escape(printable(str(text)))", "    return html.escape(str(text))",
        "a caption's U+202E reaches the search page raw, turning the text after it",
        ("tests/search/test_search.py::test_an_image_query_without_a_path_is_shown_by_its_paired_text_and_no_text_"
         "turns_the_page",)),
    Bug("forest-every-row-whole", "ucmfh/app/forest_plot.py",
        "    shared = [part for part in rows[0][0] if all(part in cell for cell, _ in rows[1:])] if rows else []",
        "    shared = []",
        "compare --plot repeats the dataset's name on every row, the labels pushed past the figure's edge",
        ("tests/app/test_forest_plot.py",)),
    Bug("program-torn-down", "ucmfh/signals.py",
        "    _exit_flushed(status)\n", "    sys.exit(status)\n",
        "a finished command goes through the interpreter's teardown, where a signal kills it (-2, -15)",
        ("tests/app/test_cli.py::test_a_program_ends_without_the_interpreter_s_teardown_where_a_signal_killed_it",)),
    Bug("signal-raised-inside-torch-import", "ucmfh/signals.py",
        "            spec.loader.exec_module = held  # this spec's loader alone", "            pass",
        "a Ctrl-C while torch imports is raised inside its pybind11 calls: SIGABRT, 'terminate called after ...'",
        ("tests/app/test_cli.py::test_a_signal_while_torch_imports_is_raised_once_the_import_is_done",)),
    Bug("extract-batch-holds-decoded-photos", "ucmfh/data/extract.py",
        'prepare = getattr(encoder, "prepare_image", None)', "prepare = None",
        "a batch of camera photos is held decoded until the processor runs (11 GB at batch 64)",
        ("tests/data/test_extract.py::test_each_image_is_made_the_model_s_input_as_it_is_read_with_the_same_"
         "features",)),
    Bug("jdsh-thresholds-swapped", "ucmfh/methods/jdsh.py",
        '        left = p["loc_left"] - p["k_left"] * p["scale_left"]',
        '        left = p["loc_left"] - p["k_right"] * p["scale_left"]',
        "JDSH's left DSDW threshold takes the right one's width (BETA for ALPHA)",
        ("tests/methods/test_method_jdsh.py::test_the_target_matches_the_released_loops",)),
    Bug("cirh-image-code-inputs-swapped", "ucmfh/methods/cirh.py",
        "self.head_img(torch.cat([g_img, v_joint], 1))", "self.head_img(torch.cat([v_joint, g_img], 1))",
        "CIRH's image code reads the joint features where the release's MyNet reads the image graph's, and back",
        ("tests/methods/test_method_cirh.py::test_the_network_is_the_released_mynet_output_for_output",)),
    Bug("convert-one-based-split-unsaid", "ucmfh/data/convert.py",
        'subtract 1)" if lowest >= 1 else ""', 'subtract 1)" if lowest >= 1 and False else ""',
        "a split index numbered from 1 (MATLAB's) shifts every row by one, unsaid",
        ("tests/data/test_convert.py::test_split_rows_numbered_from_1_are_said",)),
    Bug("convert-one-label-column-accepted", "ucmfh/data/convert.py",
        "    if labels.shape[1] == 1:\n", "    if False:\n",
        "one 0/1 label column is converted: one class, every MAP 1, half the rows dropped",
        ("tests/data/test_convert.py::test_labels_not_a_multi_hot_matrix_are_refused_by_row_and_column",)),
    Bug("convert-image-matrix-as-text", "ucmfh/data/convert.py",
        "np.array_equal(first, txt_src.read(0, head))", "False",
        "the image matrix given as the text matrix too is converted",
        ("tests/data/test_convert.py::test_a_matrix_given_twice_or_transposed_is_named",)),
    Bug("convert-torch-archive-as-pickle", "ucmfh/data/safe_pickle.py",
        'archive = f.read(4) == b"PK\\x03\\x04"', "archive = False",
        "a torch.save archive named .pkl is 'not a readable pickle, truncated or damaged'",
        ("tests/data/test_convert.py::test_a_torch_save_archive_under_a_pickle_s_name_is_read",)),
    Bug("convert-copies-across-splits-no-remedy", "ucmfh/data/h5.py",
        '"score", COPIES_ONE_ID)', '"score")',
        "copies across query and retrieval refused without the --ids that keeps them in one split",
        ("tests/data/test_convert.py::test_convert_s_refusals_name_the_flags_and_the_way_forward",)),
    Bug("command-import-unguarded", "ucmfh/app/cli.py",
        "with imports_of_a_program():  # a program ends at once",
        "with import_module('contextlib').nullcontext():  # a program ends at once",
        "a signal while a command's module imports is raised inside it: a class body's RuntimeError, exit 1",
        ("tests/app/test_cli.py::test_a_signal_while_a_program_imports_ends_it_at_once_in_one_line",)),
    Bug("stderr-full-error-exit-lost", "ucmfh/app/errors.py",
        "        except OSError:\n            return len(text)\n", "        except OSError:\n            raise\n",
        "an error said to a standard error that cannot take it (2>/dev/full) ends exit 1, not its own 2",
        ("tests/app/test_cli.py::test_an_error_said_to_a_standard_error_that_cannot_take_it_keeps_its_exit",)),
    Bug("grid-signal-at-shutdown-forgotten", "ucmfh/app/jobs.py",
        '            signum = signum or stop["signal"]  # one heard after the last cell ended', "            # ",
        "a SIGTERM as grid's workers shut down after the last cell is heard, then forgotten: exit 0, unsaid",
        ("tests/app/test_jobs.py::test_a_signal_as_the_grid_s_workers_shut_down_is_said",)),
    Bug("warning-said-by-every-rank", "ucmfh/app/errors.py",
        "    if process_rank():\n        return\n    click.echo(f\"warning", "    click.echo(f\"warning",
        "under torchrun every rank says each warning",
        ("tests/test_distributed.py::test_under_torchrun_a_warning_is_said_by_rank_0_alone",)),
    Bug("program-imports-unguarded", "ucmfh/signals.py",
        "    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)\n",
        "    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)\n",
        "a signal while a program imports is raised where it lands: inside a class body a traceback, exit 1",
        ("tests/app/test_cli.py::test_a_signal_while_a_program_imports_ends_it_at_once_in_one_line",)),
    Bug("convert-zero-rows-the-same-matrix", "ucmfh/data/convert.py", "np.ptp(first) > 0 and ", "",
        "rows of zeros in both image and text are called the image matrix given twice",
        ("tests/data/test_convert.py::test_a_matrix_given_twice_or_transposed_is_named",)),
    Bug("convert-any-split-suffix-a-split-file", "ucmfh/data/arrays.py", "if len(stem) > 1 for n in stem",
        "if len(stem) > 0 for n in stem",
        "a .mat holding 'feats' and 'idx_test' is called a split's matrices, its --image-key remedy lost",
        ("tests/data/test_convert.py::test_convert_s_refusals_name_the_flags_and_the_way_forward",)),
    Bug("standard-split-sizes-as-flags", "ucmfh/app/data_cli.py",
        "if standard_split is None or len(typed) == len(err.settings):", "if True:",
        "--standard-split's sizes refused as flags never typed (--query 2000)",
        ("tests/data/test_convert.py::test_convert_s_refusals_name_the_flags_and_the_way_forward",)),
    Bug("npz-named-pkl-as-torch-archive", "ucmfh/data/safe_pickle.py", "    if not torch_made:\n",
        "    if False:\n", "an .npz named .pkl is 'a torch.save archive, not readable (RuntimeError ...)'",
        ("tests/data/test_convert.py::test_a_torch_save_archive_under_a_pickle_s_name_is_read",)),
    Bug("glyph-filter-one-wording", "ucmfh/metrics/plots.py", "missing from (current )?font", "missing from font",
        "matplotlib < 3.9's glyph warnings ('missing from current font') printed at each drawing",
        ("tests/app/test_length_plot.py::test_matplotlib_s_glyph_warnings_are_left_to_the_one_line_a_figure_in_"
         "either_wording",)),
    Bug("cjk-width-as-len", "ucmfh/printable.py",
        'unicodedata.east_asian_width(c) in "WF"', "False",
        "a dataset named in Chinese slid the columns after it, on runs's and every result table",
        ("tests/app/test_runs.py::test_tables_keep_their_columns_under_a_chinese_dataset_name",)),
    Bug("code-width-unchecked", "ucmfh/methods/registry.py", "    check_code_width(cfg, model, data.train)\n", "",
        "a plugin's heads of 17 columns for 16 bits: trained, scored and recorded as 16-bit codes",
        ("tests/methods/test_plugins.py::test_a_model_of_another_width_than_the_bits_asked_for_is_refused",)),
    Bug("contested-name-first-wins", "ucmfh/methods/plugins.py",
        "                contested.setdefault(err.name, []).append(point.value)\n", "                pass\n",
        "two packages registering one name: the first loaded was the method, and its runs the other's",
        ("tests/methods/test_plugins.py::test_a_name_two_packages_register_is_neither_s",)),
    Bug("relaxation-for-any-method", "ucmfh/methods/settings.py", "elif not spec.takes_relaxation and (",
        "elif False and (", "--set hash.relaxation=sign for UCCH trained a new run identical to the default's",
        ("tests/methods/test_settings.py::test_a_relaxation_setting_for_a_method_that_relaxes_its_own_way_is_refused",)),
    Bug("loss-contract-traceback", "ucmfh/trainer.py",
        "            raise ValueError(f\"method {getattr(self.cfg, 'method', 'fusion')!r}: its plan's loss(batch)",
        "            raise TypeError(f\"method {getattr(self.cfg, 'method', 'fusion')!r}: its plan's loss(batch)",
        "a loss(batch) of the wrong shape ended train-hash in a traceback and exit 1",
        ("tests/methods/test_plugins.py::test_a_loss_that_is_not_one_number_is_one_line_of_the_command",)),
    Bug("rerank-reads-model-codes", "ucmfh/two_stage.py",
        "            self.img_codes, self.txt_codes = (sign_codes(x) for x in real)\n",
        "            self.img_codes, self.txt_codes = hasher.codes(img, txt, \"unimodal\")\n",
        "rerank's Hamming stage read the model's codes, where scores and the index read the signs of its outputs",
        ("tests/search/test_search_seps.py::test_the_measured_cosine_stage_is_the_search_users_run",)),
    Bug("grid-table-in-cwd", "ucmfh/app/grid.py", "        table = os.path.splitext(results)[0]\n",
        "        table = \"runs/grid\"\n",
        "a grid given --results and --out elsewhere wrote its table into ./runs/grid.md of wherever it started",
        ("tests/app/test_grid.py::test_the_table_goes_beside_the_results_named_after_them",)),
    Bug("write-keeps-its-view", "ucmfh/files.py",
        '    with atomic_file(path, replace) as tmp, open(tmp, "wb") as f, buffer.getbuffer() as view:\n        f.write(view)\n',
        '    with atomic_file(path, replace) as tmp, open(tmp, "wb") as f:\n        f.write(buffer.getbuffer())\n',
        "a full disk's error kept the view of the bytes beside their buffer: CPython 3.12.1's collector crashed",
        ("tests/test_atomic_writes.py::test_a_write_cut_short_releases_its_view_of_the_bytes",)),
    Bug("method-choice-at-import", "ucmfh/app/hashing_cli.py", "type=MethodChoice(),", "type=click.Choice(list(METHODS)),",
        "a method registered after the command's module was imported was refused as unknown",
        ("tests/methods/test_plugins.py::test_a_loss_that_is_not_one_number_is_one_line_of_the_command",)),
    Bug("cca-cross-product-not-deflated", "ucmfh/methods/cca_itq.py",
        "        c = c - np.outer(c @ y_w, q) - np.outer(p, x_w @ c) + (x_w @ c @ y_w) * np.outer(p, q)\n", "",
        "cca-itq's CCA kept XᵀY as it was after each component: its later directions were not scikit-learn's",
        ("tests/methods/test_methods.py::test_cca_is_scikit_learns_on_the_products_of_the_features",)),
    Bug("finished-grid-loads-datasets", "ucmfh/app/grid.py",
        "              if any(not rows for (name, _, _), rows in zip(cells, recorded_rows) if name == dataset)}\n",
        "              }\n",
        "a grid whose cells were all finished read every dataset again to print its table (5 s on full Flickr8k)",
        ("tests/app/test_grid.py::test_a_finished_grid_reads_no_dataset_to_print_its_table",)),
    Bug("grid-caption-set-leads-with-map", "ucmfh/app/grid.py",
        "        md += _main_table(cell, variants, bits, where, recall=bool(database))\n",
        "        md += _main_table(cell, variants, bits, where, recall=False)\n",
        "grid.md led a caption set with MAP by id, where 'ucmfh runs' and the figures lead with R@1 (rSum)",
        ("tests/app/test_grid.py::test_a_caption_set_s_recalls_and_a_collapse_reach_the_csv",)),
    Bug("build-ships-removed-modules", "setup.py", "            shutil.rmtree(stale)\n", "            pass\n",
        "a build in a checkout shipped the modules removed since an earlier build there (build/lib)",
        ("tests/test_packaging.py::test_a_build_ships_no_module_removed_since_an_earlier_build",)),
    Bug("sdist-ships-what-runs-left", "MANIFEST.in", "global-exclude *.lock *.pt *.pth *.h5 *.npz .*.tmp*\n", "",
        "an sdist built from a used checkout held the lock files, checkpoints and datasets runs left in tests/, "
        "docs/ and scripts/",
        ("tests/test_packaging.py::test_a_source_distribution_is_the_project_not_what_runs_leave_beside_it",)),
    Bug("distill-takes-lr-fusion", "ucmfh/methods/distill.py",
        '    fixed = {**TwoTower.fixed, "lr_fusion": HashConfig.lr_fusion}\n', "",
        "distill took --lr-fusion, which its frozen teacher never reads: the same model under another run identity",
        ("tests/app/test_cli.py::test_a_setting_the_library_refuses_is_refused_as_its_flag",)),
    Bug("grid-losses-dropped-silently", "ucmfh/app/grid.py", "    if losses and own_loss:\n", "    if False:\n",
        "grid --losses beside methods with a loss of their own ran their cells without a word (and a grid of them alone)",
        ("tests/app/test_grid.py::test_losses_for_methods_with_a_loss_of_their_own_are_said_not_applied_or_refused",)),
    Bug("closed-form-takes-epoch-options", "ucmfh/app/options.py", "    if not flags or not fitted:\n",
        "    if True:\n",
        "cca-itq took --tensorboard, --save-interval and --cuda-graph without a word: it trains no epoch",
        ("tests/app/test_grid.py::test_options_of_training_by_epochs_are_said_not_applied_to_a_method_fitted_in_closed_form",)),
    Bug("broken-pool-workers-wait", "ucmfh/app/jobs.py",
        "        if broken is not None and broken.value and not _IN_CELL[0]:\n", "        if False:\n",
        "a grid worker told its pool broke stayed between cells for ever: from Python 3.12 the grid waited on it",
        ("tests/app/test_jobs.py::test_a_worker_of_a_broken_pool_ends_once_its_cell_has_stopped",)),
    Bug("random-recall-unkept", "ucmfh/app/experiment.py",
        '        row.update({f"random_{key}": floor[key] for key in ("map_i2t", "map_t2i", "rsum", "recall_i2t", '
        '"recall_t2i")\n',
        '        row.update({f"random_{key}": floor[key] for key in ("map_i2t", "map_t2i", "rsum")\n',
        "a caption set's rows kept the random codes' rSum alone: its R@K figures drew no random line, grid.md none",
        ("tests/app/test_grid.py::test_a_caption_set_s_recalls_and_a_collapse_reach_the_csv",)),
    Bug("methods-epochs-else-as-ucmfh", "ucmfh/app/hashing_cli.py",
        '            own["epochs"] = f"{hash_config(name).epochs} on every dataset"\n', "            pass\n",
        "'ucmfh methods' said distill's epochs were ucmfh's (500 on MS-COCO), where it trains 100",
        ("tests/methods/test_methods.py::test_methods_lists_each_method_s_departures_and_what_it_fixes",)),
    Bug("grid-threads-by-cells-left", "ucmfh/app/jobs.py",
        "        return max(1, torch.get_num_threads() // max(1, self.jobs))\n",
        "        return max(1, torch.get_num_threads() // max(1, self.workers()))\n",
        "a --jobs grid resumed with fewer cells left than jobs trained them with more threads: other rows",
        ("tests/app/test_jobs.py::test_a_cell_left_alone_trains_with_the_threads_of_a_worker_of_the_jobs_asked_for",)),
    Bug("commit-of-an-edited-checkout", "ucmfh/app/identity.py",
        '    return "+dirty" if out.returncode == 0 and out.stdout.strip() else ""\n', '    return ""\n',
        "rows of a checkout with uncommitted edits to ucmfh/ named its commit alone, as if its figures were that commit's",
        ("tests/app/test_runs.py::test_a_row_s_commit_is_ucmfh_s_checkout_s_not_a_project_s_that_holds_an_installed_copy",)),
    Bug("checkpoint-draws-from-the-caller", "ucmfh/run_draws.py",
        "    with setting_up(), torch.random.fork_rng(devices=[]):\n", "    with setting_up():\n",
        "loading or saving a checkpoint moved the caller's torch generator (the empty model's initial weights)",
        ("tests/test_checkpoint.py::test_saving_and_loading_a_checkpoint_leave_the_caller_s_draws_as_they_were",)),
    Bug("faiss-threads-left-set", "ucmfh/search/approx.py", "        faiss.omp_set_num_threads(before)\n", "        pass\n",
        "a FAISS search with threads of its own left FAISS's OpenMP threads so for the rest of the process",
        ("tests/search/test_search_faiss.py::test_a_search_s_threads_leave_faiss_s_as_they_were",)),
    Bug("runs-clash-within-a-file-unsaid", "ucmfh/app/runs.py",
        "            if earlier is not None and _other_scores(earlier[1], row):  # compared only where a run comes "
        "again\n",
        "            if earlier is not None and earlier[0] != path and _other_scores(earlier[1], row):\n",
        "a run trained again into the same results file with other scores (other threads) replaced them silently",
        ("tests/app/test_runs.py::test_runs_summarises_over_seeds",)),
    Bug("fusion-threads-unsaid", "ucmfh/app/experiment.py",
        '            row["fusion_train_threads"] = fusion_threads\n', "            pass\n",
        "a hashing row on a fusion stage said the hashing stage's threads alone, not the encoder's",
        ("tests/app/test_cli.py::test_ucmfh_make_train_evaluate",)),
    Bug("resume-threads-unsaid", "ucmfh/app/stage.py", "        if before:\n", "        if False:\n",
        "a run stopped under one CPU thread count and resumed under another ended without a word",
        ("tests/app/test_runs.py::test_a_run_resumed_with_another_thread_count_says_so",)),
    Bug("threads-mixed-unsaid", "ucmfh/app/runs.py", "        if len(entry[\"mixed_threads\"]) < 2:\n",
        "        if True:\n",
        "a mean over seeds trained with other CPU thread counts was shown as one setting's without a word",
        ("tests/app/test_runs.py::test_a_mean_over_seeds_of_other_thread_counts_is_said",)),
    Bug("plots-backend-switched", "ucmfh/metrics/plots.py",
        "    matplotlib = require_matplotlib()\n",
        "    matplotlib = require_matplotlib()\n    matplotlib.use(\"Agg\")\n",
        "drawing one of ucmfh's figures switched a notebook's matplotlib backend to Agg (its figures no longer shown)",
        ("tests/test_codes.py::test_a_figure_drawn_from_a_notebook_leaves_its_matplotlib_as_it_was",)),
    Bug("fit-under-inference-mode", "ucmfh/trainer.py", "torch.inference_mode(False), torch.enable_grad():",
        "torch.enable_grad():",
        "a fit inside the caller's torch.inference_mode() failed, blaming its method's loss",
        ("tests/test_library.py::test_a_fit_refuses_what_trained_a_model_of_nan_or_was_ignored_and_takes_numpy_and_no_grad",)),
    Bug("fit-in-the-caller-s-dtype", "ucmfh/run_draws.py", "            torch.set_default_dtype(torch.float32)\n",
        "            pass\n",
        "under a caller's default dtype of float64 a fit trained a model of float64 weights from other draws",
        ("tests/test_run_draws.py::test_every_method_s_fit_leaves_the_caller_s_draws_and_default_dtype_and_trains_in_"
         "float32",)),
    Bug("cca-itq-import-draws", "ucmfh/methods/cca_itq.py", "            random.setstate(state)\n",
        "            pass\n",
        "a notebook's first cca-itq fit moved Python's generator (scikit-learn loads rich, which draws as it loads)",
        ("tests/test_run_draws.py::test_every_method_s_fit_leaves_the_caller_s_draws_and_default_dtype_and_trains_in_"
         "float32",)),
    Bug("relevant-counts-unblocked", "ucmfh/metrics/relevance.py",
        "    step = max(1, COUNT_BLOCK // max(1, patterns.shape[1]))\n", "    step = max(1, query_labels.shape[0])\n",
        "relevant_counts built the whole [queries, distinct label vectors] matrix (2 GB at 1,000 × 250,000)",
        ("tests/metrics/test_metrics.py::test_relevant_counts",)),
    Bug("bootstrap-batch-unbounded", "ucmfh/metrics/intervals.py", "    batch = max(1, min(_BATCH, _DRAWN // widest))\n",
        "    batch = _BATCH\n",
        "the bootstrap drew 250 resamples at once whatever the queries (7.9 GB at 1M queries)",
        ("tests/metrics/test_intervals.py::test_a_bootstrap_of_many_queries_draws_fewer_resamples_at_once",)),
    Bug("search-block-numbers-from-0", "ucmfh/search/results.py", '"query": results.first + i, ', '"query": i, ',
        "a search printed a block of queries at a time numbered each block's queries from 0 again",
        ("tests/search/test_search_cli.py::test_a_search_printed_a_block_of_quer"
         "ies_at_a_time_prints_what_the_whole_search_did",)),
    Bug("search-block-served-unshifted", "ucmfh/search/results.py",
        "            _add_served(self.served, part.served, part.first)\n",
        "            _add_served(self.served, part.served, 0)\n",
        "the queries the scan served were numbered within their block of queries, not the search's",
        ("tests/search/test_search.py::test_a_search_in_blocks_of_queries_is_the_search_of_them_all",)),
    Bug("search-block-recall-unweighted", "ucmfh/search/results.py",
        "        n = max(1, sum(count for count, _ in self._recalls))\n        last = self._recalls[-1][1]\n"
        "        return {**{name: math.fsum(count * r[name]",
        "        n = max(1, len(self._recalls))\n        last = self._recalls[-1][1]\n"
        "        return {**{name: math.fsum(r[name]",
        "an approximate backend's recall was the mean of its blocks' recalls, a short last block weighed as a whole one",
        ("tests/search/test_search.py::test_a_search_in_blocks_of_queries_is_the_search_of_them_all",)),
    Bug("search-block-own-found-last", "ucmfh/search/results.py",
        "            self.own_found = (self.own_found or 0) + part.own_found\n",
        "            self.own_found = part.own_found\n",
        "how many queries found their own item counted the last block of queries alone",
        ("tests/search/test_search_cli.py::test_a_search_printed_a_block_of_quer"
         "ies_at_a_time_prints_what_the_whole_search_did",)),
    Bug("search-legend-each-block", "ucmfh/app/search_cli.py",
        "                for lines in result_lines(results):\n                    click.echo(lines)\n",
        "                for lines in result_lines(results):\n                    click.echo(lines)\n"
        "                if legend(results.relevance):\n                    click.echo(legend(results.relevance))\n",
        "the table's legend of relevance marks was printed after each block of queries",
        ("tests/search/test_search_cli.py::test_a_search_printed_a_block_of_quer"
         "ies_at_a_time_prints_what_the_whole_search_did",)),
    Bug("scoring-bar-one-step-a-ranking", "ucmfh/metrics/ranking.py",
        "            on_queries(chunk)\n            ranked += chunk\n",
        "            pass\n",
        "the scoring bar stood still through a whole ranking (36 s of 48 at 5,000 queries × 100,000 items)",
        ("tests/test_library.py::test_scoring_s_progress_bar_steps_a_chunk_of_queries_at_a_time_to_its_total",)),
    Bug("scoring-bar-caption-total", "ucmfh/evaluation.py",
        "    return 2 * (len(first_of_each_id(data.query.ids.cpu().numpy())) + len(data.query))\n",
        "    return 2 * len(data.query)\n",
        "a caption set's scoring bar ended short of (or past) its total: its image queries are its distinct images",
        ("tests/test_library.py::test_scoring_s_progress_bar_steps_a_chunk_of_queries_at_a_time_to_its_total",)),
    Bug("scoring-bar-fusion-still", "ucmfh/evaluation.py",
        'score_splits(query, retrieval, data, k, "cosine", expected=True, on_queries=bar.update)]',
        'score_splits(query, retrieval, data, k, "cosine", expected=True)]',
        "a fusion encoder's scoring showed no progress at all",
        ("tests/test_library.py::test_scoring_s_progress_bar_steps_a_chunk_of_queries_at_a_time_to_its_total",)),
    Bug("ties-at-kth-all-relevant", "ucmfh/metrics/ties.py",
        "else (a.float() * b.float()).sum(dim=1) > 0\n", "else (a.float() * b.float()).sum(dim=1) >= 0\n",
        "the items tied at a retrieval block's k-th similarity were all counted relevant, labels shared or not",
        ("tests/metrics/test_ties.py::test_cosine_groups_the_same_for_every_block_of_retrieval_items",)),
    Bug("ties-at-kth-by-id-any", "ucmfh/metrics/ties.py",
        "            relevant = a.long() == b.long() if by_id else", "            relevant = a.long() >= 0 if by_id else",
        "a caption set's items tied at a block's k-th similarity were all counted true matches",
        ("tests/metrics/test_ties.py::test_cosine_groups_the_same_for_every_block_of_retrieval_items",)),
    Bug("output-encoding-strict", "ucmfh/__main__.py",
        "    escape_what_output_cannot_encode()  # > out.txt on Windows: cp1252\n", "",
        "'ucmfh losses > out.txt' under cp1252 ended in a UnicodeEncodeError traceback at its first arrow",
        ("tests/app/test_user_files.py::test_characters_the_output_s_encoding_lacks_are_written_as_escapes",)),
    Bug("output-encoding-replaced", "ucmfh/app/errors.py",
        'sys.stdout.reconfigure(errors="backslashreplace")', 'sys.stdout.reconfigure(errors="replace")',
        "a character the output's encoding lacks was written as '?', what it was lost",
        ("tests/app/test_user_files.py::test_characters_the_output_s_encoding_lacks_are_written_as_escapes",)),
    Bug("codes-bar-still", "ucmfh/metrics/report.py",
        "                step(result[name])\n                bar.update()\n", "                step(result[name])\n",
        "evaluate --codes's bar stood at 0 through every pass over the queries",
        ("tests/test_codes.py::test_a_codes_file_s_progress_bar_steps_each_pass_over_the_queries_to_its_total",)),
    Bug("codes-bar-caption-set-silent", "ucmfh/metrics/report.py",
        'database=database or "test", k=k, progress=progress, **options)',
        'database=database or "test", k=k, **options)',
        "evaluate --codes of a caption set's codes said nothing while it scored them",
        ("tests/test_codes.py::test_a_codes_file_s_progress_bar_steps_each_pass_over_the_queries_to_its_total",)),
    Bug("synthetic-made-silently", "ucmfh/app/environment.py",
        '        say(f"note: made {path}', '        (f"note: made {path}',
        "-d synthetic made a file of 100 MB in --data-dir without a word",
        ("tests/data/test_data.py::test_the_synthetic_set_made_on_first_use_is_said_once",)),
    Bug("dense-width-unchecked", "ucmfh/data/tokens.py",
        "        if other is not None and other[1] != tokens.shape[1]:", "        if False:",
        "dense descriptions wider than the word tokens passed validate, then train-seps ended in a traceback",
        ("tests/seps/test_seps.py::test_token_datasets_are_validated_with_one_clear_line",)),
    Bug("collection-labels-unchecked", "ucmfh/search/collection.py",
        "            other = np.argwhere(~np.isin(out, (0, 1)))", "            other = np.argwhere(out < 0)",
        "a collection's labels of 2 were called valid, and index refused them later",
        ("tests/search/test_search_cli.py::test_validate_accepts_a_search_collection",)),
    Bug("dataset-strings-undecoded", "ucmfh/data/h5.py",
        "        if strings is not None and token_values:", "        if False:",
        "validate passed a dataset's text_raw and paths that were not UTF-8, which index refused",
        ("tests/data/test_data.py::test_validation_reads_every_string_and_word_count",)),
    Bug("bow-counts-unchecked", "ucmfh/data/h5.py",
        "            if not is_bag_of_words(_read(path, where, bow, slice(start, start + step))):",
        "            if False:",
        "validate passed text_bow counts of 0.5",
        ("tests/data/test_data.py::test_validation_reads_every_string_and_word_count",)),
    Bug("text-words-any-type", "ucmfh/data/tokens.py",
        '        if words.dtype.kind not in "OSU":', '        if words.dtype.kind not in "OSUf":',
        "text_words of float32 numbers were valid",
        ("tests/seps/test_seps.py::test_token_datasets_are_validated_with_one_clear_line",)),
    Bug("train-ids-other-images", "ucmfh/data/h5.py",
        "            _check_an_id_one_image_in_both(path, ids, images)\n", "            pass\n",
        "a train split whose rows carry retrieval's ids for other images was valid",
        ("tests/data/test_data.py::test_validation_names_file_dataset_and_problem",)),
    Bug("file-output-folder-name", "ucmfh/app/outputs.py",
        '        if path and flag not in STARTS and path.endswith(("/", os.sep)):', "        if False:",
        "'encode -o codes/' encoded every item, then failed naming its temporary file",
        ("tests/app/test_user_files.py::"
         "test_a_file_output_named_as_a_folder_and_a_folder_named_as_a_file_are_refused",)),
    Bug("loss-params-without-loss", "ucmfh/app/grid.py",
        '        if not colon and "=" in name:', "        if False:",
        "grid --loss-params temperature=0.5 said 'unknown loss 'temperature=0.5''",
        ("tests/app/test_grid.py::test_loss_parameters_of_nothing_are_refused",)),
    Bug("code-lengths-list-unsaid", "ucmfh/app/options.py",
        '        if isinstance(value, str) and "," in value:', "        if False:",
        "-b 8,16 said \"'8,16' is not a valid integer range\"",
        ("tests/app/test_cli.py::test_code_lengths_as_a_list_are_said_to_take_a_flag_each",)),
    Bug("history-filtered-said-absent", "ucmfh/app/runs_cli.py",
        "        if by_key and holds(found) and not holds(rows):", "        if False:",
        "runs --history RUN -b 128 said RUN was no run of the results file",
        ("tests/app/test_history.py::test_a_run_the_filters_leave_out_is_said_to_be_left_out_not_absent",)),
    Bug("collection-name-unsaid", "ucmfh/search/collection.py",
        'raise MissingFile(f"{path}: no such collection file{a_name_not_a_path(path)}" if path else',
        'raise MissingFile(f"{path}: no such collection file" if path else',
        "index given a dataset's name said 'no such collection file' and no more",
        ("tests/data/test_data.py::test_a_dataset_s_bare_name_given_for_its_path_is_said_to_be_one",)),
    Bug("checkpoint-for-hdf5-unsaid", "ucmfh/data/format.py",
        "    if zipfile.is_zipfile(path):  # what torch.save writes", "    if False:",
        "a checkpoint given for a dataset was HDF5's 'file signature not found'",
        ("tests/app/test_user_files.py::test_a_checkpoint_and_an_hdf5_file_given_for_each_other_are_said_to_be_so",)),
    Bug("hdf5-for-checkpoint-unsaid", "ucmfh/files.py",
        '            if f.read(8) == b"\\x89HDF\\r\\n\\x1a\\n":', "            if False:",
        "a dataset given for -c was 'truncated, or not a file torch saved'",
        ("tests/app/test_user_files.py::test_a_checkpoint_and_an_hdf5_file_given_for_each_other_are_said_to_be_so",)),
    Bug("method-name-no-suggestion", "ucmfh/app/hashing_cli.py",
        "            meant = did_you_mean(value, METHODS)\n", "            meant = \"\"\n",
        "--method two-towr gave the list of methods alone",
        ("tests/app/test_cli.py::test_a_mistyped_method_or_loss_name_is_said_with_the_name_meant",)),
    Bug("set-param-refused", "ucmfh/app/options.py",
        '        if dot and param and field in ("loss_params", "method_params"):', "        if False:",
        "--set hash.loss_params.temperature=0.1 was refused, and a grid had no way to a method's parameter",
        ("tests/app/test_cli.py::test_one_parameter_of_the_method_or_the_loss_is_set_as_compare_names_it",)),
    Bug("dense-source-unread", "ucmfh/data/tokens.py",
        '    if source != "image":\n        raise DataError(f"{path}: its dense descriptions',
        '    if False:\n        raise DataError(f"{path}: its dense descriptions',
        "--dense-text image took descriptions generated from the captions for the images'",
        ("tests/seps/test_seps.py::"
         "test_dense_descriptions_say_what_they_were_generated_from_and_are_of_images_where_taken_for_them",)),
    Bug("codes-float-ids-truncated", "ucmfh/codes.py",
        '            if given.dtype.kind not in "iu":  # 0.5 was written as 0',
        '            if False:  # 0.5 was written as 0',
        "save_codes wrote ids of 0.5 as 0, merging items, and the file was scored",
        ("tests/test_codes.py::test_save_rejects_bad_inputs",)),
    Bug("codes-nan-stored", "ucmfh/codes.py",
        '        if codes.dtype.kind == "f" and not np.isfinite(codes).all():', "        if False:",
        "save_codes wrote NaN codes as -1 bits, and the file was scored",
        ("tests/test_codes.py::test_save_rejects_bad_inputs",)),
    Bug("codes-group-for-dataset", "ucmfh/codes.py",
        "                if name in f[group] and not isinstance(f[group][name], h5py.Dataset):",
        "                if False:",
        "a codes file with a group where a dataset belongs ended in an AttributeError traceback",
        ("tests/test_codes.py::test_load_errors_name_file_dataset_problem",)),
    Bug("convert-ids-wrapped", "ucmfh/data/convert.py",
        "    if values.size and values.max() >= 2**63:", "    if False:",
        "convert --ids wrapped ids beyond int64 to negative ones, said of the output file",
        ("tests/data/test_convert.py::test_a_caption_set_from_arrays_keeps_an_image_s_captions_in_one_split",)),
    Bug("folder-output-file-name", "ucmfh/app/outputs.py",
        "        if suffix in FILE_SUFFIXES and not os.path.isdir(path):", "        if False:",
        "'train-hash --out model.pt' made a folder model.pt for its runs, without a word",
        ("tests/app/test_user_files.py::"
         "test_a_file_output_named_as_a_folder_and_a_folder_named_as_a_file_are_refused",)),
    Bug("methods-json-params-lost", "ucmfh/app/hashing_cli.py",
        '"version": spec.version or None, "params": spec.params,', '"version": spec.version or None, "params": {},',
        "methods --json listed each method without its parameters",
        ("tests/app/test_cli.py::test_methods_and_losses_list_themselves_as_json_for_a_script",)),
    Bug("runs-k-ignored", "ucmfh/app/runs.py",
        'and _matches(r.get("n_bits"), n_bits) and _matches(r.get("k"), k)', 'and _matches(r.get("n_bits"), n_bits)',
        "runs -k and compare -k kept the rows of every cut-off",
        ("tests/app/test_runs.py::test_runs_summarises_over_seeds",
         "tests/app/test_compare.py::test_compare_says_what_is_missing")),
    Bug("index-splits-as-letters", "ucmfh/search/build.py",
        "    if isinstance(splits, str):  # one group", "    if False:  # one group",
        "build_index(..., splits='query') read the groups q, u, e, r and y",
        ("tests/search/test_search.py::"
         "test_build_index_s_arguments_are_checked_before_its_folder_is_made_or_locked",)),
    Bug("missing-dataset-no-file-not-found", "ucmfh/data/h5.py",
        '        raise MissingFile(f"{path}: no such file{a_name_not_a_path(path)}"',
        '        raise DataError(f"{path}: no such file{a_name_not_a_path(path)}"',
        "load_dataset's missing file escaped 'except FileNotFoundError', which the codes' and the index's met",
        ("tests/test_library.py::test_a_missing_file_is_a_file_not_found_and_a_value_error_whichever_call_reads_it",)),
    Bug("runs-protocol-one", "ucmfh/app/runs.py",
        'and _matches(r.get("protocol"), protocol)]', 'and (not protocol or r.get("protocol") == protocol[-1])]',
        "runs --protocol kept the rows of the last protocol given alone",
        ("tests/app/test_runs.py::test_runs_summarises_over_seeds",)),
    Bug("fit-fusion-in-place", "ucmfh/fusion_stage.py",
        "        model = copy.deepcopy(fusion)  #", "        model = fusion  #",
        "fit_fusion trained the encoder given in place and returned it as the model trained",
        ("tests/test_library.py::test_fit_fusion_goes_on_from_a_copy_of_the_encoder_given_as_fit_hashing_does",)),
    Bug("world-size-without-rank", "ucmfh/app/environment.py",
        '    if world > 1 and "RANK" not in os.environ:', '    if False:',
        "WORLD_SIZE set alone (a cluster's container) made extract shard 0 of N, which waited for the others for ever",
        ("tests/test_distributed.py::test_a_command_of_one_process_is_refused_under_torchrun",)),
    Bug("tokenizer-of-special-tokens", "ucmfh/data/clip_encoder.py",
        "    if words < vocabulary:", "    if False:",
        "a model folder without its tokenizer's files gave every caption one feature row, and the file was valid",
        ("tests/data/test_extract.py::"
         "test_a_model_folder_of_another_kind_damaged_or_mismatched_is_refused_in_one_line",)),
    Bug("extract-resumes-other-weights", "ucmfh/data/scratch.py",
        "        if None not in (model, weights) and weights != model:", "        if False:",
        "weights trained on into the model's folder: a resumed extraction mixed the chunks of two models",
        ("tests/data/test_extract.py::test_chunks_of_a_model_s_other_weights_in_its_folder_are_not_reused",)),
    Bug("labels-of-unlisted-images", "ucmfh/data/annotations.py",
        "    unknown = [name for name in entries if name not in listed]\n", "    unknown = []\n",
        "a labels line of an image not listed (a header line too) made a class of no image",
        ("tests/data/test_extract.py::test_input_mismatches_name_file_and_problem",)),
    Bug("listed-images-missing-late", "ucmfh/data/annotations.py",
        "    gone = [i for i, path in enumerate(paths) if not os.path.exists(path)]\n", "    gone = []\n",
        "a list file's paths that are not there were found once the model had loaded, as unreadable images",
        ("tests/data/test_extract.py::test_image_list_file",)),
    Bug("nul-in-captions-late", "ucmfh/data/input_files.py",
        '    if "\\x00" in text:', "    if False:",
        "a NUL character in a caption failed the extraction at its end, naming no file",
        ("tests/data/test_extract.py::test_input_mismatches_name_file_and_problem",)),
    Bug("extractions-side-by-side", "ucmfh/data/extract.py",
        "            held.enter_context(locked(folder, hidden=True, wait=False, shared=shard is not None))\n",
        "            pass\n",
        "two extractions of one OUT at once: one's restart removed the scratch under the other, whose chunks of other "
        "captions went into the file",
        ("tests/data/test_extract_shards.py::"
         "test_another_extraction_of_one_out_under_way_is_refused_and_a_removed_scratch_is_not_written_anew",)),
    Bug("scratch-made-anew-by-a-chunk", "ucmfh/data/scratch.py",
        '        if not os.path.exists(os.path.join(self.folder, "manifest.json")):  # its chunk',
        "        if False:  #",
        "a chunk written after another extraction removed the scratch made it anew, of nothing said",
        ("tests/data/test_extract_shards.py::"
         "test_another_extraction_of_one_out_under_way_is_refused_and_a_removed_scratch_is_not_written_anew",)),
    Bug("row-being-appended-warned", "ucmfh/files.py",
        "    with f, _no_cycle_collection(), locked(path, hidden=True, shared=True, create=False):",
        "    with f, _no_cycle_collection():",
        "a reader warned of (or refused) a row another process was appending as it read",
        ("tests/test_atomic_writes.py::test_a_results_file_is_read_between_appends_never_in_the_middle_of_one",)),
    Bug("grid-dies-at-a-busy-cell", "ucmfh/app/grid.py",
        "        except RunInProgress as err:  # another process trains it",
        "        except ZeroDivisionError as err:  #",
        "a second grid on one runs folder died at the first cell another process trained, its other cells not run",
        ("tests/app/test_grid.py::test_a_cell_another_process_trains_is_run_after_the_others",)),
    Bug("index-meta-checked-last", "ucmfh/search/folder.py",
        "            json.dumps(self.meta)\n", "            pass\n",
        "an index whose meta JSON cannot write failed deep in the json module, every column written",
        ("tests/search/test_search.py::test_an_index_whose_meta_json_cannot_write_is_refused_before_any_column",)),
    Bug("save-codes-exists-said-late", "ucmfh/codes.py",
        "    if not overwrite and os.path.exists(path):  # said after the work", "    if False:  #",
        "save_codes(overwrite=False) over a file did all the work, then blamed another process",
        ("tests/test_codes.py::test_save_rejects_bad_inputs",)),
    Bug("lock-of-a-removed-file-kept", "ucmfh/app/stage.py",
        "        if not _still_there(fd, _lock_path(checkpoint)):", "        if False:",
        "a run's lock taken as its holder removed the file was kept: a lock of no file, and two processes trained it",
        ("tests/app/test_runs.py::"
         "test_a_run_s_lock_taken_as_its_holder_removed_it_is_taken_again_on_the_file_there",)),
    Bug("side-by-side-dies-at-a-busy-cell", "ucmfh/app/jobs.py",
        "        if isinstance(outcome.error, RunInProgress):", "        if False:",
        "a grid --jobs N beside another on one runs folder ended at the first cell the other trained",
        ("tests/app/test_grid.py::test_a_cell_another_process_trains_is_run_after_the_others_side_by_side_too",)),
    Bug("index-manifest-layout-unchecked", "ucmfh/search/folder.py",
        "                    _check_layout(name, dtype, width, index.words)", "                    pass",
        "an index whose manifest was edited to say int32 ids was searched with every id 0 (objects: a crash)",
        ("tests/search/test_search.py::"
         "test_an_edited_manifest_s_column_layout_ids_past_int64_and_one_string_as_captions_are_refused",)),
    # resume-forgets-best again, one trained method at a time: each must catch it on its own (its best epoch
    # is made the one before the interruption; before, only distill's and djsrh's fell there)
    *(Bug(f"resume-forgets-best-{method}", "ucmfh/trainer.py",
          '        self.best = BestEpoch(saved["best"])\n',
          "",
          f"{method}: resume forgets the best-so-far validation record (best epoch and its weights)",
          (f"{REGISTRY_RESUME}[{method}-2]",))
      for method in ("ucmfh", "two-tower", "distill", "djsrh", "jdsh", "ucch", "dgcpn", "cirh", "daeh")),
)


# ------------------------------------------------------------------ bookkeeping

class PlantError(ValueError):
    """A planted bug that cannot be applied as written (its file or its old text)."""


def check_bugs(bugs: Sequence[Bug], root: Path = ROOT) -> None:
    """Refuse duplicate names, missing files and old texts that do not occur exactly once in their file."""
    seen = set()
    for bug in bugs:
        if bug.name in seen:
            raise PlantError(f"bug {bug.name!r} is listed twice")
        seen.add(bug.name)
        if not bug.tests:
            raise PlantError(f"bug {bug.name!r} names no test to run")
        path = root / bug.file
        if not path.is_file():
            raise PlantError(f"bug {bug.name!r}: {bug.file} does not exist")
        count = path.read_text(encoding="utf-8").count(bug.old)
        if count != 1:
            raise PlantError(f"bug {bug.name!r}: its old text occurs {count} times in {bug.file}, not once "
                             "(the code moved on: update the patch)")
        if bug.old == bug.new:
            raise PlantError(f"bug {bug.name!r}: old and new text are the same")


def select(bugs: Sequence[Bug], only: Sequence[str]) -> List[Bug]:
    """The bugs named in ``only`` (all when empty), in the listed order; an unknown name is refused."""
    if not only:
        return list(bugs)
    names = {bug.name for bug in bugs}
    unknown = [name for name in only if name not in names]
    if unknown:
        raise PlantError(f"unknown bug {unknown[0]!r} (see --list)")
    return [bug for bug in bugs if bug.name in only]


def union_of_tests(bugs: Sequence[Bug]) -> List[str]:
    """Every test argument of ``bugs`` once, in first-seen order; a node id whose file is given whole is dropped."""
    args: List[str] = []
    for bug in bugs:
        args += [t for t in bug.tests if t not in args]
    whole = {a for a in args if "::" not in a}
    return [a for a in args if a.split("::")[0] not in whole or "::" not in a]


def module_of(file: str) -> Optional[str]:
    """The dotted module of a package file (``ucmfh/models/fusion.py`` -> ``ucmfh.models.fusion``)."""
    if not file.endswith(".py") or not file.startswith("ucmfh/"):
        return None
    return file[:-3].replace("/", ".").removesuffix(".__init__")


# ------------------------------------------------------------------ the copy

def copy_checkout(root: Path, dest: Path) -> int:
    """Copy the checkout's tracked and untracked, not ignored, files and its compiled kernels into ``dest``;
    returns the number of kernels copied (0: the copy evaluates with torch)."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = root / name
        if source.is_file():  # a tracked file deleted in the working tree is skipped
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    kernels = sorted(root.glob(KERNELS))
    for kernel in kernels:
        shutil.copy2(kernel, dest / kernel.relative_to(root))
    return len(kernels)


def environment(copy: Path, scratch: Path) -> Dict[str, str]:
    """The tests' environment: the copy's ucmfh first, one thread, no bytecode files, TMPDIR in the scratch folder."""
    env = dict(os.environ)
    env.update(PYTHONPATH=str(copy), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1",
               TMPDIR=str(scratch))
    return env


# ------------------------------------------------------------------ running

@dataclass
class Outcome:
    """What one pytest run gave."""

    rc: Optional[int]  # None: stopped at the timeout
    seconds: float
    failed: List[str] = field(default_factory=list)  # node ids of FAILED tests
    errors: List[str] = field(default_factory=list)  # node ids (or files) of ERRORs
    tail: str = ""


# "FAILED tests/a.py::t[x - y] - AssertionError: ...": the node id, its parameters kept whole
SUMMARY = re.compile(r"^(FAILED|ERROR) (\S+?(?:\[.*?\])?)(?: - .*)?$")


def run(cmd: List[str], cwd: Path, env: Dict[str, str], timeout: float) -> Tuple[Optional[int], str, float]:
    """Run ``cmd`` in its own session (a Ctrl-C here does not reach it; it is stopped on the way out):
    (exit status or None at the timeout, stdout and stderr, seconds)."""
    start = time.monotonic()
    child = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True, text=True)
    try:
        out, _ = child.communicate(timeout=timeout)
        return child.returncode, out, time.monotonic() - start
    except subprocess.TimeoutExpired:
        _stop(child)
        out, _ = child.communicate()
        return None, out, time.monotonic() - start
    except BaseException:
        _stop(child)
        raise


def _stop(child: subprocess.Popen) -> None:
    """End the child's session (pytest and what it started: torchrun and its workers)."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait()


def pytest(tests: Sequence[str], copy: Path, scratch: Path, timeout: float) -> Outcome:
    """``python -m pytest TESTS -q -x`` in the copy, its temporary folders under ``scratch``."""
    cmd = [sys.executable, "-m", "pytest", *tests, "-q", "-x", "-rfE", "--tb=line", "-p", "no:cacheprovider",
           f"--basetemp={scratch / 'pytest'}"]
    rc, out, seconds = run(cmd, copy, environment(copy, scratch), timeout)
    outcome = Outcome(rc, seconds, tail="\n".join(out.strip().splitlines()[-15:]))
    for line in out.splitlines():
        match = SUMMARY.match(line)
        if match:
            (outcome.failed if match[1] == "FAILED" else outcome.errors).append(match[2])
    return outcome


def import_error(module: Optional[str], copy: Path, scratch: Path) -> Optional[str]:
    """The last line of the error importing ``module`` from the copy, or None when it imports."""
    if module is None:
        return None
    rc, out, _ = run([sys.executable, "-c", f"import {module}"], copy, environment(copy, scratch), 300)
    return None if rc == 0 else (out.strip().splitlines() or ["no output"])[-1]


def imported_from(copy: Path, scratch: Path) -> str:
    """Where ``import ucmfh`` resolves in the copy's environment (it must be the copy)."""
    rc, out, _ = run([sys.executable, "-c", "import ucmfh; print(ucmfh.__file__)"], copy,
                     environment(copy, scratch), 300)
    return out.strip().splitlines()[-1] if out.strip() else f"nothing (exit {rc})"


def verdict(outcome: Outcome) -> str:
    """caught / not caught / broken patch / timeout / error, from a pytest run on a patched copy.

    pytest exits 1 when a test failed (or erred in its set-up), 2 when collecting a file failed (with
    -x: an import error), 0 when everything passed."""
    if outcome.rc is None:
        return "timeout"
    if outcome.rc == 0:
        return "not caught"
    if outcome.rc == 1 and (outcome.failed or outcome.errors):
        return "caught"
    if outcome.rc == 2 and outcome.errors:
        return "broken patch"
    return f"error (pytest exit {outcome.rc})"


def plant_and_test(bug: Bug, copy: Path, scratch: Path, timeout: float) -> Dict[str, object]:
    """Apply ``bug`` to the copy, run its tests, restore the file; the result as a JSON-able dict."""
    path = copy / bug.file
    original = path.read_text(encoding="utf-8")
    path.write_text(original.replace(bug.old, bug.new, 1), encoding="utf-8")
    try:
        broken = import_error(module_of(bug.file), copy, scratch)
        outcome = Outcome(2, 0.0, tail=broken) if broken else pytest(bug.tests, copy, scratch, timeout)
    finally:
        path.write_text(original, encoding="utf-8")
    status = "broken patch" if broken else verdict(outcome)
    caught_by = outcome.failed or [f"{e} (error)" for e in outcome.errors]
    return {**asdict(bug), "status": status, "caught_by": caught_by if status == "caught" else [],
            "seconds": round(outcome.seconds, 1), "rc": outcome.rc, "tail": outcome.tail}


# ------------------------------------------------------------------ output

def table(rows: Sequence[Dict[str, object]]) -> str:
    """The results as a plain table: bug, file, caught by (or the status), seconds."""
    lines = [("bug", "file", "caught by", "s")]
    for row in rows:
        by = ", ".join(map(_short, row["caught_by"])) if row["status"] == "caught" else f"NOT CAUGHT: {row['status']}"
        lines.append((str(row["name"]), str(row["file"]), by, f"{row['seconds']:.1f}"))
    widths = [max(len(line[i]) for line in lines) for i in range(3)]
    return "\n".join(f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d:>6}" for a, b, c, d in lines)


def _short(test: str, most: int = 100) -> str:
    """A node id cut to ``most`` characters (a long parameter) for the table; the JSON keeps it whole."""
    return test if len(test) <= most else test[: most - 1] + "…"


def list_bugs(bugs: Sequence[Bug]) -> str:
    return "\n".join(f"{bug.name}\n    {bug.file}: {bug.what}\n    tests: {' '.join(bug.tests)}" for bug in bugs)


def git_commit(root: Path) -> str:
    """HEAD of the checkout, with '+changes' when its working tree differs."""
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True)
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def write_json(path: str, report: Dict[str, object]) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, path)


# ------------------------------------------------------------------ main

class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"planted_bugs.py: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def fail(message: str, code: int = 2) -> NoReturn:
    print(f"planted_bugs.py: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def _terminate(signum, frame):  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt


def check_json_path(path: Optional[str]) -> None:
    """Refuse a --json path that cannot be written, before any test runs."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        fail(f"--json {path}: folder {folder} does not exist or is not writable")
    if os.path.isdir(path):
        fail(f"--json {path}: is a folder")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="run this bug only (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the planted bugs and their tests, run nothing")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per pytest run (default 600)")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        fail(f"--timeout must be > 0, got {args.timeout}")
    try:
        bugs = select(BUGS, args.only)
        if args.list:
            print(list_bugs(bugs))
            return 0
        check_bugs(bugs)
    except PlantError as err:
        fail(str(err))
    check_json_path(args.json)
    signal.signal(signal.SIGTERM, _terminate)
    scratch = Path(tempfile.mkdtemp(prefix="planted-bugs-"))
    try:
        return plant_all(bugs, scratch, args)
    except KeyboardInterrupt:
        print("planted_bugs.py: interrupted; the temporary copy is removed", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            print(f"kept: {scratch / 'repo'}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


def plant_all(bugs: Sequence[Bug], scratch: Path, args: argparse.Namespace) -> int:
    """The baseline, then every bug; prints the table, writes --json; the exit status."""
    copy = scratch / "repo"
    copy.mkdir()
    kernels = copy_checkout(ROOT, copy)
    report: Dict[str, object] = {"checkout": str(ROOT), "commit": git_commit(ROOT), "python": sys.version.split()[0],
                                 "kernels_copied": kernels, "bugs": []}
    if not kernels:
        print("note: no compiled kernel in the checkout: the copy evaluates with torch")
    where = imported_from(copy, scratch)
    if not where.startswith(str(copy)):
        fail(f"the copy imports ucmfh from {where}, not from the copy", 1)
    tests = union_of_tests(bugs)
    print(f"baseline: {len(tests)} test argument(s) on the unpatched copy ...", flush=True)
    base = pytest(tests, copy, scratch, args.timeout * len(bugs))
    report["baseline"] = {"tests": tests, "rc": base.rc, "seconds": round(base.seconds, 1),
                          "failed": base.failed + base.errors}
    print(f"baseline: exit {base.rc} in {base.seconds:.0f} s")
    if base.rc != 0:
        print(f"baseline fails: {', '.join(base.failed + base.errors) or 'see below'}\n{base.tail}")
        report["status"] = "baseline fails"
        if args.json:
            write_json(args.json, report)
        return 1
    rows = []
    for bug in bugs:
        row = plant_and_test(bug, copy, scratch, args.timeout)
        rows.append(row)
        by = ", ".join(row["caught_by"]) if row["caught_by"] else (row["tail"].splitlines() or [""])[-1]
        print(f"{bug.name}: {row['status']} in {row['seconds']:.0f} s ({by})", flush=True)
        report["bugs"] = rows
        if args.json:  # written after every bug: a long run shows its progress, and an interrupted one what it had
            write_json(args.json, report)
    print()
    print(table(rows))
    missed = [row["name"] for row in rows if row["status"] != "caught"]
    report["status"] = "all caught" if not missed else f"not caught: {', '.join(missed)}"
    print(f"\n{len(rows) - len(missed)} of {len(rows)} caught" + (f"; not caught: {', '.join(missed)}" if missed else ""))
    if args.json:
        write_json(args.json, report)
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
