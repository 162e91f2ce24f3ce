"""Host staging on the CPU: the default is a passthrough; ``pooled=True`` runs the GPU path's buffer
handling (reuse, sizes, dtypes) with synchronous copies, since no CUDA stream exists here."""

import pytest
import torch

from potluck.model import staging as st
from potluck.model.staging import HostPool, Staging


def test_cpu_staging_is_a_passthrough():
    s = Staging(torch.device("cpu"))
    assert not s.pooled and not s.cuda and s.stream is None
    t = torch.randn(3, 4)
    out = s.to_host(t)
    assert out.tensor.data_ptr() == t.data_ptr() and not out.pending  # no copy
    assert out.wait() is out.tensor
    out.release()
    assert s.to_device(t) is t
    assert s.to_device(t, torch.float32) is t
    assert s.pool.allocated == 0


def test_cpu_staging_makes_a_strided_tensor_contiguous():
    t = torch.randn(4, 6).t()
    out = Staging(torch.device("cpu")).to_host(t).wait()
    assert out.is_contiguous() and torch.equal(out, t)


def test_pooled_buffers_are_reused_by_size_and_dtype():
    s = Staging(torch.device("cpu"), pooled=True)
    a = torch.randn(2, 8, 16)
    for _ in range(5):  # a micro-batch at a time: one buffer serves them all
        out = s.to_host(a)
        assert torch.equal(out.wait(), a) and out.tensor is not a
        out.release()
    assert s.pool.allocated == 1 and s.pool.free == 1
    held = [s.to_host(a) for _ in range(3)]  # three in flight at once: three buffers
    assert s.pool.allocated == 3
    for h in held:
        h.release()
    s.to_host(a.to(torch.bfloat16)).release()  # another dtype: another buffer
    s.to_host(torch.randn(2, 8, 8)).release()  # another size: another buffer
    assert s.pool.allocated == 5


def test_a_buffer_is_the_same_memory_under_a_new_shape_of_equal_size():
    pool = HostPool(pin=False)
    buf = pool.take((4, 6), torch.float32)
    pool.give(buf)
    again = pool.take((2, 12), torch.float32)
    assert again.shape == (2, 12) and again.data_ptr() == buf.data_ptr()


def test_the_pool_keeps_a_bounded_number_of_free_buffers():
    pool = HostPool(pin=False)
    bufs = [pool.take((16,), torch.float32) for _ in range(st.MAX_FREE_PER_SHAPE + 3)]
    for b in bufs:
        pool.give(b)
    assert pool.free == st.MAX_FREE_PER_SHAPE


def test_a_received_buffer_goes_back_only_through_to_device_and_the_caller_gets_a_copy():
    s = Staging(torch.device("cpu"), pooled=True)
    buf = s.host_buffer((2, 3))
    buf.copy_(torch.arange(6.0).view(2, 3))
    x = s.to_device(buf)
    assert torch.equal(x, torch.arange(6.0).view(2, 3)) and x.data_ptr() != buf.data_ptr()
    again = s.host_buffer((2, 3))  # the same buffer again, and x is not overwritten by reusing it
    assert again.data_ptr() == buf.data_ptr()
    again.fill_(7.0)
    assert torch.equal(x, torch.arange(6.0).view(2, 3))


def test_to_device_converts_dtype_and_leaves_foreign_tensors_alone():
    s = Staging(torch.device("cpu"), pooled=True)
    ids = torch.arange(8).view(2, 4)  # token ids from the dataset: not the pool's
    assert s.to_device(ids) is ids
    assert s.pool.free == 0
    buf = s.host_buffer((4,), torch.float32)
    buf.fill_(1.5)
    y = s.to_device(buf, torch.bfloat16)
    assert y.dtype == torch.bfloat16 and torch.equal(y, torch.full((4,), 1.5, dtype=torch.bfloat16))
    assert s.pool.free == 1


def test_pinning_falls_back_to_pageable_memory_when_refused(monkeypatch):
    def refuse(self):
        raise RuntimeError("Found no NVIDIA driver on your system")

    monkeypatch.setattr(torch.Tensor, "pin_memory", refuse)
    pool = HostPool(pin=True)
    buf = pool.take((8,), torch.float32)
    assert buf.shape == (8,) and pool.pinned == 0 and not pool.pin  # asked once, then not again
    pool.take((8,), torch.float32)
    assert pool.allocated == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_round_trip_through_pinned_buffers():
    s = Staging(torch.device("cuda"))
    t = torch.randn(64, 128, device="cuda")
    out = s.to_host(t)
    assert out.pending and out.tensor.is_pinned()
    assert torch.equal(out.wait(), t.cpu())
    out.release()
    buf = s.host_buffer((64, 128))
    buf.copy_(t.cpu())
    assert torch.equal(s.to_device(buf), t)
