"""What every convbw pass shares: typed options, a registry keyed by pipeline argument, and the
parsing of MLIR textual pipelines that mix convbw passes with any pass IREE's bindings know.

A convbw pass is a class with ``argument``, ``description`` and an ``Options`` dataclass whose fields
carry ``help`` metadata. An instance is a callable ``(op, pass_)`` added to a real MLIR ``PassManager``
with ``pm.add(instance, name, argument)``; it reports errors as MLIR diagnostics at the op's location
and calls ``pass_.signal_pass_failure()``.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from convbw_mlir.ir_imports import ir, passmanager

__all__ = [
    "PASSES",
    "ConvbwPass",
    "PassFailure",
    "PipelineElement",
    "PipelineError",
    "build_pass_manager",
    "collect_ops",
    "format_pipeline",
    "option",
    "parse_pipeline",
    "register",
]


def collect_ops(root: ir.Operation, name: str) -> list[ir.Operation]:
    """Every op named ``name`` under ``root``, in pre-order (collected first, so callers may rewrite)."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == name:
            found.append(op.operation)
        return ir.WalkResult.ADVANCE

    root.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


class PipelineError(ValueError):
    """A pipeline string names an unknown pass or option, or has a malformed value."""


class PassFailure(Exception):
    """Raised inside a pass after it has emitted its diagnostics; the pass then signals failure."""


def option(default: Any, help: str, choices: tuple[str, ...] = ()) -> Any:  # noqa: A002 - MLIR's word
    """A pass option: a dataclass field with its default, help text and (for strings) allowed values."""
    return field(default=default, metadata={"help": help, "choices": choices})


PASSES: dict[str, type[ConvbwPass]] = {}


def register(cls: type[ConvbwPass]) -> type[ConvbwPass]:
    """Class decorator: make a pass known to pipelines under its ``argument``."""
    PASSES[cls.argument] = cls
    return cls


class ConvbwPass:
    """Base of convbw passes. Subclasses set ``argument``, ``description``, ``Options`` and ``run``."""

    argument: ClassVar[str]
    description: ClassVar[str]

    @dataclass
    class Options:
        pass

    def __init__(self, options: Any = None, **kwargs: Any) -> None:
        self.options = options if options is not None else self.Options(**kwargs)

    @property
    def name(self) -> str:
        return type(self).__name__

    def run(self, module: ir.Operation) -> None:
        raise NotImplementedError

    def __call__(self, op: ir.Operation, pass_: Any) -> None:
        try:
            self.run(op)
        except PassFailure:
            pass_.signal_pass_failure()
        except Exception as e:  # a bug in a pass: report it where MLIR reports everything else
            op.location.emit_error(f"{self.argument}: internal error: {type(e).__name__}: {e}")
            pass_.signal_pass_failure()

    def fail(self, op: ir.Operation | ir.OpView, message: str) -> PassFailure:
        """Emit ``message`` at ``op``'s location; return the exception to raise."""
        op.operation.location.emit_error(f"{self.argument}: {message}")
        return PassFailure(message)

    # -- options as text ------------------------------------------------------------------------
    @classmethod
    def option_fields(cls) -> list[dataclasses.Field]:
        return list(dataclasses.fields(cls.Options))

    @classmethod
    def from_text(cls, text: str) -> ConvbwPass:
        """Build from ``key=value key2=value2`` (the inside of the braces of a pipeline element)."""
        fields_ = {f.name.replace("_", "-"): f for f in cls.option_fields()}
        hints = typing.get_type_hints(cls.Options)
        kwargs: dict[str, Any] = {}
        for item in text.split():
            key, eq, value = item.partition("=")
            if key not in fields_:
                known = ", ".join(fields_) or "none"
                raise PipelineError(f"{cls.argument}: unknown option '{key}'; options: {known}")
            if not eq:
                raise PipelineError(f"{cls.argument}: option '{key}' needs a value ({key}=...)")
            f = fields_[key]
            kwargs[f.name] = _parse_value(cls.argument, key, value, hints[f.name], f.metadata.get("choices", ()))
        try:
            return cls(**kwargs)
        except ValueError as e:
            raise PipelineError(f"{cls.argument}: {e}") from None

    def options_text(self) -> str:
        parts = []
        for f in self.option_fields():
            value = getattr(self.options, f.name)
            if value is None:
                continue
            text = str(value).lower() if isinstance(value, bool) else str(value)
            parts.append(f"{f.name.replace('_', '-')}={text}")
        return " ".join(parts)

    def pipeline_text(self) -> str:
        opts = self.options_text()
        return f"{self.argument}{{{opts}}}" if opts else self.argument


