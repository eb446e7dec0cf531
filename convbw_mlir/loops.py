"""The contraction's loops: names and extents of the one ``linalg.generic`` a convbw op lowers to, and
the split of its reduction (pure Python: the plan reasons with it, the compiler is not needed).

    s          the split loop of a chunked split-K (parallel, outermost)
    g k c      groups, out channels (the GEMM's M), in channels (the GEMM's N); parallel
    f0 f1 f2   filter taps, outermost first; parallel
    n o0 o1 o2 batch and output positions: the reduction (made parallel by a rows split)
    a*b        two reduction loops merged into one (a GEMM's ``n*o0``)

Loops of extent 1 are left out. ``convbw_mlir.contraction`` writes a :class:`Contraction` into the IR as an
attribute and reads it back; loop names are produced and interpreted here and nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from convbw_mlir.problem import ConvBwdWeightProblem

__all__ = ["Contraction", "InputPads", "Split", "check_split", "contraction_loops", "input_pads", "reduction_extents"]


@dataclass(frozen=True)
class Split:
    """A split of one reduction loop into ``k_batch`` chunks of ``chunk`` iterations.

    ``dim`` is ``n`` (batch) or ``o0``/``o1``/``o2`` (an output spatial loop, outermost first). When
    ``k_batch * chunk`` exceeds the loop's extent the last chunk reads zero padding: no work is
    dropped and the padding contributes nothing.

    A comma-separated ``dim`` (``"n,o0"``, a *rows* split) names loops made parallel whole: every
    combination (each image's each output row) is its own partial sum, ``chunk`` is 1 and ``k_batch``
    the product of their extents. Nothing is reshaped for it: the loops simply stop being reductions.
    """

    dim: str
    k_batch: int
    chunk: int

    def __post_init__(self) -> None:
        if self.k_batch < 1 or self.chunk < 1:
            raise ValueError(f"split: k_batch and chunk must be positive, got {self.k_batch} and {self.chunk}")
        if self.promoted and self.chunk != 1:
            raise ValueError(f"split: a split over loops {self.dim} takes chunk 1, got {self.chunk}")

    @property
    def padded_extent(self) -> int:
        return self.k_batch * self.chunk

    @property
    def promoted(self) -> tuple[str, ...]:
        """The loops a rows split makes parallel (empty for a chunked split of one loop)."""
        return tuple(self.dim.split(",")) if "," in self.dim else ()


@dataclass(frozen=True)
class InputPads:
    """How the lowering pads x and dy before the contraction (per dimension of their layouts): x by the
    problem's pads and further where a split reads past the end, dy where an uneven split does;
    ``x_slice`` keeps only the leading rows of an x dimension (position -> rows)."""

    x_low: tuple[int, ...]
    x_high: tuple[int, ...]
    dy_high: tuple[int, ...]
    x_slice: tuple[tuple[int, int], ...] = ()

    def x_shape(self, problem: ConvBwdWeightProblem) -> tuple[int, ...]:
        """x's shape after the pads and the slice."""
        shape = [d + lo + hi for d, lo, hi in zip(problem.x_shape, self.x_low, self.x_high)]
        for pos, rows in self.x_slice:
            shape[pos] = rows
        return tuple(shape)

    def dy_shape(self, problem: ConvBwdWeightProblem) -> tuple[int, ...]:
        return tuple(d + hi for d, hi in zip(problem.dy_shape, self.dy_high))


def input_pads(problem: ConvBwdWeightProblem, split: Split | None = None) -> InputPads:
    """The pads of x and dy the lowering makes for ``problem`` and ``split`` (``convbw-lower-to-linalg``)."""
    x_dims, dy_dims = problem.dims("x"), problem.dims("dy")
    x_low, x_high = [0] * len(x_dims), [0] * len(x_dims)
    dy_high = [0] * len(dy_dims)
    x_slice: dict[int, int] = {}
    spatial = [s for s in x_dims if s in "DHW"]
    for i, letter in enumerate(spatial):
        pos = x_dims.index(letter)
        x_low[pos], x_high[pos] = problem.pad_low[i], problem.pad_high[i]
        out = problem.output_size[i]
        if split and split.dim == f"o{i}":
            out = split.padded_extent
            dy_high[dy_dims.index(letter)] = out - problem.output_size[i]
        # The last x row read, + 1, against the padded extent (an uneven split reads further).
        needed = (out - 1) * problem.stride[i] + (problem.filter_size[i] - 1) * problem.dilation[i] + 1
        have = problem.input_size[i] + problem.pad_low[i] + problem.pad_high[i]
        x_high[pos] += max(0, needed - have)
        if out == 1 and problem.dilation[i] == 1 and needed < have:
            # A single output position leaves x indexed by the filter loop alone, and linalg infers
            # that loop's extent from x: x must hold exactly the rows read.
            x_slice[pos] = needed
    if split and split.dim == "n":
        extra = split.padded_extent - problem.batch
        x_high[x_dims.index("N")] += extra
        dy_high[dy_dims.index("N")] += extra
    return InputPads(tuple(x_low), tuple(x_high), tuple(dy_high), tuple(sorted(x_slice.items())))


def reduction_extents(problem: ConvBwdWeightProblem) -> dict[str, int]:
    """Extents of the reduction loops: ``n`` and ``o0``.. (output spatial, outermost first)."""
    return {"n": problem.batch, **{f"o{i}": o for i, o in enumerate(problem.output_size)}}


def check_split(problem: ConvBwdWeightProblem, split: Split) -> None:
    """Raise ValueError unless ``split`` is a valid split of ``problem``'s reduction loops."""
    extents = reduction_extents(problem)
    if split.promoted:
        unknown = [d for d in split.promoted if d not in extents]
        if unknown or len(set(split.promoted)) != len(split.promoted):
            raise ValueError(
                f"split_dim: '{split.dim}' must name distinct reduction loops; loops: {', '.join(extents)}"
            )
        count = math.prod(extents[d] for d in split.promoted)
        if split.k_batch != count:
            raise ValueError(f"split: k_batch {split.k_batch} must be {count}, the extents of {split.dim} multiplied")
    elif split.dim not in extents:
        raise ValueError(f"split_dim: '{split.dim}' is not a reduction loop; loops: {', '.join(extents)}")
    elif split.padded_extent < extents[split.dim] or (split.k_batch - 1) * split.chunk >= extents[split.dim]:
        raise ValueError(
            f"split: k_batch {split.k_batch} x chunk {split.chunk} must cover loop '{split.dim}' "
            f"of extent {extents[split.dim]} with no empty chunk"
        )


def filter_loop(problem: ConvBwdWeightProblem, letter: str) -> str:
    """Accumulator letter -> loop name (g, k, f0.., c)."""
    if letter in "ZYX":
        filt = [d for d in problem.dims("dw") if d in "ZYX"]
        return f"f{filt.index(letter)}"
    return letter.lower()


def contraction_loops(problem: ConvBwdWeightProblem, split: Split | None = None) -> tuple[dict[str, int], int]:
    """The generic's loops in order, name -> extent, and how many of them are parallel.

    Parallel: ``s`` (split) if any, then g, k, f0.., c; reduction: n, o0..; loops of extent 1 are left
    out. A split loop's extent is its chunk; a rows split puts its loops (n, o0) first among the parallel
    ones instead of ``s``.
    """
    extents = {"g": problem.groups, "k": problem.out_channels, "c": problem.in_channels, "n": problem.batch}
    extents |= {f"f{i}": f for i, f in enumerate(problem.filter_size)}
    extents |= {f"o{i}": o for i, o in enumerate(problem.output_size)}
    promoted = list(split.promoted) if split else []
    if split and not promoted:
        extents[split.dim] = split.chunk
    parallel = [filter_loop(problem, a) for a in problem.dims("acc")]
    reduction = [name for name in ["n"] + [f"o{i}" for i in range(problem.rank)] if name not in promoted]
    loops: dict[str, int] = {"s": split.k_batch} if split and not promoted else {}
    loops |= {name: extents[name] for name in promoted if extents[name] > 1}
    loops |= {name: extents[name] for name in parallel if extents[name] > 1}
    n_parallel = len(loops)
    loops |= {name: extents[name] for name in reduction if extents[name] > 1}
    return loops, n_parallel


def merged_name(a: str, b: str) -> str:
    """The name of reduction loops ``a`` and ``b`` merged into one."""
    return f"{a}*{b}"


@dataclass(frozen=True)
class Contraction:
    """A typed view of one contraction: the problem it computes, its split, its loops and the plan
    (a :class:`convbw_mlir.plan.Plan` as a dictionary, or None where no plan was made)."""

    problem: ConvBwdWeightProblem
    split: Split | None
    loops: tuple[tuple[str, int], ...]  # (name, extent) in loop order
    n_parallel: int
    plan: dict[str, Any] | None = None

    @classmethod
    def build(cls, problem: ConvBwdWeightProblem, split: Split | None = None) -> Contraction:
        """The contraction ``convbw-lower-to-linalg`` builds for ``problem`` (before loops are merged)."""
        loops, n_parallel = contraction_loops(problem, split)
        return cls(problem, split, tuple(loops.items()), n_parallel)

    # -- what the GPU passes ask ----------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.loops]

    @property
    def extents(self) -> list[int]:
        return [extent for _, extent in self.loops]

    @property
    def parallel(self) -> list[str]:
        """The parallel loops, in order (they come first)."""
        return self.names[: self.n_parallel]

    @property
    def reduction_extent(self) -> int:
        """Reduction elements per output element (merged or not, the product is the same)."""
        return math.prod(self.extents[self.n_parallel :])

    @property
    def is_convolution(self) -> bool:
        """Whether a filter loop is left (an implicit GEMM over taps), rather than a plain GEMM."""
        return any(name.startswith("f") for name in self.names)

    @property
    def has_split_loop(self) -> bool:
        """Whether a chunked split-K made the split its own parallel loop ``s``."""
        return "s" in self.names

    @property
    def has_gemm_dims(self) -> bool:
        """Whether both GEMM dimensions (out channels M, in channels N) are loops (extent > 1)."""
        return "k" in self.names and "c" in self.names

    @property
    def is_rows_split(self) -> bool:
        """Whether this is the first stage of a rows split (loops n and o0 parallel)."""
        return bool(set(self.parallel) & {"n", "o0"})

    def role(self, name: str) -> str:
        """What a loop is to a tile: ``m`` (out channels), ``n`` (in channels), ``filter``, ``group``,
        ``split``, ``image`` and ``row`` (a rows split's parallel batch and first output loop), or
        ``reduction``.

        Raises:
            KeyError: no such loop.
        """
        if name not in self.names:
            raise KeyError(f"contraction: no loop {name!r}; loops: {', '.join(self.names)}")
        if self.names.index(name) >= self.n_parallel:
            return "reduction"
        if name.startswith("f"):
            return "filter"
        return {"k": "m", "c": "n", "g": "group", "s": "split", "n": "image", "o0": "row"}[name]

    def merge(self, i: int) -> Contraction:
        """The contraction with reduction loops ``i`` and ``i + 1`` merged into one."""
        (a, ea), (b, eb) = self.loops[i], self.loops[i + 1]
        loops = (*self.loops[:i], (merged_name(a, b), ea * eb), *self.loops[i + 2 :])
        return Contraction(self.problem, self.split, loops, self.n_parallel, self.plan)

    def with_plan(self, plan: dict[str, Any] | None) -> Contraction:
        return Contraction(self.problem, self.split, self.loops, self.n_parallel, plan)
