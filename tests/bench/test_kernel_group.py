import pytest

from bench.suites.breakdown import kernel_group as _kernel_group


@pytest.mark.parametrize("name, group", [
    ("_fold_flag_kernel", "gate"),
    ("_resolve_kernel", "origin+compaction"),
    ("_prefix_attn_kernel", "attention_prefix"),
    ("_block_attn_kernel", "attention_block_merge"),
    ("_packed_linear_body", "packed_linear_spill"),
    ("_silu_mul_kernel", "packed_swiglu"),
    # Inductor names a kernel after the ops it fused, here a norm reading a packed linear's output
    ("triton_red_fused__to_copy_add_mean_mul_packed_linear_pow_rsqrt_2", "rest(elementwise,norms)"),
    ("triton_poi_fused_index_select_mul_0", "packing_gather_scatter"),
    ("nvjet_tst_128x64_64x8_1x1_v_bz_TNT", "dense_gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32", "dense_gemm"),
    ("triton_per_fused_add_mean_mul_pow_rsqrt_1", "rest(elementwise,norms)"),
])
def test_kernel_names_map_to_the_parts_of_the_breakdown(name, group):
    assert _kernel_group(name) == group
