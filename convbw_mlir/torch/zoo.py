"""A model zoo as problems: the distinct weight-gradient problems of models, traced on the ``meta`` device.

A model is instantiated on the ``meta`` device (no weights, no download) and run once on an empty input
of the size given; every convolution it calls (``torch.nn.functional.conv1d/2d/3d``, so also the
padded-"same" and weight-standardized convolutions of timm, and the padding modes other than zeros, whose
input is padded before the call) is recorded with the module that called it. Each becomes a
:class:`convbw_mlir.problem.ConvBwdWeightProblem` (ckProfiler's default layout; the element type is the
suite loader's), one per batch size; :func:`suite_text` writes the distinct ones as a suite ``.tsv``
with the models and layers that use each as comments.

Sources: ``torchvision`` (``torchvision.models.get_model``; video models take ``video_input``),
``timm`` (``timm.create_model``), ``transformers`` (speech encoders built from their default configs:
``wav2vec2``, ``hubert``, ``wavlm``, ``data2vec-audio``, ``sew``, ``unispeech``, ``whisper``), or any
``torch.nn.Module`` through :func:`trace_convs`. The ``[zoo]`` extra installs them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = ["SOURCES", "ZOO", "Traced", "library_versions", "model_convs", "suite_text", "trace_convs", "zoo_problems"]

# The speech encoders of transformers this module builds, by name: (config class, model class, input kind).
_SPEECH = {
    "wav2vec2": ("Wav2Vec2Config", "Wav2Vec2Model", "audio"),
    "hubert": ("HubertConfig", "HubertModel", "audio"),
    "wavlm": ("WavLMConfig", "WavLMModel", "audio"),
    "data2vec-audio": ("Data2VecAudioConfig", "Data2VecAudioModel", "audio"),
    "sew": ("SEWConfig", "SEWModel", "audio"),
    "unispeech": ("UniSpeechConfig", "UniSpeechModel", "audio"),
    "whisper": ("WhisperConfig", "WhisperModel", "mel"),
}
SOURCES = ("torchvision", "timm", "transformers")
_CONVS = (torch.conv1d, torch.conv2d, torch.conv3d)


@dataclass(frozen=True)
class Traced:
    """One convolution call of a model: the module that made it and its problem (at the traced batch)."""

    layer: str
    problem: ConvBwdWeightProblem


def _tuple(v: Any, rank: int) -> tuple[int, ...]:
    return tuple(int(x) for x in v) if isinstance(v, (tuple, list)) else (int(v),) * rank


def _problem(args: tuple, kwargs: dict) -> ConvBwdWeightProblem:
    """The weight-gradient problem of ``torch.convNd(input, weight, bias, stride, padding, dilation, groups)``."""
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    call = dict(zip(names, args)) | kwargs
    x, w = call["input"], call["weight"]
    rank = w.dim() - 2
    shape = tuple(x.shape) if x.dim() == rank + 2 else (1, *x.shape)  # an unbatched input: one image
    groups = int(call.get("groups", 1))
    kernel = tuple(w.shape[2:])
    stride, dilation = _tuple(call.get("stride", 1), rank), _tuple(call.get("dilation", 1), rank)
    padding = call.get("padding", 0)
    if padding == "valid":
        lo = hi = (0,) * rank
    elif padding == "same":  # torch puts the odd element of the total on the high side
        total = [d * (k - 1) for d, k in zip(dilation, kernel)]
        lo, hi = tuple(t // 2 for t in total), tuple(t - t // 2 for t in total)
    else:
        lo = hi = _tuple(padding, rank)
    return ConvBwdWeightProblem(groups=groups, batch=shape[0], in_channels=shape[1] // groups,
                                out_channels=w.shape[0] // groups, input_size=shape[2:], filter_size=kernel,
                                stride=stride, dilation=dilation, pad_low=lo, pad_high=hi)  # fmt: skip


class _Recorder(TorchFunctionMode):
    """Records every convolution call with the innermost module running at the time."""

    def __init__(self, current: list[str]) -> None:
        super().__init__()
        self.current, self.calls = current, []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        kwargs = kwargs or {}
        if func in _CONVS:
            self.calls.append(Traced(self.current[-1] if self.current else "", _problem(args, kwargs)))
        return func(*args, **kwargs)


def trace_convs(model: torch.nn.Module, *inputs: Any, **kw_inputs: Any) -> list[Traced]:
    """Every convolution ``model(*inputs, **kw_inputs)`` calls, in order, with its module's name.

    Run in eval mode under ``torch.no_grad`` (shapes only; batch norm needs no statistics); put the model
    and the inputs on the ``meta`` device so nothing is computed or allocated.
    """
    names = {id(m): n for n, m in model.named_modules()}
    current: list[str] = []

    def enter(module: torch.nn.Module, _args: Any) -> None:
        current.append(names.get(id(module), current[-1] if current else ""))

    def leave(module: torch.nn.Module, _args: Any, _out: Any) -> None:
        current.pop()

    model.eval()
    hooks = [torch.nn.modules.module.register_module_forward_pre_hook(enter),
             torch.nn.modules.module.register_module_forward_hook(leave, always_call=True)]  # fmt: skip
    recorder = _Recorder(current)
    try:
        with torch.no_grad(), recorder:
            model(*inputs, **kw_inputs)
    finally:
        for h in hooks:
            h.remove()
    return recorder.calls


# ----------------------------------------------------------------------------------------------------------
# Models by name


def _import(source: str) -> Any:
    """The library of ``source``, or one ValueError naming it and why it does not import here."""
    try:
        if source == "torchvision":
            import torchvision.models as lib
        elif source == "timm":
            import timm as lib
        else:
            import transformers as lib
    except Exception as e:  # noqa: BLE001 - ImportError, or a build that does not match this torch
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = f"pip install 'convbw-mlir[zoo]' with a {source} built for torch {torch.__version__}"
        raise ValueError(f"--from-{source}: {source} cannot be imported here ({why}); {hint}") from None
    return lib


def library_versions(sources: Iterable[str]) -> str:
    """``torch 2.14.1, timm 1.0.31``: the versions the models of ``sources`` were traced with."""
    from importlib.metadata import PackageNotFoundError, version

    out = [f"torch {torch.__version__}"]
    for s in sorted(set(sources)):
        try:
            out.append(f"{s} {version(s)}")
        except PackageNotFoundError:
            out.append(f"{s} (no version)")
    return ", ".join(out)


def _names(source: str, lib: Any) -> list[str]:
    if source == "torchvision":
        return lib.list_models()
    if source == "timm":
        return lib.list_models()
    return list(_SPEECH)


def _video_names(lib: Any) -> set[str]:
    import torchvision.models.video as video

    return set(lib.list_models(module=video))


def model_convs(source: str, name: str, image: int = 224, video: Sequence[int] = (16, 112, 112),
                audio_samples: int = 16000) -> list[Traced]:  # fmt: skip
    """The convolutions of model ``name`` of ``source`` (:data:`SOURCES`), traced at batch 2 on ``meta``.

    Images are ``image`` x ``image``, videos ``video`` = (frames, height, width), speech ``audio_samples``
    samples (whisper: 80 mel bins x 3000 frames, its fixed input).

    Raises:
        ValueError: an unknown source or model (naming it), or a library that does not import here.
    """
    if source not in SOURCES:
        raise ValueError(f"source: expected one of {', '.join(SOURCES)}, got {source!r}")
    lib = _import(source)
    if name not in _names(source, lib):
        raise ValueError(f"--from-{source}: unknown model {name!r}")
    batch = 2  # not 1: a batch of one can take other paths (squeezes); the problems take every batch later
    try:
        with torch.device("meta"):
            model = _build(source, name, lib)
    except NotImplementedError as e:  # a builder that reads tensors it made (torchvision's RegNet widths)
        if "meta tensor" not in str(e):
            raise
        model = _build(source, name, lib).to("meta")  # made on the CPU (random weights, nothing downloaded)
    with torch.device("meta"):
        if source == "torchvision":
            x = torch.empty(batch, 3, *video) if name in _video_names(lib) else torch.empty(batch, 3, image, image)
            return trace_convs(model, x)
        if source == "timm":
            return trace_convs(model, torch.empty(batch, 3, image, image))
        if _SPEECH[name][2] == "mel":  # an encoder-decoder: the encoder holds the convolutions
            return trace_convs(model.get_encoder(), torch.empty(batch, model.config.num_mel_bins, 3000))
        return trace_convs(model, torch.empty(batch, audio_samples))


def _build(source: str, name: str, lib: Any) -> torch.nn.Module:
    """Model ``name`` of ``source`` with no pretrained weights (nor a pretrained backbone) to download."""
    if source == "torchvision":
        import inspect

        params = inspect.signature(lib.get_model_builder(name)).parameters
        return lib.get_model(name, weights=None, **({"weights_backbone": None} if "weights_backbone" in params else {}))
    if source == "timm":
        return lib.create_model(name, pretrained=False)
    config, cls, _ = _SPEECH[name]
    return getattr(lib, cls)(getattr(lib, config)())


# ----------------------------------------------------------------------------------------------------------
# The zoo and its suite file

Use = tuple[str, str, Traced]  # (source, model, one convolution call)

# The shipped zoo (convbw_mlir/suites/zoo.tsv): (source, model, options) traced by ``convbw problems --zoo``.
ZOO: tuple[tuple[str, str, dict[str, Any]], ...] = (
    *(("torchvision", n, {}) for n in (
        "resnet18", "resnet50", "resnext50_32x4d", "resnext101_32x8d", "wide_resnet50_2", "regnet_y_400mf",
        "regnet_x_1_6gf", "regnet_y_3_2gf", "mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small",
        "efficientnet_b0", "efficientnet_v2_s", "shufflenet_v2_x1_0", "mnasnet1_0", "squeezenet1_1",
        "densenet121", "googlenet", "vgg16", "convnext_tiny", "vit_b_16", "swin_t", "deeplabv3_resnet50")),
    *(("torchvision", n, {}) for n in ("r3d_18", "mc3_18", "r2plus1d_18")),
    ("torchvision", "s3d", {"video": (16, 224, 224)}),  # its last pooling needs 7x7 features
    *(("timm", n, {}) for n in ("tf_efficientnet_b0", "mixnet_s", "ghostnet_100", "rexnet_100", "regnety_016",
                                "resnest14d", "nf_resnet26", "dla34", "repvgg_a2", "lcnet_050", "cspresnet50")),
    *(("transformers", n, {}) for n in ("wav2vec2", "hubert", "wavlm", "data2vec-audio", "sew", "whisper")),
)  # fmt: skip


def zoo_problems(models: Iterable[tuple[str, str, dict[str, Any]]], batches: Sequence[int], image: int = 224,
                 video: Sequence[int] = (16, 112, 112), audio_samples: int = 16000,
                 batch_for: Callable[[str, str], Sequence[int]] | None = None,
                 log: Callable[[str], None] = lambda _: None) -> tuple[list[Use], dict[str, str]]:  # fmt: skip
    """Every convolution of ``models`` ((source, name, options) each; options override ``image``, ``video``,
    ``audio_samples``) at each of ``batches``: ((source, model, Traced) list, {model: why} of those that failed).

    A model that fails to build or trace is recorded with why and the rest go on; a source that does not
    import fails all of its models. ``batch_for(source, model)``, where given, overrides ``batches``.
    """
    out, failed = [], {}
    for source, name, options in models:
        try:
            calls = model_convs(source, name, **({"image": image, "video": video, "audio_samples": audio_samples}
                                                 | options))  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a model that does not trace on meta is named, not fatal
            failed[name] = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            log(f"{source} {name}: failed: {failed[name]}")
            continue
        for b in batch_for(source, name) if batch_for else batches:
            out += [(source, name, Traced(t.layer, t.problem.with_(batch=b))) for t in calls]
        log(f"{source} {name}: {len(calls)} convolutions")
    return out, failed


def _safe(text: str) -> str:
    """A suite name part: letters, digits, '.', '_', '-' (a tab or '#' would break the line)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "conv"


