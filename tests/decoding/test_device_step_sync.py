"""A device-loop step reads nothing back to the host: every op of ``DeviceDecoder._run`` (the forward, the
bookkeeping, a trace's forcing) runs under a mode that fails on any device-to-host read. On the CPU a
dispatch mode catches ``aten._local_scalar_dense`` (``item``, ``bool``, ``int``) and ops whose output
shape depends on data (``nonzero``, ``masked_select``, ...) and a function mode catches ``tolist`` and
``numpy`` (which bypass the dispatcher); on CUDA ``torch.cuda.set_sync_debug_mode("error")`` catches any
synchronising call."""

import contextlib

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from specfold_compile.decoding.device_loop import DeviceDecoder, decode_on_device
from specfold_compile.decoding.graph import default_draft_graph, load_draft_graph
from specfold_compile.decoding.step_forcing import StepForcing, StepRecorder
from specfold_compile.models import build

aten = torch.ops.aten
HOST_READS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
              aten.unique_dim.default, aten._unique2.default, aten.unique_consecutive.default}


class HostReadError(AssertionError):
    pass


class _NoHostReadDispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS:
            raise HostReadError(f"a step read the device: {func}")
        return func(*args, **(kwargs or {}))


class _NoHostReadFunctions(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.item):
            raise HostReadError(f"a step read the device: {func.__name__}")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def no_host_reads(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")
    else:
        with _NoHostReadFunctions(), _NoHostReadDispatch():
            yield


class StepGuard:
    """``enable()``: from then on ``DeviceDecoder._run`` runs under ``no_host_reads``; ``checked`` lists the
    row count of every step it checked."""

    def __init__(self, monkeypatch):
        self.monkeypatch, self.checked = monkeypatch, []

    def enable(self):
        run = DeviceDecoder._run

        def guarded(decoder, n, width, cache):
            with no_host_reads(decoder.buffers.rows.device):
                out = run(decoder, n, width, cache)
            self.checked.append(n)
            return out
        self.monkeypatch.setattr(DeviceDecoder, "_run", guarded)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _decode(model, prompt, mode, trace=None, steps_per_read=1):
    B = model.config.block_size
    graph = load_draft_graph(default_draft_graph(B), B)
    return decode_on_device(model, prompt, mode, 24, 0.3, 6 if mode == "spiffy" else 0,
                            graph if mode == "spiffy" else None, True, trace=trace, compile_step=False,
                            steps_per_read=steps_per_read)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["tiny-fast-dllm-v2", "tiny-nld"])
@pytest.mark.parametrize("mode", ["vanilla", "spiffy"])
def test_a_step_reads_nothing_back(monkeypatch, device, family, mode):
    model = build(family, seed=0, device=device)
    prompt = torch.tensor([5, 9, 33, 70, 2, 14], dtype=torch.long, device=device)
    record = StepRecorder()  # snapshots to the host inside each step, by design: run unguarded
    recorded = _decode(model, prompt, mode, trace=record)
    guard = StepGuard(monkeypatch)
    guard.enable()
    plain = _decode(model, prompt, mode)
    assert plain.tokens == recorded.tokens
    assert len(guard.checked) == plain.num_calls > 1 and (mode == "vanilla" or max(guard.checked) > 1)
    # a forced replay's steps (the trace's before/after inside each step) read nothing either
    forced = _decode(model, prompt, mode, trace=StepForcing(record.steps, record.seeds, torch.device(device)))
    assert forced.tokens == plain.tokens and len(guard.checked) == 2 * plain.num_calls
    # steps launched ahead (a step after its block's last one gated on the device) read nothing either
    ahead = _decode(model, prompt, mode, steps_per_read=3)
    assert ahead.tokens == plain.tokens and len(guard.checked) >= 3 * plain.num_calls


def test_the_guard_catches_a_host_read(monkeypatch):
    """The check can fail: a step that reads a value back is caught."""
    bookkeeping = DeviceDecoder._bookkeeping

    def reads_back(self, conf, *args):
        float(conf.max())
        return bookkeeping(self, conf, *args)
    monkeypatch.setattr(DeviceDecoder, "_bookkeeping", reads_back)
    StepGuard(monkeypatch).enable()
    model = build("tiny-fast-dllm-v2", seed=0)
    with pytest.raises(HostReadError):
        _decode(model, torch.tensor([5, 9, 33], dtype=torch.long), "vanilla")
