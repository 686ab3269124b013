import json
import os

import flag_gems  # noqa: F401  (as upstream: the vendor is settled at import)
import torch

from . import consts

Config = None
RESULTS = {}


class BenchConfig:
    def __init__(self):
        self.mode = consts.BenchMode.KERNEL
        self.bench_level = consts.BenchLevel.COMPREHENSIVE
        self.user_desired_dtypes = None
        self.shape_file = os.path.join(os.path.dirname(__file__), "core_shapes.yaml")
        self.record_json = False


def update_result(op, data):
    if Config.record_json:
        RESULTS.setdefault(op, []).append(data)


def pytest_addoption(parser):
    parser.addoption("--mode", default="kernel", choices=[m.value for m in consts.BenchMode])
    parser.addoption("--level", default="comprehensive", choices=[v.value for v in consts.BenchLevel])
    parser.addoption("--dtypes", action="append", default=None)
    parser.addoption("--shape_file", default=os.path.join(os.path.dirname(__file__), "core_shapes.yaml"))
    parser.addoption("--record", default="none", choices=["none", "json"])


def pytest_configure(config):
    global Config
    Config = BenchConfig()
    Config.mode = consts.BenchMode(config.getoption("--mode"))
    Config.bench_level = consts.BenchLevel(config.getoption("--level"))
    names = config.getoption("--dtypes")
    Config.user_desired_dtypes = [getattr(torch, n) for n in names] if names else None
    Config.shape_file = config.getoption("--shape_file")
    Config.record_json = config.getoption("--record") == "json"


def pytest_terminal_summary(terminalreporter):
    if Config is not None and Config.record_json:
        with open("benchmark_result.json", "w") as f:
            json.dump(RESULTS, f, default=str)


def pytest_collect_file(file_path, parent):
    # Not upstream's: our tests' window on which files pytest offered for collection.
    log = os.environ.get("ZL_TEST_COLLECT_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{file_path.name}\n")
