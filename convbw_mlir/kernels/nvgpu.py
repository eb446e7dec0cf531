"""The ``nvgpu`` ops the sm_80 kernels use, created generically.

IREE 3.13's bindings have no ``nvgpu`` Python module, and its parser rejects these ops' custom forms
with attributes ("expected 'mmaShape'", docs/iree-facts.md): each op here is an
``ir.Operation.create`` in the generic form, its properties given as inherent attributes.
"""

from __future__ import annotations

from iree.compiler import ir

__all__ = ["async_copy", "ldmatrix", "mma_sync"]


def _i32(value: int) -> ir.IntegerAttr:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(32), value)


def _index(value: int) -> ir.IntegerAttr:
    return ir.IntegerAttr.get(ir.IndexType.get(), value)


def async_copy(
    dst: ir.Value,
    dst_indices: list[ir.Value],
    src: ir.Value,
    src_indices: list[ir.Value],
    elements: int,
    src_elements: ir.Value | None = None,
    bypass_l1: bool = True,
) -> ir.Value:
    """``nvgpu.device_async_copy``: PTX ``cp.async`` of ``elements`` from global ``src`` to shared ``dst``.

    Args:
        src_elements: how many of the elements to read (the rest are zero-filled); None reads all.
        bypass_l1: ``cp.async.cg`` (16-byte copies only): the tile is read once, so L1 is skipped.

    Returns:
        The copy's async token (the commit and wait go through ``nvvm`` ops, so it may stay unused).
    """
    attrs = {
        "dstElements": _index(elements),
        "operandSegmentSizes": ir.DenseI32ArrayAttr.get(
            [1, len(dst_indices), 1, len(src_indices), 0 if src_elements is None else 1]
        ),
    }
    if bypass_l1:
        attrs["bypassL1"] = ir.UnitAttr.get()
    operands = [dst, *dst_indices, src, *src_indices, *([] if src_elements is None else [src_elements])]
    op = ir.Operation.create(
        "nvgpu.device_async_copy",
        results=[ir.Type.parse("!nvgpu.device.async.token")],
        operands=operands,
        attributes=attrs,
    )
    return op.result


def ldmatrix(
    smem: ir.Value, indices: list[ir.Value], tiles: int, element: ir.Type, transpose: bool = False
) -> ir.Value:
    """``nvgpu.ldmatrix``: PTX ``ldmatrix.sync.aligned.m8n8.x{tiles}``; each lane gets ``tiles`` x 2 elements.

    Every lane passes the address of one 8-element row: lanes 8i..8i+7 those of matrix i.
    """
    op = ir.Operation.create(
        "nvgpu.ldmatrix",
        results=[ir.VectorType.get([tiles, 2], element)],
        operands=[smem, *indices],
        attributes={"numTiles": _i32(tiles), "transpose": ir.BoolAttr.get(transpose)},
    )
    return op.result


def mma_sync(a: ir.Value, b: ir.Value, c: ir.Value, shape: tuple[int, int, int] = (16, 8, 16)) -> ir.Value:
    """``nvgpu.mma.sync``: PTX ``mma.sync.aligned.m16n8k16.row.col`` (A row-major, B column-major)."""
    op = ir.Operation.create(
        "nvgpu.mma.sync",
        results=[c.type],
        operands=[a, b, c],
        attributes={
            "mmaShape": ir.ArrayAttr.get([ir.IntegerAttr.get(ir.IntegerType.get_signless(64), s) for s in shape])
        },
    )
    return op.result
