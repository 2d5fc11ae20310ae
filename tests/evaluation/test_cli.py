"""``specfold eval`` and ``specfold sweep`` end to end on a couple of problems."""
import csv
import json

import pytest

from specfold_compile.cli import main
from specfold_compile.eval import RESULT_KEYS, sweep_columns


def test_eval_writes_schema_and_spiffy_is_lossless(tmp_path, capsys):
    out = tmp_path / "eval.json"
    rc = main(["eval", "--tasks", "math", "--modes", "vanilla,spiffy,specfold", "--limit", "2",
               "--max-new-tokens", "48", "--out", str(out), "--quiet"])
    assert rc == 0
    d = json.loads(out.read_text())
    assert set(d["results"]) == {"math"}
    assert set(d["results"]["math"]) == {"vanilla", "spiffy", "specfold"}
    for mode, r in d["results"]["math"].items():
        assert set(RESULT_KEYS) <= set(r)
        assert r["n"] == 2 and 0.0 <= r["accuracy"] <= 1.0 and r["nfe"] >= 2 and r["tokens_per_s"] > 0
        assert (r["recompute_ratio"] is not None) == (mode == "specfold")
    assert 0.0 <= d["results"]["math"]["specfold"]["recompute_ratio"] <= 1.0
    assert d["results"]["math"]["vanilla"]["branches_per_call"] == 1.0
    assert d["spiffy_tokens_equal_vanilla"] == {"math": True}
    assert d["model"] and d["compile_seconds"] is not None and d["compile_seconds"] > 0
    assert {"python", "torch", "triton", "platform"} <= set(d["versions"])
    assert d["settings"]["tau"] == 0.1 and d["settings"]["limit"] == 2
    assert "accuracy" in capsys.readouterr().out


def test_eval_fold_head_reaches_the_backend(tmp_path, monkeypatch):
    """``--fold-head`` compiles SpecFold with options["fold_head"], asks it for every position's logits
    (the head gate runs on every row; with only the masked rows' logits it could not) and says so in the
    report. Without it, SpecFold gets the masked positions only."""
    from specfold_compile.eval import run

    seen, selected = [], []
    original = run.compiled_model

    class Spy:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def __call__(self, tokens, parents, cache, logit_positions=None):
            selected.append(logit_positions is not None)
            return self.inner(tokens, parents, cache, logit_positions)

    def recording(model, tau, kernels="torch", fold_head=False):
        seen.append(fold_head)
        return Spy(original(model, tau, kernels, fold_head))

    monkeypatch.setattr(run, "compiled_model", recording)
    for flag, want in (([], False), (["--fold-head"], True)):
        out = tmp_path / f"eval_{want}.json"
        selected.clear()
        rc = main(["eval", "--tasks", "math", "--modes", "specfold", "--limit", "1", "--max-new-tokens", "32",
                   "--out", str(out), "--quiet", *flag])
        assert rc == 0 and seen[-1] is want
        assert selected and all(s is not want for s in selected)
        d = json.loads(out.read_text())
        assert d["settings"]["fold_head"] is want and d["results"]["math"]["specfold"]["n"] == 1


def test_spiffy_equals_vanilla_tokens():
    from specfold_compile.decoding import generate
    from specfold_compile.loading import encode, load_model, resolve_draft_graph
    from specfold_compile.tasks import sample

    model = load_model(None)
    graph = resolve_draft_graph(None, None)
    for task in ("instruct", "code"):
        for p in sample(task, "test", 2, 0):
            ids = encode(model, p.prompt)
            v = generate(model, ids, mode="vanilla", max_new_tokens=64)
            s = generate(model, ids, mode="spiffy", max_new_tokens=64, draft_budget=8, draft_graph=graph)
            assert s.tokens == v.tokens
            assert s.nfe <= v.nfe


