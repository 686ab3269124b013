import subprocess

import pytest

import backends
from backends.base import ALL_VISIBILITY_KEYS


@pytest.mark.parametrize("alias,name", [("nvidia", "cuda"), ("AMD", "rocm"), ("hip", "rocm"), ("npu", "ascend"),
                                        ("cpu", "interpreter"), ("mthreads", "musa"), (" cuda ", "cuda")])
def test_aliases_resolve(alias, name):
    assert backends.get(alias).name == name


def test_unknown_backend_lists_known_ones():
    with pytest.raises(backends.UnknownBackend) as info:
        backends.get("tpu")
    text = str(info.value)
    assert "tpu" in text
    for name in backends.NAMES:
        assert name in text


def test_visibility_env_scrubs_every_vendor():
    env = {k: "7" for k in ALL_VISIBILITY_KEYS} | {"PATH": "/bin"}
    child = backends.get("rocm").visibility_env(2, env)
    assert child["HIP_VISIBLE_DEVICES"] == "2"
    assert all(k not in child for k in ALL_VISIBILITY_KEYS if k != "HIP_VISIBLE_DEVICES")
    assert child["PATH"] == "/bin"


def test_interpreter_child_env_sets_interpret_and_no_visibility():
    child = backends.get("interpreter").visibility_env(0, {"CUDA_VISIBLE_DEVICES": "3"})
    assert child == {"TRITON_INTERPRET": "1"}


def test_enumeration_order_explicit_env_cli_torch(monkeypatch):
    cuda = backends.get("cuda")
    calls = []
    monkeypatch.setattr(cuda.__class__, "_devices_from_cli", lambda self: calls.append("cli") or [0, 1, 2])
    assert cuda.enumerate_devices(explicit=[5], environ={"CUDA_VISIBLE_DEVICES": "1"}) == [5]
    assert cuda.enumerate_devices(environ={"CUDA_VISIBLE_DEVICES": "3,1"}) == [3, 1]
    assert calls == []
    assert cuda.enumerate_devices(environ={}) == [0, 1, 2]
    monkeypatch.setattr(cuda.__class__, "_devices_from_cli", lambda self: None)
    assert cuda.enumerate_devices(environ={}, torch_count=lambda: 4) == [0, 1, 2, 3]


def test_vendor_cli_lines_are_counted(monkeypatch):
    cuda = backends.get("cuda")
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/" + name)
    out = "GPU 0: NVIDIA H200 (UUID: a)\nGPU 1: NVIDIA H200 (UUID: b)\n"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=out))
    assert cuda._devices_from_cli() == [0, 1]


def test_check_available_fails_with_hint(monkeypatch):
    cuda = backends.get("cuda")
    monkeypatch.setattr(cuda.__class__, "enumerate_devices", lambda self, *a, **k: [])
    with pytest.raises(backends.BackendUnavailable, match="--backend interpreter"):
        cuda.check_available()


def test_check_available_rejects_invisible_device(monkeypatch):
    cuda = backends.get("cuda")
    monkeypatch.setattr(cuda.__class__, "enumerate_devices", lambda self, *a, **k: [0, 1])
    assert cuda.check_available([1]) == [1]
    with pytest.raises(backends.BackendUnavailable, match=r"\[4\]"):
        cuda.check_available([4])


def test_thousands_of_missing_devices_are_named_a_few_and_counted():
    # `--devices 0,...,4999`: the refusal echoed every one, a 29 KB line.
    refused = backends.get("interpreter")
    with pytest.raises(backends.BackendUnavailable) as info:
        refused.check_available(list(range(5000)))
    assert str(info.value) == ("backend 'interpreter': device(s) [2, 3, 4, 5, 6, 7, 8, 9, ... (4990 more)] do not "
                               "exist here; it has 2 devices, valid --device: 0, 1")


class _Err(RuntimeError):
    pass


@pytest.mark.parametrize("text,verdict", [
    ("CUDA error: operation not permitted when stream is capturing\nCompile with `TORCH_USE_CUDA_DSA` "
     "to enable device-side assertions.", backends.RECOVERABLE),
    ("CUDA error: an illegal memory access was encountered\nCompile with `TORCH_USE_CUDA_DSA` to enable "
     "device-side assertions.", backends.FATAL),
    ("CUDA error: device-side assert triggered", backends.FATAL),
    ("CUDA error: unknown error", backends.POISONED),
    ("something nobody has seen before", backends.FATAL),
])
def test_capture_errors_classified_from_text(text, verdict):
    assert backends.get("cuda").classify_capture_error(_Err(text)) == verdict


def test_generic_footer_alone_is_not_fatal_marker():
    # The footer torch appends to every error must not be what makes an error fatal.
    for backend in map(backends.get, backends.NAMES):
        for marker in backend.capture_markers.fatal:
            assert "enable device-side assertions" not in marker
            assert marker != "device-side assert"


def test_musa_has_its_own_markers_and_deny_list():
    musa = backends.get("musa")
    assert musa.classify_capture_error(_Err("MUSA error: unknown error")) == backends.POISONED
    assert "unique2" in musa.capture_deny
    assert musa.graph_class == "MUSAGraph"


def test_capabilities_pick_default_timer():
    assert backends.get("cuda").default_timer == "graph"
    assert backends.get("ascend").default_timer == "direct"
    assert backends.get("interpreter").default_timer == "host"


def test_cuda_and_rocm_tell_torch_builds_apart():
    class V:
        hip = "6.2"

    class T:
        version = V

    assert backends.get("rocm").torch_build(T) and not backends.get("cuda").torch_build(T)
