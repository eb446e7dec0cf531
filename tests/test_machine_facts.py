"""Machine facts live in the target table only (issue 38 item 4): the policies read the SM count, shared memory and
register file from convbw_mlir/targets.py, and each family's fitted cost coefficients are one frozen record that
names the results it was fitted on."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from convbw_mlir.policies import sm80, sm90, sm90_fp8
from convbw_mlir.targets import TARGETS

ROOT = Path(__file__).resolve().parents[1]


def test_the_policies_take_their_machine_facts_from_the_target_table():
    assert sm80.SHARED_MEMORY_CAP == TARGETS["sm_80"].lds_bytes
    assert sm80.SM_REGISTERS == TARGETS["sm_80"].registers_per_cu == 65_536  # CUDA guide: 64 K registers an SM
    assert sm90.SMS == sm90_fp8.SMS == TARGETS["sm_90a"].compute_units


@pytest.mark.parametrize("module", ["sm80", "sm90", "sm90_fp8"])
def test_no_policy_spells_a_machine_fact_itself(module):
    source = (ROOT / "convbw_mlir" / "policies" / f"{module}.py").read_text()
    # the facts the review found beside the table: H100's SM count, an SM's register file, sm_80's shared memory
    assert not re.search(r"=\s*(132|65_?536|166_?912)\b", source)


@pytest.mark.parametrize("model", [sm80.COST, sm90.COST], ids=["sm80", "sm90"])
def test_each_cost_model_is_one_frozen_record_naming_its_results(model):
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.fitted_on = "elsewhere"  # type: ignore[misc]
    files = [model.fitted_on] if isinstance(model.fitted_on, str) else list(model.fitted_on)
    assert files and all(f.startswith("bench/results/") and (ROOT / f).exists() for f in files)