def test_sweep_writes_csv_and_png(tmp_path):
    rc = main(["sweep", "--taus", "0,0.4", "--tasks", "math", "--limit", "1", "--max-new-tokens", "48",
               "--out-dir", str(tmp_path), "--quiet"])
    assert rc == 0
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert [float(r["tau"]) for r in rows] == [0.0, 0.4]
    assert list(rows[0]) == sweep_columns(["math"])
    for col in ("accuracy_math", "tokens_per_s", "recompute_ratio", "fold_argmax_agree", "fold_relerr_median",
                "fold_relerr_p99", "copy_argmax_agree", "copy_relerr_median", "copy_relerr_p99"):
        assert col in rows[0]
    assert float(rows[0]["recompute_ratio"]) == 1.0  # tau = 0 folds nothing
    assert float(rows[0]["fold_argmax_agree"]) == 1.0  # P1
    png = (tmp_path / "sweep.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_generate_specfold_with_compiled_writes(capsys):
    """``specfold generate --mode specfold --compile-writes``: the same text as without compiled writes."""
    args = ["generate", "--prompt", "3+4=", "--max-new-tokens", "24", "--mode", "specfold"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main(args + ["--compile-writes"]) == 0
    compiled = capsys.readouterr().out
    assert "mode=specfold" in compiled
    assert compiled.split("\nmode=")[0] == plain.split("\nmode=")[0]


def test_generate_times_a_warm_run_apart_from_the_compile(capsys):
    """``specfold generate``'s time and tokens/s are a warm run's; what compiles reports its first run
    apart (``first_run_s``, which holds the compile); an eager mode has nothing to compile and one run."""
    args = ["generate", "--prompt", "3+4=", "--max-new-tokens", "24"]
    assert main(args + ["--mode", "specfold"]) == 0
    out, err = capsys.readouterr()
    stats = dict(kv.split("=") for kv in out.split("\nmode=")[1].split()[1:])
    assert float(stats["first_run_s"]) > float(stats["time"].rstrip("s"))  # the compile is not in time
    assert float(stats["tokens/s"]) == pytest.approx(int(stats["tokens"]) / float(stats["time"].rstrip("s")), rel=0.05)
    assert "first_run_s: the first run, which compiled" in err
    assert main(args + ["--mode", "vanilla"]) == 0
    assert "first_run_s" not in capsys.readouterr().out


def test_verify_graphs_for_a_replay_name():
    """The runner's ``cuda_graphs`` names: None launches, 'eager' replays through the model, 'cuda' needs
    a CUDA device."""
    from specfold_compile.eval import verify_graphs
    from specfold_compile.models import build

    model = build("tiny-fast-dllm-v2")
    with pytest.raises(ValueError, match="cuda_graphs: 'cuda' needs a CUDA device, got device 'cpu'"):
        verify_graphs("cuda", model, "cpu")
    assert verify_graphs(None, model, "cpu") is None and verify_graphs("eager", model, "cpu").model is model


def test_eval_folds_launched_calls(monkeypatch):
    """specfold eval measures what folding decodes: its compiled model folds launched calls too
    (options['fold_launched']), which on CUDA would otherwise run the plain graph."""
    import torch

    from specfold_compile.eval import compiled_model

    seen = {}
    monkeypatch.setattr(torch, "compile", lambda model, backend, options: seen.update(backend=backend, **options))
    compiled_model(object(), 0.1, "triton")
    assert seen["backend"] == "specfold" and seen["fold_launched"] is True and seen["tau"] == 0.1


def test_cuda_graphs_flag_needs_a_cuda_device(capsys):
    """``--cuda-graphs`` (CUDA replays) on ``--device cpu`` stops before loading, naming the argument."""
    for argv in (["generate", "--prompt", "1+1=", "--cuda-graphs"], ["eval", "--limit", "1", "--cuda-graphs"]):
        with pytest.raises(SystemExit) as err:
            main(argv)
        assert err.value.code == 2
        assert "--cuda-graphs: CUDA graphs need --device cuda, got --device cpu" in capsys.readouterr().err


def test_generate_cuda_graphs_eager_same_text(capsys):
    """``specfold generate --cuda-graphs eager`` runs generate's graph bookkeeping (static cache, one entry
    per shape, replays counted) and prints the same text as launched calls."""
    for mode in ("spiffy", "specfold"):
        args = ["generate", "--prompt", "Write 6 words about fruits in lowercase, separated by ' - '. Include the "
                "word 'pear'.", "--max-new-tokens", "40", "--mode", mode]
        assert main(args) == 0
        launched = capsys.readouterr().out
        assert main(args + ["--cuda-graphs", "eager"]) == 0
        replayed = capsys.readouterr().out
        assert replayed.split("\nmode=")[0] == launched.split("\nmode=")[0]
        stats = dict(kv.split("=") for kv in replayed.split("\nmode=")[1].split()[1:])
        assert int(stats["graph_captures"]) >= 1 and int(stats["graph_replays"]) >= 1
        assert "graph_captures" not in launched


def test_eval_cuda_graphs_one_verify_graphs_per_target(tmp_path, monkeypatch):
    """``specfold eval --cuda-graphs eager``: every generate call gets a VerifyGraphs of its own target
    (vanilla and Spiffy share the eager model's, SpecFold has the compiled model's), the same object from
    the warm-up through the timed runs, and the report says which replay ran."""
    from specfold_compile.decoding import VerifyGraphs
    from specfold_compile.eval import run

    import specfold_compile.decoding as decoding

    assert not hasattr(run, "generate")  # the runner imports it per call: the spy is what it calls
    seen = []
    real_generate = decoding.generate

    def spy(target, ids, **kw):
        seen.append((target, kw["cuda_graphs"]))
        return real_generate(target, ids, **kw)

    monkeypatch.setattr(decoding, "generate", spy)
    out = tmp_path / "eval.json"
    rc = main(["eval", "--tasks", "math", "--modes", "vanilla,spiffy,specfold", "--limit", "1",
               "--max-new-tokens", "32", "--out", str(out), "--quiet", "--cuda-graphs", "eager"])
    assert rc == 0
    d = json.loads(out.read_text())
    assert d["settings"]["cuda_graphs"] == "eager" and d["spiffy_tokens_equal_vanilla"] == {"math": True}
    assert seen and all(isinstance(g, VerifyGraphs) and g.model is t and g.replay == "eager" for t, g in seen)
    by_target = {}
    for t, g in seen:
        by_target.setdefault(id(t), set()).add(id(g))
    assert len(by_target) == 2 and all(len(gs) == 1 for gs in by_target.values())
    assert sum(g.replays for g in {id(g): g for _, g in seen}.values()) > 0


def test_generate_fuse_boundaries_flag(capsys):
    """``--fuse-boundaries`` and ``--fuse-boundaries writes`` decode the unfused text."""
    args = ["generate", "--prompt", "3+4=", "--max-new-tokens", "40", "--mode", "spiffy"]
    texts = []
    for extra in ([], ["--fuse-boundaries"], ["--fuse-boundaries", "writes"]):
        assert main(args + extra) == 0
        texts.append(capsys.readouterr().out.split("\nmode=")[0])
    assert texts[0] == texts[1] == texts[2]


def test_generate_loop_flag(capsys):
    """``--loop device`` decodes the text of the Python loop, with and without fused boundaries."""
    args = ["generate", "--prompt", "3+4=", "--max-new-tokens", "40", "--mode", "spiffy"]
    texts = []
    for extra in ([], ["--loop", "device"], ["--loop", "device", "--fuse-boundaries"]):
        assert main(args + extra) == 0
        texts.append(capsys.readouterr().out.split("\nmode=")[0])
    assert texts[0] == texts[1] == texts[2] and texts[0].strip()
    with pytest.raises(SystemExit):
        main(args + ["--loop", "gpu"])
