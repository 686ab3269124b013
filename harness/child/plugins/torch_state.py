"""Torch's process-wide settings, the same at the start of every case. An operator that changes one
(its candidate sets the default dtype, turns grad mode off, switches to deterministic algorithms)
would otherwise change the inputs or the timing of every later case, whose rows keep their labels.
Taken as the session starts; checked after every test call and as every case begins; a change is
put back and marked on the row it showed in (STATE_LEAK, naming what changed). The seeds plugin
reseeds the generators per case, so they are not among these."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch


def _deterministic() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _set_deterministic(value: tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(value[0], warn_only=value[1])


def _backend_flag(module, name: str) -> tuple[Callable, Callable]:
    return (lambda: getattr(module, name)), (lambda value: setattr(module, name, value))


def _settings() -> dict[str, tuple[Callable, Callable]]:
    """name -> (read, restore); each read is cheap (no device work), so checking per case costs
    nothing. Where torch has the fp32_precision switches, those and not the legacy TF32 flags: once
    anything set the new ones, reading a legacy one raises."""
    settings = {
        "default_dtype": (torch.get_default_dtype, torch.set_default_dtype),
        "default_device": (torch.get_default_device, torch.set_default_device),
        "grad_enabled": (torch.is_grad_enabled, torch.set_grad_enabled),
        "anomaly_detection": (torch.is_anomaly_enabled, torch.set_anomaly_enabled),
        "deterministic_algorithms": (_deterministic, _set_deterministic),
        "num_threads": (torch.get_num_threads, torch.set_num_threads),
        "cuda.matmul.allow_fp16_reduced_precision_reduction":
            _backend_flag(torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction"),
        "cuda.matmul.allow_bf16_reduced_precision_reduction":
            _backend_flag(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction"),
        "cudnn.benchmark": _backend_flag(torch.backends.cudnn, "benchmark"),
        "cudnn.deterministic": _backend_flag(torch.backends.cudnn, "deterministic"),
    }
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        settings.update({
            "fp32_precision": _backend_flag(torch.backends, "fp32_precision"),
            "cuda.matmul.fp32_precision": _backend_flag(torch.backends.cuda.matmul, "fp32_precision"),
            "cudnn.fp32_precision": _backend_flag(torch.backends.cudnn, "fp32_precision"),
        })
    else:
        settings.update({
            "float32_matmul_precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
            "cuda.matmul.allow_tf32": _backend_flag(torch.backends.cuda.matmul, "allow_tf32"),
            "cudnn.allow_tf32": _backend_flag(torch.backends.cudnn, "allow_tf32"),
        })
    return settings


SETTINGS = _settings()


def _read(read: Callable):
    try:
        return read()
    except (RuntimeError, AttributeError) as exc:  # torch refuses the reading now: that is a state too
        return f"unreadable ({type(exc).__name__})"


def snapshot() -> dict:
    return {name: _read(read) for name, (read, _) in SETTINGS.items()}


def restore(changed: dict[str, tuple[object, object]]) -> list[str]:
    """Put back each changed setting (name -> (expected, found)); the ones that would not go back."""
    stuck = []
    for name, (expected, _) in changed.items():
        try:
            SETTINGS[name][1](expected)
        except (RuntimeError, TypeError, ValueError):
            stuck.append(name)
    return stuck


def changes(expected: dict) -> dict[str, tuple[object, object]]:
    now = snapshot()
    return {name: (expected[name], now[name]) for name in expected if now[name] != expected[name]}


def marker(changed: dict[str, tuple[object, object]], when: str, stuck: list[str]) -> str:
    what = " ".join(f"{name}={before}->{after}" for name, (before, after) in changed.items())
    back = f"; could not restore {', '.join(stuck)}" if stuck else "; restored"
    return f"STATE_LEAK {what} ({when}{back})"


class TorchStatePlugin:
    def __init__(self, ctx):
        self.ctx = ctx
        self.expected: dict | None = None
        self.in_call = False

    def pytest_collection_finish(self, session):
        # After the operator's import and pytest's own set-up: the state every case starts from.
        self.expected = snapshot()

    def _check(self, when: str) -> None:
        if self.expected is None:
            return
        changed = changes(self.expected)
        if changed:
            self.ctx.mark(marker(changed, when, restore(changed)))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        self.in_call = True
        try:
            yield
        finally:
            self.in_call = False
        # Before the row is written: the row of the call that changed it carries the marker.
        self._check("changed during this case")

    def pytest_zl_case_started(self, case_id: str, shape_label: str | None) -> None:
        # Whatever changed it between test calls (a fixture's teardown, say). Not inside one: a
        # FlagGems benchmark's cases start within its test function, whose own context (a
        # torch.no_grad() on it) is its to keep; the whole call is checked once it returns.
        if not self.in_call:
            self._check("found changed as this case began")
