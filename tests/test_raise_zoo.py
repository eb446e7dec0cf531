"""bench/raise_zoo.py's count: training steps exported with their parameters as inputs (bench/step_export.py), every
weight-gradient convolution counted, matched to the raised ones, and each one left over named with its reason."""

from __future__ import annotations

import json

import pytest
from conftest import bench_script

torch = pytest.importorskip("torch", reason="the counted programs are torch exports")
nn = torch.nn


class _Tiny(nn.Module):
    """Strided 3x3 with bias and batch norm, depthwise 3x3, a 1-D convolution, a linear head and an unused layer."""

    def __init__(self, transposed: bool = False) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.b = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.t = nn.ConvTranspose2d(8, 4, 2, stride=2) if transposed else nn.Conv1d(8, 4, 3)
        self.fc = nn.Linear(4, 5)
        self.unused = nn.Linear(3, 3)  # no gradient: the export turns it off rather than failing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b(torch.relu(self.bn(self.a(x))))
        y = self.t(y) if isinstance(self.t, nn.ConvTranspose2d) else self.t(y.flatten(2)).unsqueeze(-1)
        return self.fc(y.mean((2, 3)))


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    """The export half as the GPU machine runs it (the zoo's builder swapped for these models), then the count."""
    raise_zoo = bench_script("raise_zoo")
    folder = tmp_path_factory.mktemp("exports")
    torch.manual_seed(0)

    def build(source, name, options):  # noqa: ANN001, ANN202
        if name == "broken":
            raise ValueError("no")
        return _Tiny(name == "tiny_transposed"), (torch.randn(2, 3, 8, 8),)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(raise_zoo, "_zoo", lambda: [("torchvision", n, {}) for n in ("tiny", "tiny_transposed", "broken")])
        mp.setattr(raise_zoo, "_build", build)
        exported = raise_zoo.export_zoo(folder, log=lambda _: None)
    statuses = {name: m["status"] for name, m in exported["models"].items()}
    assert statuses == {"tiny": "exported", "tiny_transposed": "exported", "broken": "failed"}
    assert (folder / "tiny.pt2.gz").is_file() and json.loads((folder / "export.json").read_text())["models"]
    out = tmp_path_factory.mktemp("count")
    return raise_zoo.count_dir(folder, out, log=lambda _: None), out


def test_a_step_exported_with_parameters_as_inputs_holds_no_weights_and_takes_them_first():
    step_export = bench_script("step_export")
    program = step_export.export_step(_Tiny(), torch.randn(2, 3, 8, 8))
    assert not any(k.endswith("weight") for k in program.state_dict)  # buffers only (running statistics)
    inputs = [s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    assert inputs[0] == "p_model_a_weight" and inputs[-1].startswith("inputs"), inputs
    assert "p_model_unused_weight" in inputs  # an input still, with no gradient output


def test_every_weight_gradient_of_a_step_is_counted_and_raised(counted):
    report, out = counted
    tiny = report["models"]["tiny"]
    assert (tiny["expected"], tiny["raised"], tiny["not_raised"]) == (3, 3, [])
    assert any("not a weight-gradient layout" in r for r in tiny["remarks"])  # the data gradients, left alone
    assert json.loads((out / "count.json").read_text())["models"]["tiny"]["raised"] == 3
    assert "| tiny | 3 | 3 |" in (out / "count.md").read_text()


def test_a_model_iree_refuses_counts_its_convolutions_as_not_raised_with_the_reason(counted):
    report, out = counted
    model = report["models"]["tiny_transposed"]
    assert (model["expected"], model["raised"]) == (3, 0)
    assert all("failed to legalize operation 'torch.aten.convolution_backward'" in c["why"]
               for c in model["not_raised"])  # fmt: skip
    assert (report["raised"], report["expected"]) == (3, 6)
    assert report["models"]["broken"] == {"status": "not exported", "why": "ValueError: no"}  # named, not counted
    md = (out / "count.md").read_text()
    assert "- tiny_transposed, 3 convolutions: IREE's input phase failed on the model" in md
    assert "in the 1 models IREE's input phase takes: **3 of 3 (100.00%)**" in md


def test_matching_is_by_multiset_so_two_equal_layers_need_two_raised():
    raise_zoo = bench_script("raise_zoo")
    a, b = ("a",), ("b",)
    assert raise_zoo.match([a, a, b], [a, b]) == [a]
    assert raise_zoo.match([a, b], [b, a, a]) == []


def test_a_convolution_after_an_explicit_pad_matches_the_problem_raised_with_that_pad_folded_in():
    """tf_efficientnet_b0's stem: ``F.pad(x, (0, 1, 0, 1))`` then a 3x3 stride-2 convolution of 225x225 without pad
    is raised as 224x224 with pads (0, 0)-(1, 1), the same weight gradient: counted as raised, not missed."""
    raise_zoo = bench_script("raise_zoo")
    from convbw_mlir.problem import ConvBwdWeightProblem

    counted = raise_zoo._key(1, 2, 3, 32, (225, 225), (3, 3), (2, 2), (1, 1), (0, 0))
    raised = ConvBwdWeightProblem(groups=1, batch=2, in_channels=3, out_channels=32, input_size=(224, 224),
                                  filter_size=(3, 3), stride=(2, 2), dilation=(1, 1), pad_low=(0, 0),
                                  pad_high=(1, 1))  # fmt: skip
    assert raise_zoo.match([raise_zoo._extent(counted)], [raise_zoo._raised_key(raised)]) == []
    other = raise_zoo._key(1, 2, 3, 32, (224, 224), (3, 3), (2, 2), (1, 1), (0, 0))  # no pad: another problem
    assert raise_zoo.match([raise_zoo._extent(other)], [raise_zoo._raised_key(raised)]) == [raise_zoo._extent(other)]


def test_a_convolution_left_in_the_model_but_raised_alone_is_said_to_be():
    """The reason of a convolution the model's match missed comes from exporting and raising it alone; where that
    one raises, the reason says the model's linalg around it differs."""
    raise_zoo = bench_script("raise_zoo")
    call = {"x": (2, 4, 6, 6), "dy": (2, 6, 4, 4), "w": (6, 4, 3, 3), "stride": [1, 1], "pad": [0, 0],
            "dilation": [1, 1], "transposed": False, "output_padding": [0, 0], "groups": 1,
            "dtype": "torch.float32"}  # fmt: skip
    assert raise_zoo._why_alone(call, 120).startswith("raised when exported alone")
