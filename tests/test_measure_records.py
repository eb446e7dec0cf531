"""The runner's and the tuner's records (convbw_mlir.measure.records, dispatch.tune.TuneRecord) read the JSON
committed under bench/results/ and write it back byte for byte: existing manifests and results still read, and
a file written through the records is the file written before them."""

import json
from pathlib import Path

import pytest

from convbw_mlir.dispatch.tune import TuneRecord
from convbw_mlir.measure.records import ManifestEntry, ResultRow

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
FUZZ = RESULTS / "h100_2026-11-25_fenced_fuzz"  # the runner's check-only run: manifest and results
TUNE = RESULTS / "h100x2_2026-11-25_multi_gpu_tune"  # the tuner on two GPUs: rows naming their device


def _dump(doc) -> str:
    return json.dumps(doc, indent=1) + "\n"


def test_a_committed_manifest_reads_and_writes_back_byte_for_byte():
    text = (FUZZ / "fuzz_manifest.json").read_text()
    manifest = json.loads(text)
    entries = [ManifestEntry.from_dict(e) for e in manifest["problems"]]
    assert entries[0].extra == {"class": entries[0].extra["class"]}  # the fuzz's own field, kept in place
    assert json.loads(json.dumps(entries[0].conv().to_dict())) == entries[0].problem
    assert _dump(manifest | {"problems": [e.to_dict() for e in entries]}) == text


@pytest.mark.parametrize("name", ["fuzz.json", "fuzz_explicit.json"])
def test_committed_runner_results_read_and_write_back_byte_for_byte(name):
    text = (FUZZ / name).read_text()
    results = json.loads(text)
    rows = [ResultRow.from_dict(r) for r in results["problems"]]
    assert not rows[0].several_devices and rows[0].reference and rows[0].reduction_length
    assert json.dumps(results | {"problems": [r.to_dict() for r in rows]}, indent=1) == text.rstrip("\n")


def test_rows_of_several_devices_keep_device_index_and_the_tuners_fields_in_order():
    text = (TUNE / "all.json").read_text()
    results = json.loads(text)
    rows = [ResultRow.from_dict(r) for r in results["problems"]]
    assert "held_out" in rows[0].extra and "device_index" in rows[0].extra  # the tuner's, after its own fields
    assert json.dumps(results | {"problems": [r.to_dict() for r in rows]}, indent=1) == text.rstrip("\n")


def test_a_row_that_names_its_device_writes_it_right_after_contenders():
    row = ResultRow("p", "p.f16", 2, 4, False, {"convbw": {"status": "ok"}}, 8, {"reference_checked": "numpy"},
                    device_index=None, several_devices=True, roofline_s=1e-6)  # fmt: skip
    d = row.to_dict()
    assert list(d) == ["name", "key", "flops", "bytes", "depthwise_or_grouped", "reduction_length",
                       "reference_checked", "contenders", "device_index", "roofline_s"]  # fmt: skip
    assert ResultRow.from_dict(d) == row
    del d["device_index"]  # one device: the row names none, and reads back as such
    assert not ResultRow.from_dict(d).several_devices and "device_index" not in ResultRow.from_dict(d).to_dict()


def test_committed_tuning_records_read_and_write_back_byte_for_byte():
    lines = (TUNE / "all.records.jsonl").read_text().splitlines()
    records = [TuneRecord.from_dict(json.loads(line)) for line in lines]
    assert {r.pass_ for r in records} <= {1, 2} and records[0].held_out in (True, False)
    assert [json.dumps(r.to_dict()) for r in records] == lines


@pytest.mark.parametrize(
    ("make", "bad", "message"),
    [
        (ManifestEntry.from_dict, [], "manifest entry: expected an object, got list"),
        (ManifestEntry.from_dict, {"name": "a", "key": "a", "problem": {}}, "missing field 'contenders'"),
        (ManifestEntry.from_dict, {"name": "a", "key": 3, "problem": {}, "contenders": {}}, "key: expected str, got 3"),
        (
            ResultRow.from_dict,
            {"name": "a", "key": "a", "flops": 1, "bytes": 2, "depthwise_or_grouped": 1, "contenders": {}},
            "depthwise_or_grouped: expected bool, got 1",
        ),  # fmt: skip
        (
            ResultRow.from_dict,
            {"name": "a", "key": "a", "flops": True, "bytes": 2, "depthwise_or_grouped": False, "contenders": {}},
            "flops: expected int, got True",
        ),  # fmt: skip
        (TuneRecord.from_dict, {"run": "r"}, "tuning record: missing field 'key'"),
    ],
)
def test_a_malformed_record_names_the_field(make, bad, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        make(bad)


# -- cuDNN's inputs: fenced as our kernels' are ---------------------------------------------------------------
def _cpu_torch():
    """measure.checks.Torch on the CPU (its device a field), for what it builds rather than what cuDNN times."""
    pytest.importorskip("torch")
    from convbw_mlir.measure.checks import Torch

    tw = object.__new__(Torch)
    tw.torch, tw.device, tw.ok = __import__("torch"), "cpu", True
    return tw


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_cudnns_inputs_are_followed_by_nan_as_our_kernels_inputs_are(dtype):
    import numpy as np

    from convbw_mlir.problem import ConvBwdWeightProblem
    from convbw_mlir.reference import random_inputs
    from convbw_mlir.runtime import FENCE_BYTES

    tw = _cpu_torch()
    p = ConvBwdWeightProblem.from_ck("2 1 2 8 4 3 3 6 6 1 1 1 1 1 1 1 1", dtype=dtype)
    x, _ = random_inputs(p, seed=0)
    xt = tw._fenced(x, p.dtype)
    assert xt.numel() == x.size and xt.untyped_storage().nbytes() >= x.nbytes + FENCE_BYTES
    tail = tw.torch.tensor([], dtype=xt.dtype).set_(xt.untyped_storage())[x.size :]
    assert bool(tail.float().isnan().all()) and np.array_equal(xt.float().numpy(), x.astype(np.float32).ravel())


def test_cudnns_dw_on_fenced_inputs_is_the_reference():
    import numpy as np

    from convbw_mlir.problem import ConvBwdWeightProblem
    from convbw_mlir.reference import random_inputs, reference

    tw = _cpu_torch()
    p = ConvBwdWeightProblem.from_ck("2 2 2 4 4 3 3 6 6 1 1 1 1 1 1 1 1", dtype="f32")
    x, dy = random_inputs(p, seed=0)
    call, to_ours = tw.prepare(p, x, dy)
    np.testing.assert_allclose(to_ours(call()), reference(p, x, dy), rtol=1e-4, atol=1e-4)
