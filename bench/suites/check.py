"""The ``check`` suite: SPEC P1/P4 (docs/SPEC.md) of the compiled model at real shapes in bf16 (Triton
kernels), judged against an fp32 copy, and a CUDA-graph capture of the folded forward replayed with new
inputs and parents (no host sync)."""

from __future__ import annotations

import torch

from specfold_compile.backend import SpecFoldSettings, collect_stats, compile_graph, specfold_backend
from specfold_compile.models import build
from specfold_compile.ops import fold_ops
from specfold_compile.reference import folded_verify

from ._context import TAU, BenchContext, rel, tuning

_FOLD_OPS = (fold_ops.FOLD_GATE, fold_ops.FOLDED_ATTENTION, fold_ops.PACKED_LINEAR, fold_ops.PACKED_SILU_MUL)


def _impl(node) -> str:
    """The fold op's ``impl`` argument ("torch" / "triton"), found by name in its schema."""
    names = [a.name for a in node.target._schema.arguments]
    index = names.index("impl")
    return node.args[index] if index < len(node.args) else node.kwargs["impl"]


def op_counts(graphs) -> dict:
    """How many fold ops (and leftover dense linears) the rewritten graphs run, with which kernels."""
    counts: dict = {}
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            if node.target in _FOLD_OPS:
                key = f"{node.target.name()}[{_impl(node)}]"
            elif node.target in (torch._C._nn.linear, torch.nn.functional.linear):
                key = "dense linear"
            else:
                continue
            counts[key] = counts.get(key, 0) + 1
    return counts


def _graph_replay_errors(ctx: BenchContext, model, compiled, tokens, parents, cache) -> list[float]:
    """Capture the compiled folded forward once; replay it with other tokens and parents written into
    its static inputs; compare with a plain call on the same inputs."""
    static_tokens, static_parents = tokens.clone(), parents.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            compiled(static_tokens, static_parents, cache)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = compiled(static_tokens, static_parents, cache)
    errs = []
    for seed in range(3):
        t2, _ = ctx.inputs(model, tokens.shape[0], 3 + seed, 10 + seed)
        p2 = torch.tensor([-1] + [int(torch.randint(0, n, (1,))) for n in range(1, tokens.shape[0])],
                          device=ctx.device)
        static_tokens.copy_(t2)
        static_parents.copy_(p2)
        graph.replay()
        errs.append(rel(static_out, compiled(t2, p2, cache)))
    return errs


def run(args, ctx: BenchContext) -> list[dict]:
    """bf16 results judged against an fp32 copy of the same model: the compiled folded forward must be
    no further from fp32 than the bf16 dense forward (resp. bf16 reference) is, i.e. only rounding."""
    rows = []
    # every multi-branch call folded: the check is about the folded forward (the default cost model
    # runs the plain graph at N = 9 on the 1.5B shape)
    fold_all = tuning(args, fold_min_branches=2)
    for name in ("fast-dllm-v2-1.5b", "nld-3b"):
        torch._dynamo.reset()
        model = ctx.model(args, name)
        model32 = build(name, device=ctx.device, dtype=torch.float32, seed=None, **ctx.shapes.get(name, {}))
        model32.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        cache, cache32 = ctx.prefix(model, 512, 1), ctx.prefix(model32, 512, 1)
        tokens, parents = ctx.inputs(model, 9, 4, 2)
        with torch.no_grad():
            dense, dense32 = model(tokens, parents, cache), model32(tokens, parents, cache32)
            c0 = torch.compile(model, backend=specfold_backend,
                               options={"tau": 0.0, "kernels": ctx.kernels, "tuning": fold_all})
            p1 = rel(ctx.first_call(lambda: c0(tokens, parents, cache))[0], dense32)
            p1_dense = rel(dense, dense32)
            torch._dynamo.reset()
            rewritten: list = []

            def backend(gm, example_inputs):  # specfold, keeping the rewritten graph to count its ops
                gm = compile_graph(gm, SpecFoldSettings(tau=TAU, kernels=ctx.kernels, tuning=fold_all))
                rewritten.append(gm)
                if ctx.device == "cuda":  # as specfold_backend does by default on CUDA
                    from torch._inductor.compile_fx import compile_fx

                    return compile_fx(gm, example_inputs)
                return gm.forward

            ct = torch.compile(model, backend=backend)
            with collect_stats() as s:
                out, _ = ctx.first_call(lambda: ct(tokens, parents, cache))
            graph_ops = op_counts(rewritten)
            ref, _ = folded_verify(model, tokens, parents, cache, TAU, fold_masks=s.fold_masks)
            ref32, _ = folded_verify(model32, tokens, parents, cache32, TAU, fold_masks=s.fold_masks)
            p4, p4_ref = rel(out, ref32), rel(ref, ref32)
            p2 = rel(out[0], dense32[0])
            replay_errs = _graph_replay_errors(ctx, model, ct, tokens, parents, cache) if ctx.device == "cuda" \
                else [0.0]
        ok = p1 <= 1.5 * p1_dense + 1e-3 and p4 <= 1.5 * p4_ref + 1e-3 and max(replay_errs) < 1e-3
        rows.append({"model": name, "P1_vs_fp32": p1, "dense_bf16_vs_fp32": p1_dense, "P2_main_vs_fp32": p2,
                     "P4_vs_fp32_ref": p4, "bf16_ref_vs_fp32_ref": p4_ref, "recompute_ratio": s.recompute_ratio,
                     "cuda_graph_replay_vs_call": max(replay_errs), "graph_ops": graph_ops, "ok": ok})
        print(rows[-1], flush=True)
        del model, model32, cache, cache32
        ctx.empty_cache()
    return rows
