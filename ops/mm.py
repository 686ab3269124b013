"""Matrix multiply C[M, N] = A[M, K] @ B[K, N], tiled with grouped program ordering.

The tuning space is deliberately realistic (48 configs over tile sizes, stages and warps): it
is what makes independent sweeps disagree run to run, the drift replay exists to remove.
"""

import itertools

import torch
import triton
import triton.language as tl

from ops import Operator

MM_CONFIGS = [
    triton.Config(
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_stages=s, num_warps=w
    )
    for bm, bn, bk, s, w in itertools.product((32, 64, 128), (64, 128), (32, 64), (3, 4), (4, 8))
]


@triton.autotune(configs=MM_CONFIGS, key=["M", "N", "K"])
@triton.jit
def mm_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group_size = GROUP_M * num_pid_n
    first_m = (pid // group_size) * GROUP_M
    rows_in_group = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_size) % rows_in_group
    pid_n = (pid % group_size) // rows_in_group

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


def triton_mm(a, b):
    M, K = a.shape
    _, N = b.shape
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    mm_kernel[grid](
        a, b, c, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
    )
    return c


def make_inputs(shape, dtype, device):
    M, N, K = shape
    return (
        torch.randn(M, K, dtype=dtype, device=device),
        torch.randn(K, N, dtype=dtype, device=device),
    )


mm = Operator(
    name="mm",
    inputs=make_inputs,
    baseline=torch.mm,
    candidate=triton_mm,
    dtypes=("bf16", "fp16", "fp32"),
    dims=("M", "N", "K"),
    shape_keys=("blas",),
    bytes_moved=lambda shape, elem: elem * (shape[0] * shape[2] + shape[2] * shape[1] + shape[0] * shape[1]),
    flops=lambda shape: 2 * shape[0] * shape[1] * shape[2],
    # fp32 accumulation over K, compared with cuBLAS, which reorders the sum; fp32 inputs run as
    # tf32 by Triton's default (TRITON_F32_DEFAULT), hence the loose fp32 tolerance.
    tolerance={"fp16": (5e-2, 1e-2), "bf16": (1e-1, 2e-2), "fp32": (3e-1, 1e-2)},
)
