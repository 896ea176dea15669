"""The hashing methods, one file each, and their registry.

``build_method(name)`` gives a method (:class:`Method`): its defaults, the model it produces and its
fit. ``hash_config(name, **settings)`` makes a config of it, ``stage_configs(name, dataset=..., **settings)``
the configs of a whole run, as the front doors build them, by the same rules (:mod:`ucmfh.methods.settings`);
``fit_hashing(data, cfg)`` trains one.
Adding a method is one file with a registered :class:`Method` subclass, imported below, and its tests;
another package adds its own through an entry point (:mod:`ucmfh.methods.plugins`, docs/methods.md).
"""
from ucmfh.methods.base import Method, choose
from ucmfh.methods.registry import DEFAULT_METHOD, METHODS, PLUGIN_ERRORS, build_method, fit_hashing, register
from ucmfh.methods.settings import StageConfigs, fusion_config, hash_config, stage_configs

# each import registers its method; the order is the order of --help and of the tables
from ucmfh.methods import ucmfh as _ucmfh  # noqa: E402,F401
from ucmfh.methods import two_tower as _two_tower  # noqa: E402,F401
from ucmfh.methods import distill as _distill  # noqa: E402,F401
from ucmfh.methods import cca_itq as _cca_itq  # noqa: E402,F401
from ucmfh.methods import djsrh as _djsrh  # noqa: E402,F401
from ucmfh.methods import jdsh as _jdsh  # noqa: E402,F401
from ucmfh.methods import ucch as _ucch  # noqa: E402,F401
from ucmfh.methods import dgcpn as _dgcpn  # noqa: E402,F401
from ucmfh.methods import cirh as _cirh  # noqa: E402,F401
from ucmfh.methods import daeh as _daeh  # noqa: E402,F401
from ucmfh.methods.plugins import PLUGINS, load_plugins  # noqa: E402

load_plugins()  # the methods of other packages, after ucmfh's own

__all__ = ["DEFAULT_METHOD", "METHODS", "Method", "StageConfigs", "build_method", "choose", "fit_hashing",
           "fusion_config", "hash_config", "PLUGIN_ERRORS", "PLUGINS", "register", "stage_configs"]
