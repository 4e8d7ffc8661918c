"""The knob registry, the batch-size check and Candidate (edgetune.power.knobs)."""

import pytest

from edgetune.power.knobs import (
    KNOBS,
    BatchSizeError,
    Candidate,
    KnobRole,
    check_batch_size,
    knob_of_role,
    knob_unit,
)


def test_every_knob_has_unit_and_role():
    assert knob_unit("gpu_freq") == "Hz"
    assert knob_unit("cpu_freq") == "kHz"
    assert knob_unit("power_limit") == "W"
    assert knob_unit("unknown", "x") == "x"
    assert {s.role for s in KNOBS.values()} == set(KnobRole)
    assert KNOBS["power_mode"].role.caps_others
    assert KNOBS["emc_freq"].role.is_clock and not KNOBS["cpu_cores"].role.is_clock


def test_knob_of_role_uses_registry_then_given_roles():
    assert knob_of_role(["cpu_cores", "gpu_freq"], KnobRole.GPU_CLOCK) == "gpu_freq"
    assert knob_of_role(["cpu_cores"], KnobRole.GPU_CLOCK) is None
    assert knob_of_role(["gpu_freq_hz"], KnobRole.GPU_CLOCK, {"gpu_freq_hz": KnobRole.GPU_CLOCK}) == "gpu_freq_hz"


@pytest.mark.parametrize("bad", [0, -3, 2.5, "8", None, True])
def test_check_batch_size_refuses_with_one_line(bad):
    with pytest.raises(BatchSizeError, match="positive whole number") as info:
        check_batch_size(bad)
    assert "\n" not in str(info.value)


def test_check_batch_size_accepts_whole_floats():
    assert check_batch_size(32.0) == 32 and isinstance(check_batch_size(32.0), int)


def test_candidate_describe_uses_registry_units():
    c = Candidate.of(32, {"gpu_freq": 510_000_000, "cpu_freq": 806_400})
    assert c.knobs == {"gpu_freq": 510_000_000, "cpu_freq": 806_400}
    assert c.describe() == "batch 32, gpu_freq 510 MHz, cpu_freq 806.4 MHz"