def _parse_value(pass_arg: str, key: str, value: str, hint: Any, choices: tuple[str, ...]) -> Any:
    """Parse an option value by the field's type hint: int, bool, str, or ``int | str`` (e.g. auto|4)."""
    args = typing.get_args(hint) or (hint,)
    if value == "none" and type(None) in args:
        return None
    if int in args:
        try:
            return int(value)
        except ValueError:
            if str not in args or (choices and value not in choices):
                allowed = f" or one of {', '.join(choices)}" if choices else ""
                raise PipelineError(f"{pass_arg}: option '{key}' expects an integer{allowed}, got '{value}'") from None
    if bool in args:
        if value not in ("true", "false", "1", "0"):
            raise PipelineError(f"{pass_arg}: option '{key}' expects true or false, got '{value}'")
        return value in ("true", "1")
    if choices and value not in choices:
        raise PipelineError(f"{pass_arg}: option '{key}' expects one of {', '.join(choices)}, got '{value}'")
    return value


@dataclass(frozen=True)
class PipelineElement:
    """One element of a pipeline: a convbw pass instance, or the text of any other pass (nesting too)."""

    text: str
    convbw: ConvbwPass | None = None

    @property
    def argument(self) -> str:
        return self.convbw.argument if self.convbw else self.text.split("{")[0].split("(")[0]

    def __str__(self) -> str:
        return self.convbw.pipeline_text() if self.convbw else self.text


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "({":
            depth += 1
        elif ch in ")}":
            depth -= 1
            if depth < 0:
                raise PipelineError(f"pipeline: unbalanced ')' or '}}' at offset {i} in '{text}'")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise PipelineError(f"pipeline: unbalanced '(' or '{{' in '{text}'")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def parse_pipeline(text: str) -> list[PipelineElement]:
    """Parse ``builtin.module(a,b{x=1},func.func(cse))`` or the bare list ``a,b{x=1}``.

    Elements naming a convbw pass become instances with parsed options; any other element is kept as
    text and checked by MLIR's own pipeline parser.

    Raises:
        PipelineError: unknown pass (listing the convbw passes), unknown option, malformed value.
    """
    text = text.strip()
    if text.startswith("builtin.module(") and text.endswith(")"):
        text = text[len("builtin.module(") : -1]
    elements = []
    for part in _split_top_level(text):
        head = part.split("{", 1)[0].split("(", 1)[0].strip()
        if head in PASSES:
            opts = ""
            if "{" in part:
                if not part.endswith("}"):
                    raise PipelineError(f"pipeline: malformed element '{part}'")
                opts = part[part.index("{") + 1 : -1]
            elements.append(PipelineElement(part, PASSES[head].from_text(opts)))
        elif head.startswith("convbw-"):
            raise PipelineError(f"pipeline: unknown pass '{head}'; convbw passes: {', '.join(sorted(PASSES))}")
        else:
            _check_mlir_element(part)
            elements.append(PipelineElement(part))
    return elements


def _check_mlir_element(text: str) -> None:
    try:
        passmanager.PassManager.parse(f"builtin.module({text})", context=ir.Context())
    except ValueError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else str(e)
        raise PipelineError(
            f"pipeline: '{text}' is not a pass MLIR or IREE knows ({first}); convbw passes: {', '.join(sorted(PASSES))}"
        ) from None


def format_pipeline(elements: list[PipelineElement]) -> str:
    """The replayable textual form: ``builtin.module(...)``."""
    return f"builtin.module({','.join(str(e) for e in elements)})"


def build_pass_manager(elements: list[PipelineElement], context: ir.Context | None = None) -> passmanager.PassManager:
    """A PassManager on ``builtin.module`` running ``elements`` in order."""
    pm = passmanager.PassManager("builtin.module", context=context)
    for e in elements:
        if e.convbw:
            pm.add(e.convbw, e.convbw.name, e.convbw.argument, e.convbw.description)
        else:
            pm.add(e.text)
    return pm
