"""Methods of other packages (entry points of the group ``ucmfh.methods``, docs/methods.md): docs/methods.md's
example installed as pip installs a package (a module and its ``.dist-info`` on the path) is a method of every
front door; a plugin that cannot load leaves the others working and says why; a method's ``version`` is part of
its runs' identity; no method is given the query or retrieval split."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Dict

import pytest
import torch

from ucmfh.app.identity import Run, dataset_identity
from ucmfh.methods import METHODS, PLUGIN_ERRORS, PLUGINS, Method, fit_hashing, hash_config, register, stage_configs
from ucmfh.methods.plugins import load_plugins
from ucmfh.methods.registry import check_code_width
from ucmfh.methods.two_tower import TwoTower

from conftest import method_config
from test_captured_step import assert_captured_once_as_eager, standin_graphs  # noqa: F401 - a fixture used below

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "methods.md"


def example_code(mark: str = "example") -> str:
    """An example method of docs/methods.md, as the page shows it (``example``: balanced-two-tower; ``example2``:
    cos-pair, written from scratch)."""
    found = re.search(rf"<!-- {mark}:begin -->\n```python\n(.*?)```\n<!-- {mark}:end -->", DOC.read_text(), re.S)
    assert found, f"docs/methods.md: no example between its {mark}:begin and {mark}:end marks"
    return found.group(1)


def load_example(tmp_path: Path, mark: str, method: str) -> None:
    """docs/methods.md's example ``mark`` registered in this process, as an entry point naming its module does."""
    module = f"ucmfh_{mark}_{method.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(example_code(mark))
    sys.path.insert(0, str(tmp_path))
    try:
        assert load_plugins([metadata.EntryPoint(method, module, "ucmfh.methods")]) == [method], PLUGIN_ERRORS
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(module, None)


def installed(folder: Path, modules: Dict[str, str], entry_points: Dict[str, str], name: str = "plugin") -> Path:
    """``modules`` (file name -> source) and the ``.dist-info`` pip writes for a package whose ``ucmfh.methods``
    entry points are ``entry_points``, in ``folder``: a package installed on the path ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for file, source in modules.items():
        (folder / file).write_text(source)
    info = folder / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ucmfh.methods]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    return folder


def ucmfh(path: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m ucmfh ARGS`` with ``path`` on the Python path, as a package installed there."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "ucmfh", *args], capture_output=True, text=True, cwd=cwd, env=env)


@pytest.fixture()
def registry():
    """The registry and the plugins' records as they were before the test, restored after it."""
    saved = dict(METHODS), dict(PLUGIN_ERRORS), dict(PLUGINS)
    yield
    for live, before in zip((METHODS, PLUGIN_ERRORS, PLUGINS), saved):
        live.clear()
        live.update(before)


