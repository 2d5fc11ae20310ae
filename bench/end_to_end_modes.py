"""``bench.end_to_end``'s modes: what each name runs (``generate``'s mode, loop and the model's compiler),
the variants asked for by name only, and each device-loop mode's twin in the Python loop."""

MODES = {  # name -> (generate's mode, loop, compiled with: None (eager), "inductor" or "specfold")
    "vanilla": ("vanilla", "host", None),
    "vanilla_device": ("vanilla", "device", None),
    "spiffy": ("spiffy", "host", None),
    "spiffy_device": ("spiffy", "device", None),
    "spiffy_compiled": ("spiffy", "host", "inductor"),
    "spiffy_compiled_device": ("spiffy", "device", "inductor"),
    "specfold": ("spiffy", "host", "specfold"),
    "specfold_device": ("spiffy", "device", "specfold"),
}
CPU_MODES = ("vanilla", "vanilla_device", "spiffy", "spiffy_device")
HOST_TWIN = {"vanilla_device": "vanilla", "spiffy_device": "spiffy", "spiffy_compiled_device": "spiffy_compiled",
             "specfold_device": "specfold"}
# on request only: a device-loop mode launching K steps before each read (generate's steps_per_read)
AHEAD = {f"{name}_read{k}": spec for name, spec in MODES.items() if spec[1] == "device" for k in (2, 4, 8)}
HOST_TWIN.update({name: HOST_TWIN[name.rsplit("_read", 1)[0]] for name in AHEAD})
# on request only: a mode with its block boundaries fused (generate's fuse_boundaries=True)
FUSED = {f"{name}_fused": spec for name, spec in MODES.items()}
# on request only: a mode whose prompt's prefill is launched and copied into the static cache
# (VerifyGraphs(capture_prefill=False)), as generate(cuda_graphs=True) ran it before prefills were replayed
LAUNCHED_PREFILL = {f"{name}_launched_prefill": spec for name, spec in MODES.items()}
HOST_TWIN.update({f"{name}_launched_prefill": f"{twin}_launched_prefill" for name, twin in HOST_TWIN.items()
                  if name in MODES})
HOST_TWIN.update({f"{name}_fused": f"{twin}_fused" for name, twin in HOST_TWIN.items() if name in MODES})
SPECS = {**MODES, **AHEAD, **FUSED, **LAUNCHED_PREFILL}


def steps_per_read(mode: str) -> int:
    return int(mode.rsplit("_read", 1)[1]) if mode in AHEAD else 1


def fuse_boundaries(mode: str) -> bool:
    return mode in FUSED
