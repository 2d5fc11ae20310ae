"""``decoding.dynamic``: a decode through a SpecFold-compiled forward folds whatever other model (of
another block length) the process compiled before: the block length stays static for Dynamo."""
import torch

from specfold_compile import SpecFoldBackend
from specfold_compile.backend import fold_launched_calls
from specfold_compile.decoding.device_loop import decode_on_device
from specfold_compile.decoding.graph import default_draft_graph, load_draft_graph
from specfold_compile.models import build
from specfold_compile.ops.fold_masks import recorded_fold_masks


def _folded_gates(model) -> int:
    B = model.config.block_size
    graph = load_draft_graph(default_draft_graph(B), B)
    forward = torch.compile(model, backend=SpecFoldBackend(tau=0.2, kernels="torch", fold_min_branches=2))
    with fold_launched_calls(), recorded_fold_masks() as masks:
        decode_on_device(model, torch.tensor([7, 19, 3, 88, 41], dtype=torch.long), "spiffy", 2 * B, 0.3, 6,
                         graph, False, forward=forward, compile_step=False)
    return len(masks)


def test_models_of_two_block_lengths_both_fold():
    torch._dynamo.reset()
    try:
        for block, sub in ((16, 8), (32, 8), (16, 4)):
            model = build("tiny-fast-dllm-v2", seed=0, block_size=block, sub_block_size=sub)
            assert _folded_gates(model) > 0, f"block {block}: no gate ran (the graph ran unfolded)"
    finally:
        torch._dynamo.reset()
