"""ucmfh: deep cross-modal hashing on precomputed image and text features.

What a user of the docs needs is importable from here, loaded on first use, so ``import ucmfh``
stays light (and a CPU search never imports torch):

* data: ``load_dataset`` (a ``Dataset`` of three ``Split``), ``write_dataset``, ``validate_file``, ``DataError``
  (docs/data.md);
* training: ``hash_config`` (a method's settings, by the command line's rules:
  ``fit_hashing(data, hash_config("two-tower", n_bits=64))`` trains the command line's default;
  ``HashConfig()`` alone holds UCMFH's reference settings, whose method needs ``fit_fusion`` first),
  ``fusion_config`` (a fusion stage's), ``stage_configs`` (both stages of a run, every code length),
  ``HashConfig``, ``FusionConfig``, ``SettingError``, ``fit_hashing``, ``fit_fusion`` (each with its
  ``History``; stopped by SIGINT/SIGTERM: ``TrainingInterrupted``), ``build_method``, ``METHODS``;
  ``separate_draws`` (fits in threads of one process, each drawing its own numbers);
* codes and scores of a trained model: ``encode_split`` (``img, txt = encode_split(model, data.query)``),
  ``evaluate_hashing`` (MAP@K both directions, per protocol), ``evaluate_fusion``;
* checkpoints: ``save_checkpoint``, ``load_model``; codes files: ``save_codes``, ``load_codes`` (docs/evaluation.md);
* search: ``Index``, ``build_index``, ``Encoder`` (docs/search.md);
* the retrieval metrics (``from ucmfh import map_at_k``, docs/evaluation.md).
"""
from importlib import import_module as _import_module

__version__ = "0.1.0"

_METRICS = (
    "average_precision_at_k", "evaluate_caption_set", "evaluate_codes", "evaluate_codes_file", "evaluate_direction", "map_at_all",
    "map_at_k", "map_at_k_by_id", "map_at_k_cosine", "native_kernels", "pr_curve_hamming", "precision_at_k",
    "precision_recall_at_k", "precision_within_radius", "recall_at_k", "recall_at_ranks", "relevant_counts",
    "set_backend", "top_k",
)
_HOMES = {
    **{name: "ucmfh.metrics" for name in _METRICS},
    "load_dataset": "ucmfh.data.h5", "write_dataset": "ucmfh.data.writer", "validate_file": "ucmfh.data.h5",
    "DataError": "ucmfh.data.format", "Dataset": "ucmfh.data.h5", "Split": "ucmfh.data.h5",
    "HashConfig": "ucmfh.config", "FusionConfig": "ucmfh.config", "SettingError": "ucmfh.config",
    "fit_hashing": "ucmfh.methods", "build_method": "ucmfh.methods", "METHODS": "ucmfh.methods",
    "hash_config": "ucmfh.methods", "fusion_config": "ucmfh.methods", "stage_configs": "ucmfh.methods",
    "encode_split": "ucmfh.evaluation", "evaluate_hashing": "ucmfh.evaluation", "evaluate_fusion": "ucmfh.evaluation",
    "fit_fusion": "ucmfh.fusion_stage", "History": "ucmfh.selection", "separate_draws": "ucmfh.run_draws",
    "TrainingInterrupted": "ucmfh.signals",
    "save_checkpoint": "ucmfh.checkpoint", "load_model": "ucmfh.checkpoint",
    "save_codes": "ucmfh.codes", "load_codes": "ucmfh.codes",
    "Index": "ucmfh.search", "build_index": "ucmfh.search", "Encoder": "ucmfh.search",
}
__all__ = ["__version__", *_HOMES]


def __getattr__(name):
    if name in _HOMES:
        return getattr(_import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'ucmfh' has no attribute {name!r}")


def __dir__():  # the names loaded on first use too (a notebook's completion lists them), not the module's own
    return sorted({*(name for name in globals() if not name.startswith("_") or name.startswith("__")), *_HOMES})
