"""The model zoo as problems (convbw_mlir.torch.zoo): convolutions traced on the meta device into a suite.

make test traces two small models defined with torch.nn: torchvision from PyPI is a CUDA build whose
operators do not load against the CPU torch make test installs (docs/zoo.md), so the named-model paths
are exercised where their libraries import, and the shipped zoo suite (traced with them) is checked as data.
"""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from convbw_mlir.problem import ConvBwdWeightProblem  # noqa: E402
from convbw_mlir.suites import load_suite  # noqa: E402
from convbw_mlir.torch.zoo import suite_text, trace_convs  # noqa: E402


class Block(nn.Module):
    """A depthwise-separable block: depthwise 3x3, then pointwise."""

    def __init__(self, c: int, k: int, stride: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, 3, stride=stride, padding=1, groups=c)
        self.pw = nn.Conv2d(c, k, 1)

    def forward(self, x):
        return self.pw(torch.relu(self.dw(x)))


class TinyCNN(nn.Module):
    """Image model: a stem, two blocks of one shape (one problem), a reflect-padded and a "same" conv."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.blocks = nn.Sequential(Block(8, 8, 1), Block(8, 8, 1))
        self.reflect = nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect")
        self.same = nn.Conv2d(8, 4, 4, padding="same", dilation=2, bias=False)

    def forward(self, x):
        return self.same(self.reflect(self.blocks(self.stem(x))))


class TinySpeechVideo(nn.Module):
    """A 1-D feature extractor (wav2vec2-like strides, a grouped conv) and a 3-D video conv side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.extract = nn.Sequential(nn.Conv1d(1, 16, 10, stride=5, bias=False), nn.GELU(),
                                     nn.Conv1d(16, 16, 3, stride=2, groups=4, bias=False))  # fmt: skip
        self.video = nn.Conv3d(3, 8, (3, 7, 7), stride=(1, 2, 2), padding=(1, 3, 3))

    def forward(self, audio, clip):
        return self.extract(audio.unsqueeze(1)), self.video(clip)


def _meta(cls):
    with torch.device("meta"):
        return cls()


def test_a_cnn_on_the_meta_device_gives_each_convolution_s_problem_with_its_layer():
    model = _meta(TinyCNN)
    assert all(p.is_meta for p in model.parameters())  # no weights were made
    calls = trace_convs(model, torch.empty(2, 3, 32, 32, device="meta"))
    got = [(c.layer, c.problem.to_ck()) for c in calls]
    assert got == [
        ("stem", "2 1 2 8 3 3 3 32 32 2 2 1 1 1 1 1 1"),
        ("blocks.0.dw", "2 8 2 1 1 3 3 16 16 1 1 1 1 1 1 1 1"),  # depthwise: G=8, C=K=1
        ("blocks.0.pw", "2 1 2 8 8 1 1 16 16 1 1 1 1 0 0 0 0"),
        ("blocks.1.dw", "2 8 2 1 1 3 3 16 16 1 1 1 1 1 1 1 1"),
        ("blocks.1.pw", "2 1 2 8 8 1 1 16 16 1 1 1 1 0 0 0 0"),
        ("reflect", "2 1 2 8 8 3 3 18 18 1 1 1 1 0 0 0 0"),  # padded before the call: the input grew, pads 0
        ("same", "2 1 2 4 8 4 4 16 16 1 1 2 2 3 3 3 3"),  # "same", dilation 2, 4x4: 6 = 3 low + 3 high
    ]


def test_1d_and_3d_convolutions_and_groups_are_traced_too():
    calls = trace_convs(_meta(TinySpeechVideo), torch.empty(2, 16000, device="meta"),
                        torch.empty(2, 3, 8, 56, 56, device="meta"))  # fmt: skip
    assert [(c.layer, c.problem.to_ck()) for c in calls] == [
        ("extract.0", "1 1 2 16 1 10 16000 5 1 0 0"),
        ("extract.2", "1 4 2 4 4 3 3199 2 1 0 0"),
        ("video", "3 1 2 8 3 3 7 7 8 56 56 1 2 2 1 1 1 1 3 3 1 3 3"),
    ]


