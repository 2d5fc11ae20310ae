"""models.protocol declares exactly what decoding calls on a model: a recording proxy around the real
model sees generate and VerifyGraphs use those members and no others; the package's models, their
torch.compile wrappers and the tests' fake model fit the protocols; decoding never unwraps a compiled
model."""

from pathlib import Path

import torch
from decoding_fake_model import FakeModel

import specfold_compile.decoding as decoding
from specfold_compile.decoding import VerifyGraphs, generate
from specfold_compile.models.protocol import DecodingConfig, DecodingModel, StaticCacheModel, VerifyForward


def _members(protocol) -> set[str]:
    """The protocol's declared attributes and methods, its bases' included."""
    names = set()
    for cls in protocol.__mro__:
        if cls in (DecodingModel, StaticCacheModel, DecodingConfig):
            names |= set(getattr(cls, "__annotations__", {}))
            names |= {n for n, v in vars(cls).items() if callable(v) and (not n.startswith("_") or n == "__call__")}
    return names


class _Recorder:
    """Forwards everything to ``target`` and records the names read on it (and on its config)."""

    def __init__(self, target, seen, prefix=""):
        self.__dict__.update(_target=target, _seen=seen, _prefix=prefix)

    def __getattr__(self, name):
        self._seen.add(self._prefix + name)
        value = getattr(self._target, name)
        return _Recorder(value, self._seen, "config.") if name == "config" else value

    def __call__(self, *args, **kwargs):
        self._seen.add(self._prefix + "__call__")
        return self._target(*args, **kwargs)


def test_generate_and_verify_graphs_call_exactly_the_declared_members(model):
    ids = torch.arange(3, 40) % model.config.vocab_size
    seen: set[str] = set()
    generate(_Recorder(model, seen), ids, mode="spiffy", max_new_tokens=40, draft_budget=8)
    calls = {n for n in seen if not n.startswith("config.")}
    assert calls == _members(DecodingModel), calls
    config_reads = {n.removeprefix("config.") for n in seen if n.startswith("config.")}
    assert config_reads <= _members(DecodingConfig), config_reads

    proxy = _Recorder(model, seen)
    model.__dict__["_compiled_methods"] = {  # compiled writes without Inductor's C++ compile
        name: torch.compile(getattr(model, name), backend="aot_eager")
        for name in ("prefill_block_causal", "append_block", "append_block_static", "prefill_static")}
    try:
        for capture_writes, compile_writes, capture_prefill in ((True, True, True), (True, False, True),
                                                               (False, False, False), (True, True, False)):
            generate(proxy, ids, mode="spiffy", max_new_tokens=40, draft_budget=8, compile_writes=compile_writes,
                     cuda_graphs=VerifyGraphs(proxy, replay="eager", capture_writes=capture_writes,
                                              capture_prefill=capture_prefill))
    finally:
        model.__dict__.pop("_compiled_methods")
    calls = {n for n in seen if not n.startswith("config.")}
    assert calls == _members(StaticCacheModel), calls
    assert {n.removeprefix("config.") for n in seen if n.startswith("config.")} <= _members(DecodingConfig)

def test_models_and_compiled_wrappers_fit_the_protocols(model):
    compiled = torch.compile(model, backend="eager")
    for target in (model, compiled):
        assert isinstance(target, StaticCacheModel) and isinstance(target, DecodingModel)
        assert isinstance(target, VerifyForward)
    assert compiled.static_cache == model.static_cache  # reached through torch's attribute forwarding
    fake = FakeModel()
    assert isinstance(fake, DecodingModel) and not isinstance(fake, StaticCacheModel)


def test_decoding_never_unwraps_a_compiled_model():
    for path in Path(decoding.__file__).parent.glob("*.py"):
        assert "_orig_mod" not in path.read_text(), path.name
