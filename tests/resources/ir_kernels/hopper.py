"""A kernel compiled for sm_90 on a CPU-only machine (Triton compiles for an explicit GPUTarget
without a GPU), for the IR tests.

Compiling needs Triton out of interpreter mode from its first import: with TRITON_INTERPRET=1 at
import (as the test suite sets it), Triton's own gluon library is built of interpreted functions
and code generation asserts. So `python hopper.py` compiles in a fresh process into
TRITON_CACHE_DIR, and the test process's `compile_all()` with the same cache dir loads those
kernels from it without generating code.
"""

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK_SIZE_M: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def compile_all() -> list:
    """Two configs x two dtypes: bf16/64, bf16/128, fp16/64, fp16/128."""
    compiled = []
    for dtype in ("bf16", "fp16"):
        for block in (64, 128):
            src = ASTSource(fn=scale_kernel, signature={"x_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "n": "i32",
                                                        "BLOCK_SIZE_M": "constexpr", "EVEN": "constexpr"},
                            constexprs={"BLOCK_SIZE_M": block, "EVEN": True})
            compiled.append(triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}))
    return compiled


if __name__ == "__main__":
    compile_all()
