"""The start-up probe's budget."""

import time

import pytest
import torch

from potluck.peer import probe


def test_a_slow_cpu_product_stops_the_probe_at_its_budget_not_four_products_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = torch.matmul
    calls: list[float] = []

    def slow(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # bf16 on a CPU without it: 0.2 s
        calls.append(time.perf_counter())
        time.sleep(0.1)
        return real(a[:2, :2], b[:2, :2])

    monkeypatch.setattr(probe.torch, "matmul", slow)
    tflops = probe.matmul_tflops(torch.device("cpu"), torch.float32, 0.05, size=8)
    assert len(calls) == 2, calls  # the warm-up and one timed product, which is over the budget
    assert 0.0 < tflops < 1e-6
