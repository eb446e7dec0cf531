"""The IREE 3.13 entry for a kernel our passes write: a ``hal.executable.source`` and its ``flow.dispatch``.

IREE compiles such a dispatch as written (docs/iree-facts.md "The explicit kernel's entry"): the
func's ``translation_info`` names ``#iree_codegen.no_pipeline`` (no tiling, no distribution, only the
lowering to NVVM/ROCDL and LLVM) and carries ``workgroup_size`` (IREE overwrites the export's with it);
the export's ``count`` region returns the grid; operands arrive through
``hal.interface.binding.subspan``. All three ops have Python builders (``iree.compiler.dialects.hal``
and ``flow``); only attributes (pipeline layout, translation_info) are parsed from text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from iree.compiler import ir
from iree.compiler.dialects import arith, builtin, flow, func, hal

__all__ = ["KernelEntry", "build_dispatch"]


@dataclass(frozen=True)
class KernelEntry:
    """How IREE launches the kernel: its names, grid, workgroup and subgroup sizes, and bindings.

    Attributes:
        executable: symbol of the ``hal.executable.source``.
        function: symbol of the export and of its ``func.func``.
        grid: workgroups along x, y, z.
        workgroup_size: threads along x, y, z.
        subgroup_size: threads of a warp (32) or wave (32 / 64).
        bindings: the kernel's memref types, inputs first, the result last.
    """

    executable: str
    function: str
    grid: tuple[int, int, int]
    workgroup_size: tuple[int, int, int]
    subgroup_size: int
    bindings: tuple[ir.Type, ...]

    def layout(self) -> ir.Attribute:
        """``#hal.pipeline.layout``: every input read-only, the result (last) writable."""
        entries = ["#hal.pipeline.binding<storage_buffer, ReadOnly>"] * (len(self.bindings) - 1)
        entries.append("#hal.pipeline.binding<storage_buffer>")
        return ir.Attribute.parse(f"#hal.pipeline.layout<bindings = [{', '.join(entries)}]>")

    def translation_info(self) -> ir.Attribute:
        x, y, z = self.workgroup_size
        return ir.Attribute.parse(
            "#iree_codegen.translation_info<pipeline = #iree_codegen.no_pipeline "
            f"workgroup_size = [{x}, {y}, {z}] subgroup_size = {self.subgroup_size}>"
        )


def _build_executable(entry: KernelEntry, body: Callable[[ir.Block, list[ir.Value]], None]) -> None:
    """The ``hal.executable.source`` with one export and its ``func.func`` (at the insertion point)."""
    index = ir.IndexType.get()
    layout = entry.layout()
    source = hal.ExecutableSourceOp(entry.executable, sym_visibility="private")
    source.body.blocks.append()
    with ir.InsertionPoint(source.body.blocks[0]):
        export = hal.ExecutableExportOp(
            entry.function,
            layout,
            ordinal=ir.IntegerAttr.get(index, 0),
            workgroup_size=ir.ArrayAttr.get([ir.IntegerAttr.get(index, v) for v in entry.workgroup_size]),
            subgroup_size=ir.IntegerAttr.get(index, entry.subgroup_size),
        )
        count = export.workgroup_count.blocks.append(ir.Type.parse("!hal.device"))
        with ir.InsertionPoint(count):
            hal.ReturnOp([arith.constant(index, v) for v in entry.grid])
        inner = builtin.ModuleOp()
        with ir.InsertionPoint(inner.body):
            fn = func.FuncOp(entry.function, ir.FunctionType.get([], []))
            fn.attributes["translation_info"] = entry.translation_info()
            block = fn.add_entry_block()
            with ir.InsertionPoint(block):
                zero = arith.constant(index, 0)
                memrefs = [
                    hal.InterfaceBindingSubspanOp(t, layout, i, [], byte_offset=zero, alignment=64).result
                    for i, t in enumerate(entry.bindings)
                ]
                body(block, memrefs)
                func.ReturnOp([])
        hal.ExecutableSourceEndOp()


def build_dispatch(
    entry: KernelEntry,
    body: Callable[[ir.Block, list[ir.Value]], None],
    operands: Sequence[ir.Value],
    result_type: ir.Type,
    module_ip: ir.InsertionPoint,
) -> ir.Value:
    """Emit the executable at ``module_ip`` and, at the current insertion point, the ``flow.dispatch``
    calling it on ``operands``; returns the dispatch's result tensor.

    Args:
        body: fills the kernel function's entry block, given the bound memrefs (inputs, then the result).
    """
    with module_ip:
        _build_executable(entry, body)
    target = ir.SymbolRefAttr.get([entry.executable, entry.function])
    op = flow.DispatchOp([result_type], [], ir.ArrayAttr.get([target]), list(operands), [], [])
    return op.results[0]
