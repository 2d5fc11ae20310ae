"""The settings surface: ``SpecFoldSettings`` (user options) and ``Tuning`` (performance knobs, defaults
from the device profile), and how the values reach the cost model and the fold ops."""

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from specfold_compile.backend import SpecFoldBackend, dispatch
from specfold_compile.backend.settings import FLAT_TUNING, MIN_BLOCK_R_ENV, SpecFoldSettings, Tuning
from specfold_compile.ops import fold_ops
from specfold_compile.ops.device_profile import H200, DeviceProfile


def test_tuning_defaults_are_the_h200_profile():
    t = Tuning()
    shared = {f.name for f in dataclasses.fields(DeviceProfile)} & {f.name for f in dataclasses.fields(Tuning)}
    assert len(shared) >= 15
    for name in shared:
        assert getattr(t, name) == getattr(H200, name), name
    assert t.attention == H200.attention


def test_tuning_from_another_profile():
    other = H200.replace(name="other", one_pass_max_prefix=256, fold_overhead_us=30.0, dense_fraction=0.6)
    t = Tuning.from_profile(other, programs_per_sm=3)
    assert (t.one_pass_max_prefix, t.fold_overhead_us, t.dense_fraction, t.programs_per_sm) == (256, 30.0, 0.6, 3)
    assert t.split_tile_us == H200.split_tile_us


def test_tuning_reaches_settings_from_every_entry():
    tuned = Tuning(dense_fraction=0.3, one_pass_max_prefix=-1)
    a = SpecFoldSettings(tuning=tuned)
    b = SpecFoldSettings.from_options({"tuning": {"dense_fraction": 0.3, "one_pass_max_prefix": -1}})
    c = SpecFoldBackend(tuning=tuned).settings
    assert a == b == c and a.tuning == tuned
    # flat names: into tuning, on top of a given one
    d = SpecFoldSettings.from_options({"tuning": tuned, "min_spill_us": 0, "fold_min_branches": 3})
    assert d.tuning == dataclasses.replace(tuned, min_spill_us=0.0, fold_min_branches=3)
    assert (d.min_spill_us, d.fold_min_branches, d.dense_fraction) == (0.0, 3, 0.3)
    assert dataclasses.replace(d, fold=False).tuning == d.tuning  # (the backend's plain-graph settings)
    assert set(FLAT_TUNING) <= {f.name for f in dataclasses.fields(Tuning)}


@pytest.mark.parametrize("changes, label", [
    (dict(one_pass_max_prefix=-2), "tuning.one_pass_max_prefix"), (dict(one_pass_max_work=1.5), "tuning.one_pass_max_work"),
    (dict(split_tile_us=-1.0), "tuning.split_tile_us"), (dict(programs_per_sm=0), "tuning.programs_per_sm"),
    (dict(folded_rows_guess=0.0), "tuning.folded_rows_guess"), (dict(packed_linear_min_block_r=256),
                                                                  "tuning.packed_linear_min_block_r"),
    (dict(max_planned_branches=1), "tuning.max_planned_branches"), (dict(gemm_bytes_per_s=0), "tuning.gemm_bytes_per_s"),
    (dict(dense_fraction=1.5), "tuning.dense_fraction"), (dict(fold_launched=1), "tuning.fold_launched"),
])
def test_bad_tuning_values_name_the_field(changes, label):
    with pytest.raises((ValueError, TypeError)) as info:
        Tuning(**changes)
    assert str(info.value).startswith(f"{label}: expected") and "\n" not in str(info.value)


def test_bad_tuning_option_is_one_line():
    with pytest.raises(TypeError, match=r"^options\['tuning'\]: expected a Tuning"):
        SpecFoldSettings.from_options({"tuning": 0.3})
    with pytest.raises(TypeError, match="unknown option"):
        SpecFoldSettings(tua=1)


@pytest.mark.parametrize("value, ok", [(None, 64), ("16", 16), ("abc", None), ("", None), ("512", None)])
def test_min_block_r_environment_variable(value, ok):
    """SPECFOLD_PACKED_LINEAR_MIN_BLOCK_R (for A/B runs) sets Tuning's default: 64 when unset, the value
    when valid, else an error naming the variable."""
    env = {k: v for k, v in os.environ.items() if k != MIN_BLOCK_R_ENV}
    if value is not None:
        env[MIN_BLOCK_R_ENV] = value
    code = "from specfold_compile.backend.settings import Tuning; print(Tuning().packed_linear_min_block_r)"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if ok is None:
        assert proc.returncode != 0 and MIN_BLOCK_R_ENV in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr[-1000:]
        assert proc.stdout.split()[-1] == str(ok)


def _op_arguments(op) -> set[str]:
    return {a.name for a in op._schema.arguments}


def test_tuning_args_are_the_fold_ops_arguments():
    """What the rewrite passes hand the fold ops: every key is an argument of the op, with the profile's
    value as the op's default."""
    t = Tuning()
    for op, args in ((fold_ops.FOLDED_ATTENTION, t.folded_attention_args()),
                     (fold_ops.PACKED_LINEAR, t.packed_linear_args())):
        schema = {a.name: a for a in op._schema.arguments}
        assert args and set(args) <= set(schema), set(args) - set(schema)
        for name, value in args.items():
            assert schema[name].default_value == pytest.approx(value), name


def test_cost_model_reads_the_tuning():
    """fold_overhead_us, the roofline and max_planned_branches come from settings.tuning."""
    shapes = [(8960, 1536)] * 3 * 28 + [(1536, 1536)] * 2 * 28  # about the 1.5B shape's MLP and q/o
    base = SpecFoldSettings()
    folds = lambda s, n: dispatch.cost_model_folds(n, 32, shapes, 28, s)  # noqa: E731
    n = next(n for n in range(2, 129) if folds(base, n))
    assert not folds(base, n - 1)
    dearer = SpecFoldSettings(tuning=Tuning(fold_overhead_us=base.tuning.fold_overhead_us * 4))
    assert not folds(dearer, n)
    slower = SpecFoldSettings(tuning=Tuning(gemm_flops_per_s=base.tuning.gemm_flops_per_s / 4))
    assert folds(slower, n - 1)  # compute-bound earlier: skipping rows pays earlier


def test_packed_linear_op_uses_its_head_arguments():
    """The op's dense_linear_* arguments move the cuBLAS head (torch impl: every computed row still right)."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(24, 1, 16, generator=g), torch.randn(8, 16, generator=g)
    assert fold_ops.dense_rows(24, 0.3) == 24  # the profile: a 128-row head holds all 24 rows
    costs = H200.replace(dense_linear_min_rows=0, dense_linear_row_multiple=4)
    assert fold_ops.dense_rows(24, 0.3, costs=costs) == 8
    y = fold_ops.packed_linear(x, w, None, torch.tensor(10), 0.3, "torch", 0.0, dense_linear_min_rows=0,
                               dense_linear_row_multiple=4)
    torch.testing.assert_close(y[:10], x[:10] @ w.t())
