"""The kernel builders' toolkit (convbw_mlir/kernels/ir.py): the control-flow context managers write the scf ops
and their terminators, the index helpers hoist or fold as documented, and the mbarrier ring's producer and consumer
halves wait on the parities a fresh barrier needs. The kernels' own IR is compared byte for byte before and after
the toolkit by bench/ir_identity.py (docs/plan.md "kernel toolkit: the identity check")."""

from __future__ import annotations

import pytest

from convbw_mlir.ir_imports import ir, new_context
from convbw_mlir.kernels.ir import Ints, Ix, Pipeline, for_, if_, while_


def _built(body) -> str:
    """``body(block)`` inside ``func.func @f(%arg0: index, %arg1: i1)``, verified, as text."""
    from iree.compiler.dialects import func

    with new_context(), ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            fn = func.FuncOp("f", ir.FunctionType.get([ir.IndexType.get(), ir.IntegerType.get_signless(1)], []))
            block = fn.add_entry_block()
        with ir.InsertionPoint(block):
            body(block)
            func.ReturnOp([])
        assert module.operation.verify()
        return str(module)


def test_if_for_and_while_write_their_terminators_and_carry_values():
    from iree.compiler.dialects import arith

    def body(block: ir.Block) -> None:
        ix = Ix(block)
        n, cond = block.arguments
        with for_(ix.c(0), n, ix.c(1), [ix.c(0)]) as loop:
            with if_(cond, [n.type]) as branch:
                branch.yield_(ix.add(loop.args[0], loop.iv))
            with branch.otherwise():
                branch.yield_(loop.args[0])
            loop.yield_(branch.results[0])
        with if_(cond), while_() as spin:
            spin.again_if(arith.cmpi(arith.CmpIPredicate.ult, loop.results[0], n))

    text = _built(body)
    assert "scf.for" in text and "iter_args" in text
    assert text.count("scf.yield") == 4  # then, else, the loop's, the while's after block (a bare if's is implicit)
    assert "scf.condition" in text and "scf.while" in text


def test_a_block_left_without_its_values_is_an_error_not_a_bad_module():
    def no_condition(block: ir.Block) -> None:
        with while_():
            pass

    with pytest.raises(RuntimeError, match="again_if"):
        _built(no_condition)

    def yield_outside(block: ir.Block) -> None:
        ix = Ix(block)
        loop = for_(ix.c(0), block.arguments[0], ix.c(1))
        with pytest.raises(RuntimeError, match="yield_: outside the block"):
            loop.yield_()
        with loop:
            pass

    _built(yield_outside)


def test_ix_hoists_each_constant_once_to_the_entry_block_and_folds_adding_zero():
    def body(block: ir.Block) -> None:
        ix = Ix(block)
        n = block.arguments[0]
        assert ix.add(n, 0) is n and ix.sub(n, 0) is n
        with for_(ix.c(0), n, ix.c(1)):
            ix.mul(n, 7)
        ix.mul(n, 7)

    text = _built(body)
    assert text.count("arith.constant 7 : index") == 1
    assert text.index("arith.constant 7") < text.index("scf.for")


def test_pipeline_producer_waits_on_the_previous_rounds_parity_and_the_consumer_on_this_rounds():
    from types import SimpleNamespace

    from iree.compiler.dialects import arith

    t = SimpleNamespace(stages=2, a_bytes=1024, b_bytes=1024, barriers=4096, empty_count=128, cluster=1)

    def body(block: ir.Block) -> None:
        b = Ints()
        pipe = Pipeline(b, t, arith.constant(b.i32, 0))
        kt = block.arguments[0]
        pipe.commit(pipe.acquire(kt))
        pipe.wait(kt)
        pipe.release(kt)

    text = _built(body)
    waits = [line for line in text.splitlines() if "mbarrier.try_wait.parity" in line]
    assert len(waits) == 2 and "arith.xori" in text  # the producer's parity flipped: a fresh barrier passes 1
    assert "mbarrier.arrive.expect_tx" in text and "nvvm.mbarrier.arrive " in text
