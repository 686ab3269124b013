"""A stand-in for Triton's GPU driver, so JIT-compiled kernels run their real Python launch path on a
machine with no GPU: the JIT compiles for sm_90 (Triton compiles for an explicit target without a
device), loads the binary into a fake handle, and the launcher calls the launch hooks as the CUDA
launcher does, then records the launch instead of running it.

Compiling needs Triton out of interpreter mode from its first import (resources/ir_kernels/hopper.py
says why), so a fresh process compiles into a cache dir (`python standin_triton.py MODULE_FILE`, which
calls the module's `launch_all()`), and the test process, with that cache dir, only loads.
"""

from __future__ import annotations

import importlib.util
import sys


class Utils:
    def __init__(self, driver: StandInDriver):
        self.driver = driver

    def get_device_properties(self, device):
        return {"max_shared_mem": 232448, "multiprocessor_count": 132, "sm_clock_rate": 1980000,
                "mem_clock_rate": 2619000, "mem_bus_width": 5120}

    def load_binary(self, name, kernel, shared, device):
        """(module, function, n_regs, n_spills, n_max_threads): a distinct function handle per kernel."""
        handle = 10_000 + len(self.driver.loaded)
        self.driver.loaded[handle] = name
        return handle, handle, 32, 0, 1024

    def unload_module(self, module):
        pass


class StandInDriver:
    def __init__(self):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", 90, 32)
        self.utils = Utils(self)
        self.loaded: dict[int, str] = {}  # function handle -> kernel name
        self.launches: list[int] = []  # function handles, in launch order

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    def get_benchmarker(self):
        raise AssertionError("the tests hand every autotuner its do_bench")

    def map_python_to_cpp_type(self, ty):
        return ty

    def launcher_cls(self, src, metadata):
        def launch(grid_0, grid_1, grid_2, stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook,
                   *args):
            if enter_hook is not None:
                enter_hook(launch_metadata)
            self.launches.append(function)
            if exit_hook is not None:
                exit_hook(launch_metadata)

        return launch


def activate(monkeypatch=None) -> StandInDriver:
    """Make a fresh stand-in Triton's active driver (undone with `monkeypatch`, where given)."""
    from triton.runtime.driver import driver as config

    standin = StandInDriver()
    if monkeypatch is not None:
        monkeypatch.setattr(config, "_active", standin)
    else:
        config.set_active(standin)
    return standin


if __name__ == "__main__":
    activate()
    spec = importlib.util.spec_from_file_location("kernels_to_compile", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.launch_all()
