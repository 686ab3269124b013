"""The one test the child collects, parametrized over the run's cases by the seeds plugin's
`case` fixture: build inputs, check the candidate against the baseline, time both."""

import pytest
import torch

from harness.child.context import DTYPE_MISCOMPUTED
from harness.child.plugins.seeds import case_digest
from ops import numel

# Inputs up to this size are copied afresh for each timing window after the first (--windows).
RELOCATE_MAX_BYTES = 64 << 20
TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def test_op(case, run_context, measure_pair, record_row):
    op = run_context.operator
    if op.skip:
        pytest.skip(op.skip)
    problem = run_context.dtype_problem(case.dtype)
    if problem:  # the backend's own limitation, said once: not the kernel's wrong result
        run_context.mark(f"{DTYPE_MISCOMPUTED} dtype={case.dtype}")
        pytest.skip(f"backend '{run_context.backend.name}' computes {case.dtype} wrongly (see run.log)")
    device = run_context.backend.torch_device()
    run_context.running = "inputs"
    args = op.inputs(case.shape, TORCH_DTYPES[case.dtype], device)
    run_context.running = None
    if not isinstance(args, (tuple, list)):  # a bare tensor would be unpacked along its first dim, silently
        raise TypeError(f"operator {op.name}: inputs() must return a tuple of arguments, not {type(args).__name__}")
    # Before anything runs on them: an operator that writes into its inputs must not change the digest.
    digest = case_digest(run_context, args)

    # The first candidate call also absorbs JIT compilation and the autotune sweep (or replay).
    run_context.running = "baseline"
    expected = op.baseline(*args)
    run_context.running = "candidate"
    got = op.candidate(*args)
    run_context.running = None
    atol, rtol = op.tolerance[case.dtype]
    # NaN where the baseline has NaN agrees (an op that propagates NaN); a NaN of its own does not.
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol, check_dtype=True, equal_nan=True,
                               msg=lambda m: f"candidate disagrees with baseline: {m}")

    placed = {"args": args, "kept": []}

    def relocate():
        # Fresh copies at fresh addresses (the earlier ones kept until the case ends, so the
        # allocator cannot hand the same block back), for inputs small enough to copy cheaply.
        placed["kept"].append(placed["args"])
        placed["args"] = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in placed["args"])

    small = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor)) <= RELOCATE_MAX_BYTES
    timed = measure_pair(case.op, {"baseline": lambda: op.baseline(*placed["args"]),
                                   "candidate": lambda: op.candidate(*placed["args"])},
                         relocate if small else None)
    placed = None
    elem = torch.empty((), dtype=TORCH_DTYPES[case.dtype]).element_size()
    metrics = {"input_sha256": digest}
    ms = timed.measurements["candidate"].latency_ms
    if op.bytes_moved is not None and ms > 0:
        metrics["gbps"] = op.bytes_moved(case.shape, elem) / ms / 1e6
    if op.flops is not None and ms > 0:
        metrics["tflops"] = op.flops(case.shape) / ms / 1e9
    metrics["numel"] = numel(case.shape)
    record_row(timed, metrics)
