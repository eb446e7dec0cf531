"""Never slower per layer (issue 37 item 4): the switch weighs our dW against torch's once per layer, by default on
GPUs, and remembers the verdict in the kernel cache's folder, so a later process (here: a fresh switch state with the
same folder) decides without timing; what keys a verdict, a corrupt or foreign verdict file, deterministic mode and
CUDA graph capture, and ``convbw cache clear`` (docs/torch.md#never-slower-per-layer-issue-37-item-4). On the CPU
with the host kernels; the GPU's timing itself is replaced by given times (``_time``)."""

import json
import os
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra: pip install .[torch])")
from convbw_mlir import torch as ct  # noqa: E402 - after the skip: it needs torch
from convbw_mlir.dispatch.cache import KernelCache  # noqa: E402
from convbw_mlir.torch import entry as ct_entry  # noqa: E402
from convbw_mlir.torch import switch as sw  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_artifacts", "torch_switch_off")  # conftest: one kernel folder; switch off

SLOWER = "torch: slower than torch's (benchmark)"
REMEMBERED = "torch: slower than torch's (remembered)"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache folder of the test's own (the verdicts' home), and the default weighing the CPU as it does a GPU."""
    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sw, "_BENCHMARK_DEVICES", frozenset({"cpu", "cuda"}))
    return tmp_path / "cache"


@pytest.fixture
def timed(monkeypatch):
    """Each _time call runs its side once and returns the times set in ``timed.times`` (ours, torch's)."""
    calls = _Calls()

    def fake_time(call, device):
        call()
        calls.append(device.type)
        return calls.times[(len(calls) - 1) % 2]

    monkeypatch.setattr(sw, "_time", fake_time)
    return calls


class _Calls(list):
    times = (2.0, 1.0)  # ours slower: the verdict is torch's


def _step(conv, x):
    conv.weight.grad = None
    conv(x).square().sum().backward()
    return conv.weight.grad.clone()


def _layer():
    torch.manual_seed(0)  # the first convolution of test_torch_ops' model: its kernel is in the session's folder
    return torch.nn.Conv2d(4, 8, 3, padding=1, bias=False), torch.randn(2, 4, 6, 6)


def _verdicts(cache):
    return sorted((cache / "verdicts").glob("*.json"))


def test_the_default_weighs_a_layer_once_and_a_fresh_switch_reuses_its_verdict_without_timing(cache, timed):
    conv, x = _layer()
    ct.enable()  # benchmark=None: weighs on the devices of _BENCHMARK_DEVICES
    for _ in range(3):
        got = _step(conv, x)
    assert len(timed) == 2 and ct.stats() == {SLOWER: 3}
    [path] = _verdicts(cache)
    record = json.loads(path.read_text())
    assert (record["ours"], record["ours_s"], record["torch_s"]) == (False, 2.0, 1.0)
    assert record["key"]["kernel"].startswith("iree:") and record["key"]["target"] == "host"
    ct.reset_stats()
    ct.enable()  # a fresh switch state (no decision in memory), as a new process: the verdict is read, not timed
    torch.testing.assert_close(_step(conv, x), got, rtol=0, atol=0)
    assert len(timed) == 2 and ct.stats() == {REMEMBERED: 1}


SECOND_PROCESS = """
import json, sys
import torch
from convbw_mlir import torch as ct
from convbw_mlir.torch import switch as sw
sw._BENCHMARK_DEVICES = frozenset({"cpu"})  # the default weighing here as on a GPU
sw._time = lambda call, device: sys.exit("timed in the second process")
torch.manual_seed(0)
conv, x = torch.nn.Conv2d(4, 8, 3, padding=1, bias=False), torch.randn(2, 4, 6, 6)
ct.enable()
conv(x).square().sum().backward()
print(json.dumps(ct.stats()))
"""


def test_a_second_process_reads_the_verdict_and_times_nothing(cache, timed):
    conv, x = _layer()
    ct.enable()
    _step(conv, x)  # the kernel lands in the artifacts folder the second process loads it from
    assert len(timed) == 2 and len(_verdicts(cache)) == 1
    env = dict(os.environ, OMP_NUM_THREADS="1")  # CONVBW_CACHE_DIR and CONVBW_ARTIFACTS as this process has them
    out = subprocess.run([sys.executable, "-c", SECOND_PROCESS], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {REMEMBERED: 1}


def test_a_layer_ours_is_faster_on_is_remembered_as_ours(cache, timed):
    timed.times = (1.0, 2.0)
    conv, x = _layer()
    ct.enable()
    want = _step(conv, x)
    ct.enable()
    torch.testing.assert_close(_step(conv, x), want, rtol=0, atol=0)
    assert len(timed) == 2 and ct.stats() == {"ours": 2}
    assert json.loads(_verdicts(cache)[0].read_text())["ours"] is True


def test_on_the_cpu_the_default_times_nothing_and_benchmark_false_never_times(cache, timed, monkeypatch):
    conv, x = _layer()
    ct.enable(benchmark=False)  # today's "ours wherever we have a kernel", wherever the default would weigh
    _step(conv, x)
    monkeypatch.setattr(sw, "_BENCHMARK_DEVICES", frozenset({"cuda"}))  # the product's default
    ct.enable()
    _step(conv, x)
    assert timed == [] and ct.stats() == {"ours": 2} and not (cache / "verdicts").exists()


@pytest.mark.parametrize(
    ("content", "why"),
    [(b'{"format": 1, "kind": "convbw-mlir switch ver', "not JSON"), (None, "stored for another key"),
     (b'{"format": 1, "kind": "convbw-mlir switch verdict"}', "stored for another key"), (b"[]", "not a convbw")],
)  # fmt: skip
def test_a_corrupt_or_foreign_verdict_file_is_a_warning_and_a_new_measurement(cache, timed, content, why):
    conv, x = _layer()
    ct.enable()
    _step(conv, x)
    [path] = _verdicts(cache)
    if content is None:  # another key's verdict (e.g. copied from another machine) under this key's name
        record = json.loads(path.read_text())
        record["key"]["device"] = "NVIDIA H100 80GB HBM3"
        content = json.dumps(record).encode()
    path.write_bytes(content)
    timed.times = (1.0, 2.0)
    ct.reset_stats()
    ct.enable()
    with pytest.warns(UserWarning, match=f"switch verdict .*: {why}.*: measuring again"):
        _step(conv, x)
    assert len(timed) == 4 and ct.stats() == {"ours": 1}
    assert json.loads(path.read_text())["ours"] is True  # the new measurement replaced the file


@pytest.mark.parametrize("change", ["device", "torch", "cudnn", "kernel"])
def test_a_verdict_is_keyed_by_device_torch_and_cudnn_versions_and_our_kernels_identity(cache, timed, monkeypatch,
                                                                                         change):  # fmt: skip
    conv, x = _layer()
    ct.enable()
    _step(conv, x)
    if change == "device":
        monkeypatch.setattr(sw, "_device_name", lambda device: "another device")
    elif change == "torch":
        monkeypatch.setattr(torch, "__version__", "9.9.9")
    elif change == "cudnn":
        monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
        monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 99999)
    else:  # another compile of the kernel, or another launch path
        monkeypatch.setattr(ct_entry, "kernel_identity", lambda problem, device: "direct:another")
    ct.enable()
    _step(conv, x)
    assert len(timed) == 4 and len(_verdicts(cache)) == 2  # measured again, stored beside the first
    monkeypatch.undo()  # the fixtures' settings too: set again
    monkeypatch.setenv("CONVBW_CACHE_DIR", str(cache))
    monkeypatch.setattr(sw, "_BENCHMARK_DEVICES", frozenset({"cpu"}))
    monkeypatch.setattr(sw, "_time", lambda call, device: pytest.fail("timed again"))
    ct.enable()
    _step(conv, x)  # the first key's verdict is still read


def test_no_verdict_is_remembered_where_our_kernels_identity_is_unknown(cache, timed, monkeypatch):
    monkeypatch.setattr(ct_entry, "kernel_identity", lambda problem, device: None)
    conv, x = _layer()
    ct.enable()
    _step(conv, x)
    assert len(timed) == 2 and ct.stats() == {SLOWER: 1} and _verdicts(cache) == []


def test_deterministic_mode_refuses_a_non_deterministic_plan_before_any_timing(cache, timed, monkeypatch):
    monkeypatch.setattr(ct_entry, "_WARNED", set())
    conv, x = _layer()
    torch.use_deterministic_algorithms(True)
    try:
        ct.enable()
        _step(conv, x)  # a deterministic plan: weighed, under its own key
        assert len(timed) == 2 and ct.stats() == {SLOWER: 1}
        assert json.loads(_verdicts(cache)[0].read_text())["key"]["deterministic"] is True
        monkeypatch.setattr(sw, "plan_is_deterministic", lambda plan, flags: False)
        ct.reset_stats()
        ct.enable()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the one warning saying so: test_torch_ops
            _step(conv, x)
        assert len(timed) == 2 and ct.stats() == {"torch: not deterministic": 1}
    finally:
        torch.use_deterministic_algorithms(False)


def test_nothing_is_timed_while_a_cuda_graph_is_captured_and_the_layer_is_weighed_after(cache, timed, monkeypatch):
    conv, x = _layer()
    ct.enable()
    monkeypatch.setattr(sw, "_capturing", lambda x: True)
    _step(conv, x)
    _step(conv, x)
    assert timed == [] and ct.stats() == {"ours": 2} and _verdicts(cache) == []  # ours, unweighed, not remembered
    monkeypatch.setattr(sw, "_capturing", lambda x: False)
    _step(conv, x)  # the first call outside a capture weighs it
    assert len(timed) == 2 and ct.stats() == {"ours": 2, SLOWER: 1} and len(_verdicts(cache)) == 1
    ct.enable()
    monkeypatch.setattr(sw, "_capturing", lambda x: True)
    _step(conv, x)  # a remembered verdict holds under capture too: only a file read
    assert len(timed) == 2 and ct.stats()[REMEMBERED] == 1


def test_a_cache_folder_that_cannot_be_written_is_a_warning_and_the_verdict_holds_for_the_process(
    tmp_path, timed, monkeypatch
):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("CONVBW_CACHE_DIR", str(tmp_path / "file" / "cache"))
    monkeypatch.setattr(sw, "_BENCHMARK_DEVICES", frozenset({"cpu"}))
    conv, x = _layer()
    ct.enable()
    with pytest.warns(UserWarning, match="switch verdict not remembered in"):
        _step(conv, x)
    _step(conv, x)
    assert len(timed) == 2 and ct.stats() == {SLOWER: 2}


def test_a_cache_setting_that_breaks_the_store_is_one_warning_and_the_layer_is_still_weighed(cache, timed, monkeypatch):
    monkeypatch.setattr(ct_entry, "_WARNED", set())
    monkeypatch.setenv("CONVBW_CACHE_MAX_BYTES", "lots")  # the kernel cache's own setting, refused by its reader
    conv, x = _layer()
    ct.enable()
    with pytest.warns(UserWarning, match="switch verdicts not remembered: ValueError: CONVBW_CACHE_MAX_BYTES"):
        _step(conv, x)
    assert len(timed) == 2 and ct.stats() == {SLOWER: 1} and _verdicts(cache) == []


def test_cache_clear_removes_the_switch_verdicts_and_nothing_else_in_their_folder(cache, timed, capsys):
    from convbw_mlir.cli import main

    conv, x = _layer()
    ct.enable()
    _step(conv, x)
    (cache / "verdicts" / "notes.txt").write_text("mine")
    assert main(["cache", "clear", "--cache-dir", str(cache)]) == 0
    assert "removed 0 entries and 1 switch verdicts" in capsys.readouterr().out
    assert _verdicts(cache) == [] and (cache / "verdicts" / "notes.txt").read_text() == "mine"
    kc = KernelCache(cache)
    assert kc.clear() == 0 and kc.verdicts_cleared == 0
