"""The optimizers of ``ucmfh.optim``: SGD's fused kernel makes, on the CPU, the update of the per-tensor loop to
the bit (the field's SGD methods' models stay those they were: scripts/model_fingerprints.py), with momentum
and weight decay, parameter groups of their own learning rates, and parameters left without a gradient."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from ucmfh.optim import sgd


def _heads():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 16)), nn.Linear(24, 16)


@pytest.mark.parametrize("momentum, weight_decay", [(0.9, 5e-4), (0.0, 0.0), (0.9, 0.0)])
def test_fused_sgd_makes_the_loop_s_update_to_the_bit(momentum, weight_decay):
    runs = []
    for make in (lambda groups: torch.optim.SGD(groups, lr=0.01, momentum=momentum, weight_decay=weight_decay,
                                                foreach=False),
                 lambda groups: sgd(groups, lr=0.01, momentum=momentum, weight_decay=weight_decay)):
        img, txt = _heads()
        optimizer = make([{"params": img.parameters(), "lr": 0.001}, {"params": txt.parameters()}])
        generator = torch.Generator().manual_seed(1)
        for step in range(12):
            x = torch.randn(8, 24, generator=generator)
            optimizer.zero_grad(set_to_none=True)
            loss = img(x).tanh().pow(2).sum() + 3.0 * img(x).mean()
            if step % 3:  # the text head has no gradient every third step: left as it is, its momentum too
                loss = loss + txt(x).tanh().sum()
            loss.backward()
            optimizer.step()
        runs.append((optimizer, [p.detach().clone() for p in (*img.parameters(), *txt.parameters())]))
    (loop, want), (fused, got) = runs
    assert all(g["fused"] for g in fused.param_groups) and not any(g["fused"] for g in loop.param_groups)
    for a, b in zip(want, got):
        assert torch.equal(a, b)


def test_a_state_saved_by_the_loop_resumes_with_the_fused_kernel_to_the_same_model(tiny, tmp_path, monkeypatch):
    """DJSRH interrupted after two epochs, its state rewritten as an older ucmfh saved it (SGD looping over its
    tensors), resumes with the fused kernel and ends with the model of a run never stopped."""
    import ucmfh.trainer as trainer_module
    from conftest import StopAfter, method_config
    from ucmfh.methods import fit_hashing
    from ucmfh.signals import TrainingInterrupted
    from ucmfh.training_state import StateFile

    cfg = method_config("djsrh", epochs=4, val_fraction=0.0)
    reference, _ = fit_hashing(tiny, cfg, progress=False)
    bars = StopAfter(2)
    monkeypatch.setattr(trainer_module, "tqdm", bars)
    state = StateFile(str(tmp_path / "hash.state.pt"), interval_s=1e9)
    with pytest.raises(TrainingInterrupted):
        fit_hashing(tiny, cfg, progress=False, state=state)
    saved = torch.load(state.path, weights_only=False)
    assert all(group["fused"] for group in saved["optimizer"]["param_groups"])
    for group in saved["optimizer"]["param_groups"]:
        group.update(fused=None, foreach=None)  # torch's defaults: the per-tensor loop on the CPU
    torch.save(saved, state.path)
    kernels = []
    restore = trainer_module.restore_optimizer

    def seen(optimizer, saved_state):
        restore(optimizer, saved_state)
        kernels.extend(group["fused"] for group in optimizer.param_groups)

    monkeypatch.setattr(trainer_module, "restore_optimizer", seen)
    bars.epochs = None
    resumed, _ = fit_hashing(tiny, cfg, progress=False, state=StateFile(state.path, resume=True))
    assert bars.starts[-1] == 2 and kernels == [True, True]
    for (name, a), b in zip(reference.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_captured_run_s_adam_resumed_eagerly_is_not_capturable():
    """A captured step makes its Adam capturable (its step count on the device), and the state it saves says
    so; resumed by an eager run, the optimizer keeps its own setting (PyTorch warns of, and slows, a capturable
    Adam run outside a capture), with the saved moments and step count."""
    from ucmfh.optim import adam
    from ucmfh.trainer import restore_optimizer

    weight = torch.nn.Parameter(torch.ones(3))
    captured = adam([weight], lr=0.1)
    for group in captured.param_groups:
        group["capturable"] = True
    weight.grad = torch.ones(3)
    captured.step()
    eager = adam([weight], lr=0.1)
    restore_optimizer(eager, captured.state_dict())
    assert [group["capturable"] for group in eager.param_groups] == [False]
    assert torch.equal(eager.state[weight]["exp_avg"], captured.state[weight]["exp_avg"])
    assert float(eager.state[weight]["step"]) == 1.0