def test_the_suite_holds_each_distinct_problem_once_per_batch_with_its_models_and_layers(tmp_path):
    cnn = trace_convs(_meta(TinyCNN), torch.empty(2, 3, 32, 32, device="meta"))
    sv = trace_convs(_meta(TinySpeechVideo), torch.empty(2, 16000, device="meta"),
                     torch.empty(2, 3, 8, 56, 56, device="meta"))  # fmt: skip
    uses = [("nn", "tiny_cnn", c) for c in cnn] + [("nn", "tiny_sv", c) for c in sv]
    from convbw_mlir.torch.zoo import Traced

    batched = [(s, m, Traced(t.layer, t.problem.with_(batch=b))) for b in (32, 64) for s, m, t in uses]
    text = suite_text(batched, ["two small models"], {"broken_net": "no such layer"})
    path = tmp_path / "tiny.tsv"
    path.write_text(text)
    assert "# not traced: broken_net: no such layer" in text
    assert "# tiny_cnn: blocks.0.dw, blocks.1.dw\n" in text  # one problem, both layers named
    for dtype in ("f16", "bf16"):
        suite = load_suite(path, dtype)
        assert len(suite) == 2 * 8  # 10 calls, 2 shapes twice: 8 distinct, at two batches
        assert all(p.dtype == dtype for _, p in suite)
        assert len({n for n, _ in suite}) == len(suite)  # names are unique
    names = [n for n, _ in load_suite(path)]
    assert names[:2] == ["tiny_cnn.stem.n32", "tiny_cnn.blocks.0.dw.n32"] and "tiny_sv.video.n64" in names
    expected = {ConvBwdWeightProblem.from_ck(t.problem.to_ck()) for _, _, t in batched}
    assert {p for _, p in load_suite(path)} == expected


def test_the_shipped_zoo_is_a_suite_of_thirty_models_and_every_class():
    zoo = load_suite("zoo")
    bf16 = load_suite("zoo", "bf16")
    assert [p.with_(dtype="f16", dw_dtype="f16") for _, p in bf16] == [p for _, p in zoo]
    text = (__import__("convbw_mlir.suites", fromlist=["SUITES_DIR"]).SUITES_DIR / "zoo.tsv").read_text()
    models = {m.group(1) for m in re.finditer(r"^# ([\w.-]+): ", text, re.M) if m.group(1) != "not traced"}
    assert len(models) >= 30, sorted(models)
    assert len(zoo) == len({p for _, p in zoo})  # distinct
    ranks = {p.rank for _, p in zoo}
    assert ranks == {1, 2, 3}
    assert any(p.groups > 1 and p.in_channels == p.out_channels == 1 for _, p in zoo)  # depthwise
    assert any(p.groups > 1 and p.in_channels > 1 for _, p in zoo)  # grouped (ResNeXt, RegNet)


def test_a_model_library_that_does_not_import_is_one_line_naming_it(capsys):
    from convbw_mlir.cli import main

    try:
        import torchvision.models  # noqa: F401
    except Exception:  # noqa: BLE001 - missing, or a build for another torch (make test's case)
        pass
    else:
        pytest.skip("torchvision imports here")
    assert main(["problems", "--from-torchvision", "resnet18"]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("convbw: error: --from-torchvision: torchvision cannot be imported here (")
        and err.count("\n") == 1
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--batch", "0"], "convbw problems: argument --batch: expected integers >= 1 like 32,64, got '0'"),
     ([], "problems: no models (give --from-torchvision, --from-timm, --from-transformers or --zoo)"),
     (["--from-transformers", "bert"], "--from-transformers: unknown model 'bert'")],
)  # fmt: skip
def test_bad_problems_arguments_are_one_line(args, message, capsys):
    from convbw_mlir.cli import main

    if args[:1] == ["--from-transformers"]:
        pytest.importorskip("transformers")
    assert main(["problems", *args]) == 1
    assert capsys.readouterr().err == f"convbw: error: {message}\n"


def test_named_models_build_on_meta_without_downloads_where_their_libraries_import():
    try:
        import torchvision.models  # noqa: F401
    except Exception:  # noqa: BLE001 - missing, or a build for another torch (make test's case)
        pytest.skip("torchvision does not import here (make test: PyPI's CUDA build against the CPU torch)")
    from convbw_mlir.torch.zoo import model_convs

    calls = model_convs("torchvision", "resnet18")
    assert len(calls) == 20 and calls[0].layer == "conv1" and calls[0].problem.to_ck().startswith("2 1 2 64 3 7 7 224")
    # a pretrained backbone would be a download: none is asked for
    assert len(model_convs("torchvision", "deeplabv3_resnet50")) == 61
    # RegNet's builder reads the tensors it makes: built on the CPU, then moved to meta
    assert model_convs("torchvision", "regnet_y_400mf")[0].layer == "stem.0"
    assert [c.problem.rank for c in model_convs("torchvision", "r3d_18", video=(8, 56, 56))][:1] == [3]
