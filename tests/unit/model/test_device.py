"""Device names, precision and memory caps, on the CPU. Where a test needs CUDA to "exist" it
monkeypatches ``torch.cuda.is_available`` / ``device_count`` / ``current_device`` (no GPU is touched)."""

import pytest
import torch
import typer

from potluck.cli.peer_cmd import _parse_bytes
from potluck.model import device as dev
from potluck.model.errors import DeviceError
from potluck.peer import probe
from potluck.protocol.records import Hardware


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("auto", ("auto", None)),
        ("cpu", ("cpu", None)),
        ("cuda", ("cuda", None)),
        ("cuda:3", ("cuda", 3)),
        (" CUDA:0 ", ("cuda", 0)),
        ("mps", ("mps", None)),
    ],
)
def test_device_names_parse(text, want):
    assert dev.parse_device(text) == want


@pytest.mark.parametrize("text", ["gpu", "cuda:", "cuda:-1", "cpu:1", "mps:0", "xla", ""])
def test_bad_device_names_are_refused_with_the_accepted_forms(text):
    with pytest.raises(DeviceError, match="auto, cpu, cuda, cuda:N or mps"):
        dev.parse_device(text)


def _fake_cuda(monkeypatch, count: int) -> None:
    """Pretend ``count`` CUDA devices exist (0: none); nothing here allocates on one."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_auto_picks_cuda_when_present(monkeypatch):
    _fake_cuda(monkeypatch, 2)
    assert dev.resolve_device("auto") == torch.device("cuda", 0)
    assert dev.resolve_device("cuda") == torch.device("cuda", 0)
    assert dev.resolve_device("cuda:1") == torch.device("cuda", 1)


def test_auto_falls_back_to_the_cpu_without_a_gpu(monkeypatch):
    _fake_cuda(monkeypatch, 0)
    monkeypatch.setattr(dev, "_mps_available", lambda: False)
    assert dev.resolve_device("auto") == torch.device("cpu")
    assert dev.resolve_device("cpu") == torch.device("cpu")


def test_cuda_without_a_gpu_is_an_error_that_says_so(monkeypatch):
    _fake_cuda(monkeypatch, 0)
    with pytest.raises(DeviceError, match=r"--device cuda:.*(without CUDA|no GPU is visible).*--device cpu"):
        dev.resolve_device("cuda")


def test_a_cuda_index_beyond_the_cards_is_an_error(monkeypatch):
    _fake_cuda(monkeypatch, 2)
    with pytest.raises(DeviceError, match="2 CUDA device"):
        dev.resolve_device("cuda:2")


def test_mps_must_exist(monkeypatch):
    monkeypatch.setattr(dev, "_mps_available", lambda: False)
    with pytest.raises(DeviceError, match="mps"):
        dev.resolve_device("mps")


def test_pick_device_on_this_machine_is_the_cpu_or_a_visible_gpu():
    got = probe.pick_device("auto")
    assert got.type == ("cuda" if torch.cuda.is_available() else got.type)
    assert probe.pick_device("cpu") == torch.device("cpu")


def test_precision_auto_is_bf16_on_cuda_only():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert dev.autocast_dtype(cuda, "auto") is torch.bfloat16
    assert dev.autocast_dtype(cpu, "auto") is None
    assert dev.autocast_dtype(cpu, "bf16") is torch.bfloat16
    assert dev.autocast_dtype(cuda, "fp32") is None
    with pytest.raises(DeviceError, match="fp16"):
        dev.autocast_dtype(cpu, "fp16")


@pytest.mark.parametrize(
    ("text", "want"),
    [("6GB", 6 * 10**9), ("512MiB", 512 * 2**20), ("1.5 GiB", int(1.5 * 2**30)), ("2000000000", 2 * 10**9)],
)
def test_max_memory_sizes_parse(text, want):
    assert _parse_bytes(text) == want


@pytest.mark.parametrize("text", ["6 parsecs", "GB", "-1GB", "100KB"])
def test_bad_max_memory_sizes_are_refused(text, capsys):
    with pytest.raises(typer.Exit):
        _parse_bytes(text)
    assert "--max-memory" in capsys.readouterr().err


def test_memory_fraction_is_the_share_of_the_card_at_most_one():
    assert dev.memory_fraction(8 * 2**30, 32 * 2**30) == 0.25
    assert dev.memory_fraction(64 * 2**30, 32 * 2**30) == 1.0
    with pytest.raises(DeviceError):
        dev.memory_fraction(0, 10)


def test_cap_memory_sets_the_allocator_fraction_on_that_card(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: calls.append((f, d)))
    assert dev.cap_memory(torch.device("cpu"), 10, 100) is None  # host memory: announced, not capped
    assert dev.cap_memory(torch.device("cuda", 1), 24 * 10**9, 80 * 10**9) == 0.3
    assert calls == [(0.3, torch.device("cuda", 1))]


def _hw(kind: str, free: int, total: int) -> Hardware:
    return Hardware(
        device_kind=kind,  # type: ignore[arg-type]
        device_name="test",
        memory_total_bytes=total,
        memory_free_bytes=free,
        cpu_cores=2,
        tflops_fp32=1.0,
        tflops_bf16=2.0,
    )


def test_the_cap_is_announced_in_the_hardware_record_and_capped_on_cuda(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: calls.append((f, d)))
    gpu = _hw("cuda", free=70 * 10**9, total=80 * 10**9)
    capped = probe.apply_caps(gpu, None, 20 * 10**9, torch.device("cuda", 0))
    assert capped.memory_free_bytes == 20 * 10**9  # what the planner fits stages into
    assert calls == [(0.25, torch.device("cuda", 0))]
    cpu = probe.apply_caps(_hw("cpu", 8 * 10**9, 16 * 10**9), None, 4 * 10**9, torch.device("cpu"))
    assert cpu.memory_free_bytes == 4 * 10**9 and len(calls) == 1
    assert probe.apply_caps(gpu, None, None) is gpu  # no cap: as probed
