"""Kernels whose compiled code is known, compiled on this CPU for an explicit GPU target, for the
kernel statistics tests: `python stats_kernels.py BACKEND ARCH` compiles into TRITON_CACHE_DIR and
prints {label: cache entry dir} as JSON.

- copy_aligned: a float32 copy whose pointers and size Triton specialized as divisible by 16 (as its
  JIT does for such arguments): each thread moves 4 contiguous floats, one 128-bit access;
- copy_misaligned: the same copy over a size not divisible by 16: the mask may cut any vector, so
  the accesses stay 32-bit;
- dot: a 128x128x64 fp16 tile loop with tl.dot, 3 stages.
A fresh process, because Triton's code generation needs TRITON_INTERPRET unset from its first import
(see hopper.py).
"""

import json
import sys
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

DIV16 = [["tt.divisibility", 16]]


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm, rn, rk = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)


def main(backend: str, arch: str) -> dict:
    target = GPUTarget(backend, int(arch) if arch.isdigit() else arch, 32 if arch.isdigit() else 64)
    copy_sig = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    dot_sig = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "K": "i32", "BM": "constexpr",
               "BN": "constexpr", "BK": "constexpr"}
    sources = {
        "copy_aligned": (ASTSource(copy_kernel, copy_sig, {"BLOCK": 1024}, {(0,): DIV16, (1,): DIV16, (2,): DIV16}),
                         {}),
        "copy_misaligned": (ASTSource(copy_kernel, copy_sig, {"BLOCK": 1024}, {(0,): DIV16, (1,): DIV16}), {}),
        "dot": (ASTSource(dot_kernel, dot_sig, {"BM": 128, "BN": 128, "BK": 64},
                          {(i,): DIV16 for i in range(4)}), {"num_warps": 4, "num_stages": 3}),
    }
    out = {}
    for label, (src, options) in sources.items():
        compiled = triton.compile(src, target=target, options=options)
        out[label] = str(Path(next(iter(compiled.metadata_group.values()))).parent)
    return out


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:3])))