def suite_text(
    traced: Sequence[tuple[str, str, Traced]],
    header: Sequence[str] = (),
    failed: dict[str, str] | None = None,
    max_layers: int = 4,
) -> str:
    """The distinct problems of ``traced`` as a suite ``.tsv`` (``name<TAB>ckProfiler problem``), in order of
    first use, each after comment lines naming the models and layers that use it (``max_layers`` a model)."""
    uses: dict[ConvBwdWeightProblem, dict[str, list[str]]] = {}
    for _source, model, t in traced:
        uses.setdefault(t.problem, {}).setdefault(model, []).append(t.layer)
    lines = [f"# {h}" for h in header]
    models = list(dict.fromkeys(m for _s, m, _t in traced))
    lines.append(f"# {len(uses)} distinct problems from {len(traced)} convolution calls of {len(models)} models")
    for name, why in (failed or {}).items():
        lines.append(f"# not traced: {name}: {why}")
    taken: set[str] = set()
    for problem, by_model in uses.items():
        model, layers = next(iter(by_model.items()))
        base = f"{_safe(model)}.{_safe(layers[0])}.n{problem.batch}"
        name, k = base, 2
        while name in taken:
            name, k = f"{base}.{k}", k + 1
        taken.add(name)
        for m, ls in by_model.items():
            more = f" (+{len(ls) - max_layers} more)" if len(ls) > max_layers else ""
            lines.append(f"# {m}: {', '.join(ls[:max_layers]) or '(top level)'}{more}")
        lines.append(f"{name}\t{problem.to_ck()}")
    return "\n".join(lines) + "\n"
