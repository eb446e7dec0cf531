"""The MLIR imports of convbw-mlir, in one place (as iree-turbine's ``support/ir_imports.py``).

Importing this module loads the IREE compiler's bindings; modules that must work with only the IREE
runtime installed (``runtime``, ``reference``, ``problem``) never import it at module level.
"""

from iree.compiler import (  # noqa: F401
    ir,
    passmanager,
    rewrite,  # noqa: F401
)
from iree.compiler.dialects import arith as arith_d  # noqa: F401
from iree.compiler.dialects import func as func_d  # noqa: F401
from iree.compiler.dialects import linalg as linalg_d  # noqa: F401
from iree.compiler.dialects import tensor as tensor_d  # noqa: F401
from iree.compiler.dialects import util as util_d  # noqa: F401

ELEMENT_TYPES = {"f16": ir.F16Type.get, "bf16": ir.BF16Type.get, "f32": ir.F32Type.get,
                 "e4m3": ir.Float8E4M3FNType.get, "e5m2": ir.Float8E5M2Type.get}  # fmt: skip


def element_type(name: str) -> ir.Type:
    """The MLIR element type for "f16", "bf16", "f32", "e4m3" (f8E4M3FN) or "e5m2" (f8E5M2), in the current context."""
    return ELEMENT_TYPES[name]()


def new_context() -> ir.Context:
    """A context with every dialect of IREE's bindings and unregistered ops allowed (for ``convbw.*``)."""
    ctx = ir.Context()
    ctx.allow_unregistered_dialects = True
    return ctx
