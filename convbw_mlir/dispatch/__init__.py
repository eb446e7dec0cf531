"""The kernel dispatcher: declared variants, a parallel crash-isolated build, an on-disk cache, measured
tuning and select (docs/dispatch.md).

    from convbw_mlir.dispatch import Registry, candidates, select
    reg = Registry("sm_80"); reg.declare_candidates(problem); report = reg.build(max_workers=2)
    sel = select(problem, "sm_80")     # exact database hit, nearest tuned neighbour, or the heuristic
"""

from convbw_mlir.dispatch.build import BuildReport, BuildResult, Registry, cached_build, compile_variant
from convbw_mlir.dispatch.cache import CacheError, CacheTrustError, KernelCache, default_cache_dir
from convbw_mlir.dispatch.db import DatabaseError, TuningDB
from convbw_mlir.dispatch.select import Selection, databases, distance, select
from convbw_mlir.dispatch.variants import Variant, candidates, heuristic, row_chunk_variant, variant_key

__all__ = [
    "BuildReport",
    "BuildResult",
    "CacheError",
    "CacheTrustError",
    "DatabaseError",
    "KernelCache",
    "Registry",
    "Selection",
    "TuningDB",
    "Variant",
    "cached_build",
    "candidates",
    "compile_variant",
    "databases",
    "default_cache_dir",
    "distance",
    "heuristic",
    "row_chunk_variant",
    "select",
    "variant_key",
]
