"""The kernel cache key: each field of the request changes it, and so does an edit to the code that shapes a
kernel (issue 28, items 1 and 3)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from convbw_mlir.dispatch import code_hash as code_hash_mod
from convbw_mlir.dispatch import variants
from convbw_mlir.dispatch.variants import Variant, variant_key
from convbw_mlir.plan import decide
from convbw_mlir.policies.amd import FORCE_FORM_ENV
from convbw_mlir.problem import ConvBwdWeightProblem

ROOT = Path(__file__).resolve().parents[1]
P = ConvBwdWeightProblem.from_ck("2 1 8 16 16 3 3 14 14 1 1 1 1 1 1 1 1")


def key(problem=P, target="gfx942", variant=None, iree="3.13.0", extra_flags=None, output_arg=False) -> str:
    return variant_key(problem, target, variant or Variant("iree_direct"), iree, extra_flags, output_arg)


# One change per field of the request; IREE's forms carry no plan, so only "target" tells gfx942 from gfx1100.
FIELDS = {
    "problem": lambda: key(problem=P.with_(batch=16)),
    "target (AMD)": lambda: key(target="gfx1100"),
    "form": lambda: key(variant=Variant("iree_torch")),
    "form's flags": lambda: key(variant=Variant("iree_fusilli")),
    "plan": lambda: key(variant=Variant("convbw", decide(P, "gfx942", k_batch=2))),
    "extra_flags": lambda: key(extra_flags=["--iree-opt-level=O3"]),
    "iree version": lambda: key(iree="3.14.0"),
    "output_arg": lambda: key(output_arg=True),
}


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_each_field_of_the_request_changes_the_key(field):
    assert FIELDS[field]() != key()


def test_sm_80_and_sm_86_have_their_own_keys_for_iree_forms():
    assert key(target="sm_80") != key(target="sm_86")


def test_the_product_version_code_and_a_forced_form_change_the_key(monkeypatch):
    base = key()
    monkeypatch.setattr(variants, "product_version", lambda: "9.9.9")
    assert key() != base
    monkeypatch.undo()
    monkeypatch.setattr(code_hash_mod, "code_hash", lambda: "0" * 64)
    assert key() != base
    monkeypatch.undo()
    monkeypatch.setenv(FORCE_FORM_ENV, "a")
    assert key() != base


def test_an_edit_to_a_kernel_builder_changes_the_cache_key(tmp_path, monkeypatch):
    sources = code_hash_mod.kernel_sources()
    builder = dict(sources)["convbw_mlir.kernels/gemm_sm80.py"]
    copy = tmp_path / "gemm_sm80.py"
    shutil.copy2(builder, copy)
    edited = [(name, copy if path == builder else path) for name, path in sources]
    monkeypatch.setattr(code_hash_mod, "kernel_sources", lambda: edited)
    code_hash_mod.code_hash.cache_clear()
    sm80 = Variant("convbw", decide(P, "sm_80", strategy="explicit"))
    before = key(target="sm_80", variant=sm80)
    mutant = ("ix.mul(f, conv.dilation[dim])", "ix.mul(f, conv.stride[dim])")  # issue 28's surviving mutant
    assert mutant[0] in copy.read_text()
    copy.write_text(copy.read_text().replace(*mutant, 1))
    code_hash_mod.code_hash.cache_clear()
    assert key(target="sm_80", variant=sm80) != before
    monkeypatch.undo()
    code_hash_mod.code_hash.cache_clear()
    assert key(target="sm_80", variant=sm80) == before  # the code as it is: the key as it was


def test_the_hashed_sources_are_every_module_of_kernels_passes_dialects_policies_build_and_the_shaping_ones():
    names = {name for name, _ in code_hash_mod.kernel_sources()}
    for installed_as, folder in [("convbw_mlir.kernels", "convbw_mlir/kernels"), ("convbw_mlir.passes", "passes"),
                                 ("convbw_mlir.dialects", "dialects"), ("convbw_mlir.policies", "convbw_mlir/policies"),
                                 ("convbw_mlir.build", "convbw_mlir/build")]:  # fmt: skip
        on_disk = {f"{installed_as}/{p.relative_to(ROOT / folder).as_posix()}" for p in (ROOT / folder).rglob("*.py")}
        assert on_disk and on_disk <= names
    assert {"convbw_mlir.builders", "convbw_mlir.plan", "convbw_mlir.pipelines", "convbw_mlir.targets",
            "convbw_mlir.contraction", "convbw_mlir.loops", "convbw_mlir.plan_data"} <= names  # fmt: skip
    assert all(not name.startswith(("/", str(ROOT))) for name in names)  # path-free: a wheel hashes the same