def test_the_docs_example_is_a_method_of_every_front_door(tmp_path, tiny_path):
    """docs/methods.md's example, installed: ``ucmfh methods`` lists it with its origin; ``train-hash
    --method`` trains it with its own parameter, its row and identity carry its version, ``runs`` finds it,
    and its checkpoint is evaluated again by ``evaluate``; without the package, refused in one line."""
    site = installed(tmp_path / "site", {"ucmfh_balanced.py": example_code()}, {"balanced-two-tower": "ucmfh_balanced"})
    listed = ucmfh(site, "methods", cwd=tmp_path)
    assert listed.returncode == 0 and listed.stderr == ""
    assert re.search(r"^balanced-two-tower .*\n +from another package: ucmfh_balanced, version 1\n +parameters: "
                     r"temperatures=0.3,0.1, balance=0.1", listed.stdout, re.M)
    results = tmp_path / "r.jsonl"
    trained = ucmfh(site, "train-hash", "-d", tiny_path, "--method", "balanced-two-tower", "--method-param",
                    "balance=0.5", "-b", "16", "--epochs", "1", "--set", "hash.hidden=32", "--results", str(results),
                    "--out", str(tmp_path / "runs"), "--quiet", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    (row,) = (json.loads(line) for line in results.read_text().splitlines())  # one row: the run
    assert row["method"] == "balanced-two-tower" and row["task"] == "hashing"
    assert row["settings"]["hash"]["method_version"] == "1"
    assert row["settings"]["hash"]["method_params"]["balance"] == 0.5
    # the method's column is as wide as its name
    assert re.search(r"balanced-two-tower +infonce +16 +unimodal", trained.stdout)
    summary = ucmfh(site, "runs", "--results", str(results), "--method", "balanced-two-tower", cwd=tmp_path)
    assert summary.returncode == 0 and "balanced-two-tower" in summary.stdout
    again = ucmfh(site, "evaluate", "-d", tiny_path, "-c", row["checkpoint"], "--results", str(tmp_path / "e.jsonl"),
                  "--protocol", "unimodal", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    scored = json.loads((tmp_path / "e.jsonl").read_text().splitlines()[0])
    assert (scored["map_i2t"], scored["map_t2i"]) == (row["map_i2t"], row["map_t2i"])
    # another version of the method installed: its code would rebuild another model from these weights
    newer = installed(tmp_path / "newer", {"ucmfh_balanced.py": example_code().replace('version = "1"', 'version = "2"')},
                      {"balanced-two-tower": "ucmfh_balanced"})
    other = ucmfh(newer, "evaluate", "-d", tiny_path, "-c", row["checkpoint"], "--results", str(tmp_path / "e3.jsonl"),
                  cwd=tmp_path)
    assert other.returncode == 2 and other.stderr.splitlines() == [
        f"Error: {row['checkpoint']}: made by version 1 of method 'balanced-two-tower', but version 2 is installed; "
        "read it where that version is"]
    # where the package is not installed, its checkpoints are refused in one line that says so
    without = ucmfh(tmp_path / "nothing", "evaluate", "-d", tiny_path, "-c", row["checkpoint"], "--results",
                    str(tmp_path / "e2.jsonl"), cwd=tmp_path)
    assert without.returncode == 2 and without.stderr.splitlines() == [
        f"Error: {row['checkpoint']}: a checkpoint of method 'balanced-two-tower', which is not one of this ucmfh's "
        f"({', '.join(METHODS)}); a method of another package is read where that package is installed "
        "(docs/methods.md)"]


def test_the_docs_example_trains_what_it_says(tiny, tmp_path, registry):
    """The example's term: at ``balance=0`` it is two-tower's model bit for bit; at a large weight its bits
    are +1 on about half the training items, further from it than two-tower's are."""
    load_example(tmp_path, "example", "balanced-two-tower")

    def fitted(name, **params):
        settings = {"temperatures": "0.3"}  # one candidate: the comparison is of the loss alone
        cfg = method_config(name, n_bits=32, epochs=4, method_params={**settings, **params})
        return fit_hashing(tiny, cfg, progress=False)[0]

    plain = fitted("two-tower")
    for a, b in zip(plain.state_dict().values(), fitted("balanced-two-tower", balance=0.0).state_dict().values()):
        assert torch.equal(a, b)

    def imbalance(model) -> float:
        codes_img, codes_txt = model.codes(tiny.train.img, tiny.train.txt, "unimodal")
        return float(torch.cat([codes_img, codes_txt]).float().mean(0).abs().mean())

    assert imbalance(fitted("balanced-two-tower", balance=5.0)) < imbalance(plain) - 0.02


def test_a_plugin_that_cannot_load_leaves_the_others_and_says_why(tmp_path, tiny_path):
    """A plugin whose import fails and one whose name is taken: each a warning line on every command that reads
    the methods, the methods of ucmfh as before; asking for the missing one is refused in one line."""
    site = installed(tmp_path / "site", {
        "ucmfh_broken.py": "import a_module_that_is_not_installed\n",
        "ucmfh_taken.py": "from ucmfh.methods.two_tower import TwoTower\n\nclass Taken(TwoTower):\n    pass\n",
    }, {"broken": "ucmfh_broken", "taken": "ucmfh_taken:Taken"})
    listed = ucmfh(site, "methods", cwd=tmp_path)
    assert listed.returncode == 0
    assert listed.stderr.splitlines() == [
        "warning: method 'broken' of an installed package not loaded: ucmfh_broken: ModuleNotFoundError: "
        "No module named 'a_module_that_is_not_installed'",
        "warning: method 'taken' of an installed package not loaded: ucmfh_taken:Taken: NameTaken: method name "
        "'two-tower' is taken (by ucmfh.methods.two_tower)"]
    assert re.findall(r"^(\S+) ", listed.stdout, re.M) == list(METHODS)
    refused = ucmfh(site, "train-hash", "-d", tiny_path, "--method", "broken", "--results", str(tmp_path / "r.jsonl"),
                    cwd=tmp_path)
    assert refused.returncode == 2 and "'broken' is not one of" in refused.stderr


@pytest.mark.parametrize("source, value, why", [
    ("import nothing_of_that_name\n", "mod", "mod: ModuleNotFoundError: No module named 'nothing_of_that_name'"),
    ("x = 1\n", "mod", "mod: registers no method (a name of its own, a Method subclass decorated with @register)"),
    ("x = 1\n", "mod:x", "mod:x: TypeError: it names int 1, not a module or a Method subclass"),
    ("from ucmfh.methods import register\nfrom ucmfh.methods.two_tower import TwoTower\n\n"
     "@register\nclass Half(TwoTower):\n    name = 'half'\n\nraise RuntimeError('and then it broke')\n",
     "mod", "mod: RuntimeError: and then it broke"),
])
def test_a_failed_plugin_is_recorded_and_registers_nothing(tmp_path, monkeypatch, registry, source, value, why):
    """Every way a plugin fails is recorded by its entry point's name, and leaves the registry as it was: a
    module that registered a method before failing takes it with it."""
    (tmp_path / "mod.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mod", raising=False)
    before = list(METHODS)
    assert load_plugins([metadata.EntryPoint("mine", value, "ucmfh.methods")]) == []
    assert PLUGIN_ERRORS == {"mine": why} and list(METHODS) == before
    with pytest.raises(ValueError, match=r"unknown method 'mine'; methods: .*; not loaded: mine \(" + re.escape(why)):
        hash_config("mine")


class Named(TwoTower):
    """A method class an entry point names itself, not registered by its module."""

    name = "named-by-its-entry-point"
    version = "3"


def test_a_method_class_named_by_its_entry_point_is_registered(registry):
    assert load_plugins([metadata.EntryPoint("named", f"{__name__}:Named", "ucmfh.methods")]) == \
        ["named-by-its-entry-point"]
    assert isinstance(METHODS["named-by-its-entry-point"], Named) and PLUGINS == {
        "named-by-its-entry-point": f"{__name__}:Named"}


def test_a_methods_version_is_part_of_its_runs_identity(tiny_path, registry):
    """Two versions of a method never share a run; ucmfh's own methods (no version) keep the identity they had."""
    data = type("Data", (), {"path": tiny_path})()
    dataset = dataset_identity(data)
    load_plugins([metadata.EntryPoint("named", f"{__name__}:Named", "ucmfh.methods")])
    cfg = hash_config("named-by-its-entry-point", n_bits=16)
    run = Run("runs", dataset, None, cfg)
    first = run.hash_dir, run.hash_identity
    assert first[1]["hash"]["method_version"] == "3"
    Named.version = "4"
    try:
        assert (run.hash_dir, run.hash_identity) != first and run.hash_dir != first[0]
    finally:
        Named.version = "3"
    own = Run("runs", dataset, None, hash_config("two-tower", n_bits=16))
    assert "method_version" not in own.hash_identity["hash"]


class Spy(Method):
    """Records the splits it is given, then trains two-tower's plan for one epoch."""

    name = "spy"
    seen: list = []

    def build_model(self, d_img, d_txt, cfg, fusion_cfg=None):
        return METHODS["two-tower"].build_model(d_img, d_txt, cfg, fusion_cfg)

    def fit(self, data, cfg, fusion=None, progress=True, state=None):
        seen = {"train": (len(data.train), data.d_img, data.d_txt)}
        for name in ("query", "retrieval"):
            for read in (lambda s: s.img, lambda s: len(s), lambda s: s.labels):
                try:
                    read(getattr(data, name))
                except ValueError as err:
                    seen.setdefault(name, []).append(str(err))
        Spy.seen.append(seen)
        return METHODS["two-tower"].fit(data, hash_config("two-tower", n_bits=cfg.n_bits, hidden=cfg.hidden, epochs=1,
                                                          device="cpu"), fusion, progress, state)


def test_no_method_is_given_the_query_or_retrieval_split(tiny, registry):
    """What ``Method.train`` (every front door's way in) gives a method: the training split, and in place of the
    query and retrieval splits a :class:`Withheld` whose every use is an error saying so, whatever the method's
    code (an empty split gave NaN statistics without a word)."""
    load_plugins([metadata.EntryPoint("spy", f"{__name__}:Spy", "ucmfh.methods")])
    Spy.seen.clear()
    fit_hashing(tiny, hash_config("spy", n_bits=16, hidden=32, epochs=1, device="cpu"), progress=False)
    said = "split is withheld from training (its .{}{} was read): a method trains on the training split alone " \
           "(docs/methods.md)"
    assert Spy.seen == [{"train": (len(tiny.train), tiny.d_img, tiny.d_txt),
                         **{name: [f"the {name} {said.format(a, '')}" for a in ("img", "__len__", "labels")]
                            for name in ("query", "retrieval")}}]


class NoPlan(TwoTower):
    """A method whose plan() is not a Plan (a tuple): the error came from deep in the trainer."""

    name = "no-plan"

    def plan(self, data, cfg, setup, fusion=None):
        return (None, None)


def test_a_plan_that_is_not_a_plan_is_said_where_it_is_made(tiny, registry):
    load_plugins([metadata.EntryPoint("no-plan", f"{__name__}:NoPlan", "ucmfh.methods")])
    cfg = hash_config("no-plan", n_bits=16, hidden=32, epochs=1, device="cpu", method_params={"temperatures": "0.3"})
    with pytest.raises(ValueError, match=r"^method 'no-plan': its plan\(\) gave tuple, not a ucmfh.trainer.Plan$"):
        fit_hashing(tiny, cfg, progress=False)
    with pytest.raises(ValueError, match=r"^method name 'two-tower' is taken \(by ucmfh.methods.two_tower\)$"):
        register(type("Again", (TwoTower,), {"name": "two-tower"}))
    # a name begins a run folder's: '../../x' put the run outside --out, 'org/m' in a folder of its own, a
    # control character into every table (an audit's)
    for name in ("../../escaped", "org/method", "-flag", "<b>x</b>", "a\x1b[31m", "=1+1", "with space"):
        with pytest.raises(ValueError, match=r"^method name .*: letters, digits, '-', '_' and '.' alone"):
            register(type("Odd", (TwoTower,), {"name": name}))


def test_the_docs_method_from_scratch_trains_and_selects_on_validation(tiny, tmp_path, registry):
    """docs/methods.md's second example (cos-pair, a Plan of its own): registered, it trains by the lifecycle
    (its loss falls, validation keeps an epoch), refuses a loss (its own), and gives leak-free codes."""
    load_example(tmp_path, "example2", "cos-pair")
    cfg = hash_config("cos-pair", n_bits=16, epochs=6, batch_size=64, device="cpu", val_fraction=0.2)
    model, history = fit_hashing(tiny, cfg, progress=False)
    assert history[-1] < history[0] and history.best_epoch is not None  # the epochs' mean losses
    with pytest.raises(ValueError, match="has a loss of its own"):
        stage_configs("cos-pair", loss="infonce")
    codes_img, _ = model.codes(tiny.query.img, tiny.query.txt, "unimodal")
    other_img, _ = model.codes(tiny.query.img, tiny.query.txt.flip(0), "unimodal")
    assert torch.equal(codes_img, other_img)  # an image's code from the image alone


@pytest.mark.usefixtures("standin_graphs")
def test_the_docs_method_from_scratch_is_captured_as_it_says(tiny, tmp_path, registry, monkeypatch):
    """cos-pair says graphable: on the CUDA stand-in its step, captured and replayed, makes no host sync and
    trains the eager model (as tests/test_captured_step.py holds ucmfh's own methods to)."""
    load_example(tmp_path, "example2", "cos-pair")
    cfg = hash_config("cos-pair", n_bits=16, epochs=3, batch_size=48, device="cuda", val_fraction=0.2)
    assert_captured_once_as_eager(monkeypatch, lambda: fit_hashing(tiny, cfg, progress=False))


def _made(tmp_path: Path, monkeypatch, modules: Dict[str, str]) -> None:
    """``modules`` (name -> source) importable, none of them imported yet."""
    for module, source in modules.items():
        (tmp_path / f"{module}.py").write_text(source)
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_every_method_of_a_module_and_of_a_plugin_another_imports_is_its_own_entry_points(tmp_path, monkeypatch,
                                                                                           registry):
    """A module registering two methods, named by two entry points, that imports the method of another plugin to
    subclass it: all three are loaded, each credited to the entry point of its own module, none said to be
    missing (each entry point's methods were those that appeared while it loaded: the second entry point of one
    module, and the imported plugin's own, 'registered no method', and the imported one was credited to the
    module importing it)."""
    _made(tmp_path, monkeypatch, {
        "ucmfh_base_plug": "from ucmfh.methods import register\nfrom ucmfh.methods.two_tower import TwoTower\n\n"
                           "@register\nclass Base(TwoTower):\n    name = 'base-plug'\n",
        "ucmfh_pair_plug": "from ucmfh.methods import register\nfrom ucmfh_base_plug import Base\n\n"
                           "@register\nclass A(Base):\n    name = 'pair-a'\n\n"
                           "@register\nclass B(Base):\n    name = 'pair-b'\n"})
    errors = dict(PLUGIN_ERRORS)
    points = [metadata.EntryPoint(name, module, "ucmfh.methods") for name, module in (
        ("pair-a", "ucmfh_pair_plug"), ("pair-b", "ucmfh_pair_plug"), ("base-plug", "ucmfh_base_plug"))]
    assert load_plugins(points) == ["pair-a", "pair-b", "base-plug"]
    assert PLUGIN_ERRORS == errors
    assert {name: PLUGINS[name] for name in ("pair-a", "pair-b", "base-plug")} == {
        "pair-a": "ucmfh_pair_plug", "pair-b": "ucmfh_pair_plug", "base-plug": "ucmfh_base_plug"}


def _build(self, d_img, d_txt, cfg):
    return None


def _plan(self, data, cfg, setup):
    return None


@pytest.mark.parametrize("attrs, fault", [
    ({"defaults": {"hiden": 0}}, "method 'faulty': its defaults name 'hiden', not settings of HashConfig (its own "
                                 "hyper-parameters go in params; the settings: amp, batch_size, "),
    ({"fixed": {"epoch": 1}}, "method 'faulty': its fixed name 'epoch', not settings of HashConfig"),
    ({"build_model": _build}, "method 'faulty': build_model(self, d_img, d_txt, cfg) cannot be called as "
                              "build_model(self, d_img, d_txt, cfg, fusion_cfg), as ucmfh calls it (docs/methods.md)"),
    ({"plan": _plan}, "method 'faulty': plan(self, data, cfg, setup) cannot be called as plan(self, data, cfg, setup, "
                      "fusion)"),
])
def test_a_method_the_lifecycle_could_not_run_is_refused_when_registered(tmp_path, monkeypatch, registry, attrs, fault):
    """A method with a misspelled setting, or a function of another signature than docs/methods.md's (once
    trained to its end: a checkpoint's model is built with fusion_cfg), is refused by register, in the process
    and as a plugin, the other methods kept."""
    before = list(METHODS)
    with pytest.raises(ValueError, match="^" + re.escape(fault)):
        register(type("Faulty", (TwoTower,), {"name": "faulty", **attrs}))
    assert list(METHODS) == before
    [(key, value)] = attrs.items()
    made = f"    {key} = {value!r}\n" if key in ("defaults", "fixed") else f"    {key} = {value.__name__}\n"
    source = (f"from ucmfh.methods import register\nfrom ucmfh.methods.two_tower import TwoTower\n"
              f"from {__name__} import _build, _plan\n\n"
              f"@register\nclass Faulty(TwoTower):\n    name = 'faulty'\n{made}")
    _made(tmp_path, monkeypatch, {"ucmfh_faulty": source})
    assert load_plugins([metadata.EntryPoint("faulty", "ucmfh_faulty", "ucmfh.methods")]) == []
    assert PLUGIN_ERRORS["faulty"].startswith("ucmfh_faulty: ValueError: " + fault) and list(METHODS) == before


def test_a_method_without_a_model_or_a_training_is_refused_when_registered(registry):
    with pytest.raises(ValueError, match=r"^method 'bare' has no build_model \(the untrained model"):
        register(type("Bare", (Method,), {"name": "bare"}))
    with pytest.raises(ValueError, match=r"^method 'untrained' has neither plan \(what a run trains\) nor a fit"):
        register(type("Untrained", (Method,), {"name": "untrained", "build_model": TwoTower.build_model}))
    assert "bare" not in METHODS and "untrained" not in METHODS


class PerItemLoss(TwoTower):
    """A method whose loss is each item's, not the batch's one number; or a float."""

    name = "per-item-loss"
    params = {**TwoTower.params, "as_float": False}

    def plan(self, data, cfg, setup, fusion=None):
        plan = super().plan(data, cfg, setup, fusion)
        loss, as_float = plan.loss, cfg.method_params["as_float"]
        return dataclasses.replace(plan, loss=lambda batch: loss(batch).item() if as_float else loss(batch).expand(4))


@pytest.mark.parametrize("as_float, returned", [(False, "a tensor of shape [4]"), (True, "a float")])
def test_a_loss_that_is_not_one_number_is_said_by_its_method(tiny, registry, as_float, returned):
    register(PerItemLoss)
    cfg = hash_config("per-item-loss", n_bits=16, hidden=32, epochs=1, device="cpu",
                      method_params={"temperatures": "0.3", "as_float": as_float})
    with pytest.raises(ValueError, match=r"^method 'per-item-loss': its plan's loss\(batch\) returns the step's loss, "
                                        r"a tensor of one number that gradients flow back from; it returned "
                                        + re.escape(returned) + "$"):
        fit_hashing(tiny, cfg, progress=False)


def test_a_loss_that_is_not_one_number_is_one_line_of_the_command(tiny_path, tmp_path, registry):
    """The refusal above ended `train-hash` in a traceback and exit 1 (and a grid in three tracebacks of its
    worker): one line, exit 2, nothing written."""
    from click.testing import CliRunner  # noqa: PLC0415

    import ucmfh.app.hashing_cli  # noqa: F401, PLC0415 - its --method, made before the method is registered
    from ucmfh.app.cli import main  # noqa: PLC0415

    register(PerItemLoss)  # after the command's module was imported (its --method was once a list made then)
    result = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "--method", "per-item-loss", "-b", "16",
                                       "--epochs", "1", "--out", str(tmp_path / "runs"), "--quiet",
                                       "--method-param", "temperatures=0.3", "--results", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert result.output.splitlines()[-1] == (
        "Error: method 'per-item-loss': its plan's loss(batch) returns the step's loss, a tensor of one number that "
        "gradients flow back from; it returned a tensor of shape [4]"), result.output
    assert not (tmp_path / "r.jsonl").exists()


class WideHeads(TwoTower):
    """A method whose heads put out one column more than the bits asked for."""

    name = "wide-heads"

    def build_model(self, d_img, d_txt, cfg, fusion_cfg=None):
        return super().build_model(d_img, d_txt, dataclasses.replace(cfg, n_bits=cfg.n_bits + 1), fusion_cfg)


def test_a_model_of_another_width_than_the_bits_asked_for_is_refused(tiny, registry):
    """Heads of 17 columns for 16 bits were trained, scored and recorded as 16-bit codes (the row's distinct
    codes counted 17 bits; only an index refused them, naming an index not yet made): refused once trained,
    before anything is saved or scored."""
    register(WideHeads)
    cfg = hash_config("wide-heads", n_bits=16, hidden=32, epochs=1, device="cpu", method_params={"temperatures": "0.3"})
    with pytest.raises(ValueError, match=re.escape("method 'wide-heads': its model's head_outputs gave image outputs of "
                                                   "shape [2, 17] for 2 items, not [2, 16] (16 bits asked for)")):
        fit_hashing(tiny, cfg, progress=False)
    with pytest.raises(ValueError, match=re.escape("method 'wide-heads': its model has no head_outputs and no "
                                                   "modality_logits (scores read head_outputs, an index")):
        check_code_width(cfg, torch.nn.Linear(tiny.d_img, 16), tiny.train)  # one a closed-form fit may return


def test_a_name_two_packages_register_is_neither_s(tmp_path, monkeypatch, registry):
    """Two installed packages registering one name: the first loaded was the method, the other a warning, and
    the runs of one were reused as the other's (a run's identity names the method, not its package). Neither
    is loaded now, and asking for it says why."""
    for module in ("first_pkg", "second_pkg"):
        (tmp_path / f"{module}.py").write_text(
            "from ucmfh.methods import register\nfrom ucmfh.methods.two_tower import TwoTower\n\n"
            "@register\nclass Same(TwoTower):\n    name = 'same-name'\n")
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    points = [metadata.EntryPoint("same-name", module, "ucmfh.methods") for module in ("first_pkg", "second_pkg")]
    assert load_plugins(points) == [] and "same-name" not in METHODS and "same-name" not in PLUGINS
    assert PLUGIN_ERRORS["same-name"] == ("registered by 2 installed packages (first_pkg, second_pkg): neither is "
                                          "loaded, as a run of one would be taken for the other's; uninstall one")
    with pytest.raises(ValueError, match=r"unknown method 'same-name'; .*not loaded: same-name \(registered by 2"):
        hash_config("same-name")
