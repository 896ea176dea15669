"""tests/dispatch_counter.py counts what it is meant to: a hand-countable run of operations, one step of a
linear model with SGD (forward, backward and update), and under the CUDA stand-in the operations on ``cuda``
apart from the host's, CUDA's branch of the optimizer included."""
from __future__ import annotations

import torch

from cuda_standin import cuda_standin, on_cuda, running_on_cuda
from dispatch_counter import DispatchCounter


def _on_the_standin() -> DispatchCounter:
    return DispatchCounter(on_cuda, lambda kwargs: running_on_cuda())


def test_a_known_run_of_operations_gives_its_counts():
    a, b = torch.randn(4, 3), torch.randn(3, 2)
    with DispatchCounter() as counter:
        y = a @ b
        z = (y + 1).relu()
        z.t()
        torch.empty(3)
        z.sum().item()
    assert counter.host == {"aten.mm": 1, "aten.add": 1, "aten.relu": 1, "aten.sum": 1,
                            "aten._local_scalar_dense": 1}
    assert counter.free == {"aten.t": 1, "aten.empty": 1} and counter.device == {} and counter.kernels == 0


def test_one_sgd_step_of_a_linear_model_counts_its_forward_backward_and_update():
    torch.manual_seed(0)
    model, x = torch.nn.Linear(3, 2), torch.randn(4, 3)
    for foreach, update in ((False, {"aten.add_": 2}), (True, {"aten._foreach_add_": 1})):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, foreach=foreach)
        with DispatchCounter() as forward:
            loss = model(x).sum()
        with DispatchCounter() as backward:
            loss.backward()
        with DispatchCounter() as step:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        assert forward.host == {"aten.addmm": 1, "aten.sum": 1} and forward.free == {"aten.t": 1}
        # the seed gradient, the weight's (x.T @ grad) and the bias's (a sum over the batch)
        assert backward.host == {"aten.ones_like": 1, "aten.mm": 1, "aten.sum": 1}
        assert step.host == update  # one update per parameter, or one for all


def test_on_the_standin_device_operations_are_told_from_the_host_s(monkeypatch):
    with cuda_standin(monkeypatch) as stats:
        x = torch.randn(4, 3).to("cuda")
        with _on_the_standin() as counter:
            host = x.sum().cpu()  # on the device, then a copy to the host
            host * 2  # on the host
            torch.zeros(2, device="cuda")  # a factory asked for the device
            torch.where(x >= 0, 1.0, -1.0)  # its two scalars made on the device, below the stand-in
    assert counter.device == {"aten.sum": 1, "aten._to_copy": 1, "aten.zeros": 1, "aten.ge": 1, "aten.where": 1,
                              "aten.scalar_tensor": 2}
    assert counter.host == {"aten.mul": 1} and stats["syncs"] == 1


def _adamw_step(device: str, counter: DispatchCounter) -> DispatchCounter:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(8, 3).to(device)
    with counter:
        optimizer.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        optimizer.step()
    return counter


def test_on_the_standin_the_cuda_branch_of_a_step_is_counted(monkeypatch):
    """AdamW takes its foreach update on CUDA and a loop over the parameters on the CPU: the stand-in's count
    is CUDA's, and the step's forward and backward are all on the device."""
    cpu = _adamw_step("cpu", DispatchCounter())
    with cuda_standin(monkeypatch):
        cuda = _adamw_step("cuda", _on_the_standin())
    assert not any(name.startswith("aten._foreach") for name in cpu.host) and cpu.host["aten.lerp_"] == 4
    assert cuda.device["aten._foreach_lerp_"] == 1 and "aten.lerp_" not in cuda.device
    for name in ("aten.addmm", "aten.mm", "aten.mean", "aten.ones_like"):
        assert cuda.device[name] == cpu.host[name] and name not in cuda.host, name
