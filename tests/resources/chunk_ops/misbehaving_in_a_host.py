"""Test-only operators for a chunk's measuring host: each does, in its candidate, what a host must survive.
host_crash kills its process (as a segfault would) where ZL_TEST_CRASH is set: side B of an A/B that sets it
loses this op's timed steps and, chunked, the host they ran in. leaky changes its process and leaves it so (an
environment variable, sys.path, the working dir, a tensor in a reference cycle only a collection frees): in a
process of its own that ends with the run; in a host it must not reach the next op's run (leak_witness).
allocator_setter sets Triton's allocator, as FlagGems' Hopper mm does, which a host cannot put back: the host
ends after its run. crash_once kills its process the first time it runs where ZL_TEST_CRASH_ONCE names a file
not there yet (it makes it first): a step that failed for a reason of the moment, run again."""

import os
import signal
import sys
import weakref

import torch
import triton

from ops import Operator
from ops.add import triton_add


def _inputs(shape, dtype, device):
    return (torch.randn(*shape, dtype=dtype, device=device), torch.randn(*shape, dtype=dtype, device=device))


def _crash_where_asked(x, y):
    if os.environ.get("ZL_TEST_CRASH"):
        os.kill(os.getpid(), signal.SIGKILL)
    return triton_add(x, y)


def _crash_the_first_time(x, y):
    flag = os.environ.get("ZL_TEST_CRASH_ONCE")
    if flag:
        try:
            os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            pass
        else:
            os.kill(os.getpid(), signal.SIGKILL)
    return triton_add(x, y)


class LeftInACycle:
    def __init__(self, tensor):
        self.tensor = tensor
        self.me = self


LEFT: list[weakref.ref] = []  # what leak_witness looks for


def _leak(x, y):
    LEFT.append(weakref.ref(LeftInACycle(x.clone())))
    os.environ["ZL_LEAKED"] = "1"
    if "/zl-leaked" not in sys.path:
        sys.path.append("/zl-leaked")
    os.chdir("/")
    return triton_add(x, y)


def _set_allocator(x, y):
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=x.device))
    return triton_add(x, y)


# Spelled out as Operator(name=...) calls: the inventory scan reads them statically.
COMMON = dict(inputs=_inputs, baseline=torch.add, shape_keys=("pointwise",), dtypes=("fp32",))
host_crash = Operator(name="host_crash", candidate=_crash_where_asked, **COMMON)
leaky = Operator(name="leaky", candidate=_leak, **COMMON)
allocator_setter = Operator(name="allocator_setter", candidate=_set_allocator, **COMMON)
crash_once = Operator(name="crash_once", candidate=_crash_the_first_time, **COMMON)
