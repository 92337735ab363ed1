"""bench/gpu_profile.py's arithmetic: kernel names to kinds, the GPU's busy share, the figures
per step. The kernel names are as NVIDIA's and PyTorch's libraries print them in a trace."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import gpu_profile  # noqa: E402


@pytest.mark.parametrize(
    ("kernel", "kind"),
    [
        ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>", "attention"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas", "gemm"),
        ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT", "gemm"),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<"
            "FusedAdamMathFunctor<float, 4>>",
            "optimizer",
        ),
        ("triton_per_fused_native_layer_norm_0", "triton"),
        ("triton_poi_fused__scaled_dot_product_efficient_attention_3", "triton"),  # a copy
        ("triton_tem_fused_mm_0", "gemm"),  # inductor's matmul template
        ("Memcpy HtoD (Pinned -> Device)", "copy"),
        (
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "communication",
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
            "elementwise",
        ),
        ("void some_unknown_kernel<float>", "other"),
    ],
)
def test_a_kernel_is_sorted_by_its_name(kernel: str, kind: str) -> None:
    assert gpu_profile.category(kernel) == kind


def test_overlapping_kernels_count_once_toward_busy_time() -> None:
    assert gpu_profile.busy_us([(0, 10), (5, 15), (20, 30), (21, 22)]) == 25
    assert gpu_profile.busy_us([]) == 0


def test_the_figures_are_per_step_and_the_busy_share_of_the_span() -> None:
    kernels = [
        ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", 0.0, 400.0),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 400.0, 1400.0),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 1500.0, 2500.0),
        ("triton_poi_fused_add_0", 2500.0, 2600.0),
    ]
    ops = ["aten::_scaled_dot_product_efficient_attention"] * 2 + ["aten::_local_scalar_dense"]
    out = gpu_profile.breakdown(kernels, ops, steps=2, span_us=4000.0)
    assert out["step_ms"] == 2.0 and out["gpu_busy"] == pytest.approx(2500 / 4000, abs=1e-3)
    assert out["categories_ms_per_step"] == {"attention": 0.2, "gemm": 1.0, "triton": 0.05}
    assert out["attention"] == ["efficient"] and out["host_reads_per_step"] == 0.5
    assert out["top_ms_per_step"][0] == ["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 1.0]
    assert gpu_profile.breakdown([], ops, 2, 4000.0)["gpu_busy"] is None  # a CPU: no kernels


def test_record_function_spans_on_the_device_are_not_kernels() -> None:
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def event(name: str, device: DeviceType, annotation: bool = False) -> SimpleNamespace:
        span = SimpleNamespace(start=10.0, end=30.0)
        return SimpleNamespace(
            name=name, device_type=device, is_user_annotation=annotation, time_range=span
        )

    events = [
        event("Optimizer.step#AdamW.step", DeviceType.CUDA, annotation=True),
        event("multi_tensor_apply_kernel<FusedAdamMathFunctor>", DeviceType.CUDA),
        event("aten::_fused_adamw_", DeviceType.CPU),
    ]
    assert gpu_profile.kernels_of(events) == [
        ("multi_tensor_apply_kernel<FusedAdamMathFunctor>", 10.0, 30.0)
    ]
