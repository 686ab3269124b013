"""torch_state: what it reads of torch's process-wide settings, and how it puts them back."""

import pytest
import torch

from harness.child.plugins import torch_state


@pytest.fixture
def clean_state():
    before = torch_state.snapshot()
    yield before
    torch_state.restore(torch_state.changes(before))


def test_a_changed_setting_is_named_and_put_back(clean_state):
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    changed = torch_state.changes(clean_state)
    assert changed == {"default_dtype": (torch.float32, torch.float64), "grad_enabled": (True, False)}
    assert torch_state.marker(changed, "changed during this case", torch_state.restore(changed)) == (
        "STATE_LEAK default_dtype=torch.float32->torch.float64 grad_enabled=True->False (changed during this case; "
        "restored)")
    assert torch_state.changes(clean_state) == {} and torch.get_default_dtype() == torch.float32


def test_a_setting_torch_refuses_to_read_is_a_state_not_a_crash(clean_state, monkeypatch):
    def refuse():
        raise RuntimeError("mix of the legacy and new APIs")

    monkeypatch.setitem(torch_state.SETTINGS, "refusing", (refuse, lambda value: None))
    assert torch_state.snapshot()["refusing"] == "unreadable (RuntimeError)"


def test_a_setting_that_will_not_go_back_is_said(clean_state, monkeypatch):
    def stuck(value):
        raise RuntimeError("cannot set it now")

    monkeypatch.setitem(torch_state.SETTINGS, "num_threads", (torch.get_num_threads, stuck))
    changed = {"num_threads": (1, 2)}
    assert torch_state.marker(changed, "x", torch_state.restore(changed)) == (
        "STATE_LEAK num_threads=1->2 (x; could not restore num_threads)")


class Ctx:
    def __init__(self):
        self.markers = []

    def mark(self, marker):
        self.markers.append(marker)


def test_a_case_started_inside_a_test_call_keeps_that_calls_own_context(clean_state):
    plugin = torch_state.TorchStatePlugin(Ctx())
    plugin.pytest_collection_finish(None)
    call = plugin.pytest_runtest_call(None)
    next(call)  # the test function runs: a FlagGems benchmark under torch.no_grad() starts its cases
    with torch.no_grad():
        plugin.pytest_zl_case_started(case_id="fp16-4", shape_label="4")
        assert torch.is_grad_enabled() is False and plugin.ctx.markers == []
    torch.set_default_dtype(torch.float64)  # what the call leaves behind is checked as it returns
    with pytest.raises(StopIteration):
        call.send(None)
    assert plugin.ctx.markers == ["STATE_LEAK default_dtype=torch.float32->torch.float64 (changed during this case; "
                                  "restored)"]
    torch.set_grad_enabled(False)  # between calls: found as the next case begins
    plugin.pytest_zl_case_started(case_id="fp16-8", shape_label="8")
    assert plugin.ctx.markers[-1] == "STATE_LEAK grad_enabled=True->False (found changed as this case began; restored)"
