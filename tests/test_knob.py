"""Knob validation, parsing and restore: the part every platform shares."""

from __future__ import annotations

import pytest

from edgetune.power.base import (
    ApplyError,
    Device,
    Knob,
    KnobValueError,
    KnobWriteError,
    RealClock,
    format_value,
    is_out_of_memory,
)


def make_knob(values=(306_000_000, 408_000_000, 510_000_000, 624_750_000), start=624_750_000, **kw):
    state = {"value": start, "writes": []}

    def write(v):
        state["value"] = v
        state["writes"].append(v)

    knob = Knob("gpu_freq", "Hz", values, read=lambda: state["value"], write=write, **kw)
    return knob, state


def test_values_sorted_and_bounds():
    knob, _ = make_knob(values=(510_000_000, 306_000_000, 408_000_000))
    assert knob.values == (306_000_000, 408_000_000, 510_000_000)
    assert knob.min == 306_000_000 and knob.max == 510_000_000


def test_invalid_value_names_nearest_allowed():
    knob, _ = make_knob()
    with pytest.raises(KnobValueError, match="nearest allowed: 408 MHz or 510 MHz"):
        knob.set(500_000_000)
    with pytest.raises(KnobValueError, match="nearest allowed: 624.75 MHz"):
        knob.set(2_000_000_000)


@pytest.mark.parametrize(
    "text, value",
    [("max", 624_750_000), ("min", 306_000_000), ("408MHz", 408_000_000), ("0.51 GHz", 510_000_000),
     ("408000000", 408_000_000)],
)
def test_parse(text, value):
    knob, _ = make_knob()
    assert knob.parse(text) == value


def test_parse_garbage():
    knob, _ = make_knob()
    with pytest.raises(KnobValueError, match="cannot read 'fast'"):
        knob.parse("fast")


@pytest.mark.parametrize("text, unit", [("306W", "W"), ("306 mW", "mW"), ("0.3kw", "kw")])
def test_parse_refuses_a_unit_of_another_quantity(text, unit):
    knob, _ = make_knob()  # 306 W was read as 306 Hz and refused as a clock value, the W never named
    with pytest.raises(KnobValueError, match=rf"^gpu_freq = '{text}': gpu_freq is set in Hz, not {unit}; give a "
                                             r"number in Hz, a value with one of the units GHz, MHz, kHz, Hz"):
        knob.parse(text)


def test_restore_writes_original_once_and_calls_hook_first():
    seen = []
    knob, state = make_knob(on_first_change=lambda k, orig: seen.append((k.name, orig, list(state["writes"]))))
    knob.set(306_000_000)
    knob.set(408_000_000)
    assert seen == [("gpu_freq", 624_750_000, [])]  # hook ran before any write
    assert knob.original == 624_750_000
    assert knob.restore() is True
    assert state["value"] == 624_750_000
    assert knob.restore() is False


def test_read_only_knob_refuses_with_reason():
    knob, _ = make_knob(writable=False, why_read_only="needs root: run with sudo")
    with pytest.raises(KnobWriteError, match="needs root"):
        knob.set("max")


def test_named_modes():
    mode = {"v": "15W"}
    knob = Knob("power_mode", "", ["7W", "15W"], read=lambda: mode["v"], write=lambda v: mode.update(v=v))
    assert knob.values == ("7W", "15W")
    knob.set("7w")
    assert mode["v"] == "7W"
    with pytest.raises(KnobValueError, match="allowed: 7W, 15W"):
        knob.set("25W")


def test_a_value_the_platform_cannot_switch_to_now_is_refused_with_its_reason():
    mode = {"v": "15W"}
    knob = Knob("power_mode", "", ["15W"], read=lambda: mode["v"], write=lambda v: mode.update(v=v),
                unavailable={"7W": "needs a reboot: run `sudo nvpmodel -m 1`", "15W": "ignored: it is offered"})
    assert knob.values == ("15W",) and knob.unavailable == {"7W": "needs a reboot: run `sudo nvpmodel -m 1`"}
    with pytest.raises(KnobValueError, match=r"^power_mode: 7W needs a reboot: run `sudo nvpmodel -m 1`$"):
        knob.set("7w")
    assert mode["v"] == "15W"
    with pytest.raises(KnobValueError, match="allowed: 15W"):
        knob.set("25W")


def test_device_apply_order_and_restore_all_even_if_one_fails():
    order = []
    mode = {"v": "15W"}
    modes = Knob("power_mode", "", ["7W", "15W"], read=lambda: mode["v"],
                 write=lambda v: (order.append("power_mode"), mode.update(v=v)))
    gpu, gstate = make_knob()
    broken_state = {"v": 4}

    def broken_write(v):
        if v == 4:
            raise KnobWriteError("cpu_cores: kernel rejected the write")
        broken_state["v"] = v

    cores = Knob("cpu_cores", "cores", [1, 2, 3, 4], read=lambda: broken_state["v"], write=broken_write)
    dev = Device("test", "test device", True, {"gpu_freq": gpu, "power_mode": modes, "cpu_cores": cores},
                 sensor=None, clock=RealClock(), run_step=lambda fn, b, c: fn())
    dev.apply({"gpu_freq": 306_000_000, "power_mode": "7W", "cpu_cores": 2})
    assert order[0] == "power_mode"
    with pytest.raises(KnobWriteError):
        dev.restore()
    assert gstate["value"] == 624_750_000 and mode["v"] == "15W"
    with pytest.raises(KnobValueError, match="unknown knob 'foo'"):
        dev.apply({"foo": 1})


def test_a_write_that_fails_partway_says_which_knobs_were_written():
    """apply() writes in restore order (cpu_cores, emc_freq, gpu_freq here): a refused emc_freq leaves cpu_cores
    written and gpu_freq not, and its ApplyError says so; a value not allowed, anywhere in the setting, is refused
    before anything is written."""
    written = []

    def knob(name, values, refuse=None):
        def write(v):
            if v == refuse:
                raise KnobWriteError(f"{name}: the kernel rejected {v} (EBUSY)")
            written.append((name, v))

        return Knob(name, "", values, read=lambda: values[-1], write=write)

    dev = Device("test", "test device", True,
                 {"gpu_freq": knob("gpu_freq", [1, 2]), "emc_freq": knob("emc_freq", [1, 2], refuse=1),
                  "cpu_cores": knob("cpu_cores", [1, 2])},
                 sensor=None, clock=RealClock(), run_step=lambda fn, b, c: fn())
    with pytest.raises(ApplyError, match=r"^emc_freq: the kernel rejected 1 \(EBUSY\)$") as err:
        dev.apply({"gpu_freq": 1, "emc_freq": 1, "cpu_cores": 1})
    assert (err.value.knob, err.value.value, err.value.applied) == ("emc_freq", 1, {"cpu_cores": 1})
    assert isinstance(err.value, KnobWriteError) and isinstance(err.value.error, KnobWriteError)
    assert written == [("cpu_cores", 1)]
    with pytest.raises(KnobValueError, match="gpu_freq"):
        dev.apply({"cpu_cores": 2, "gpu_freq": 3})
    assert written == [("cpu_cores", 1)]


def test_restore_puts_the_power_mode_back_before_the_clocks_it_resets():
    """nvpmodel resets the clocks under a mode it switches to: restored first, the mode leaves the clocks'
    originals (here a GPU lock the user had set, 408 MHz, not the mode's full range) in place."""
    gpu, gstate = make_knob(start=408_000_000)
    mode = {"v": "15W"}

    def switch(v):  # as nvpmodel does: the mode's caps, the GPU at its top clock under them
        mode["v"] = v
        gstate["value"] = 306_000_000 if v == "7W" else 624_750_000

    modes = Knob("power_mode", "", ["7W", "15W"], read=lambda: mode["v"], write=switch)
    dev = Device("test", "test device", True, {"gpu_freq": gpu, "power_mode": modes},
                 sensor=None, clock=RealClock(), run_step=lambda fn, b, c: fn())
    dev.apply({"power_mode": "7W", "gpu_freq": 306_000_000})
    assert dev.restore() == ["power_mode", "gpu_freq"]
    assert mode["v"] == "15W" and gstate["value"] == 408_000_000


def test_a_knob_that_cannot_be_read_does_not_stop_a_mode_change_that_leaves_it_alone(caplog):
    mode = {"v": "15W"}
    modes = Knob("power_mode", "", ["7W", "15W"], read=lambda: mode["v"], write=lambda v: mode.update(v=v))

    def unreadable():
        raise OSError(16, "Device or resource busy")

    emc = Knob("emc_freq", "Hz", [204_000_000, 2_133_000_000], read=unreadable, write=lambda v: None)
    dev = Device("test", "test device", True, {"power_mode": modes, "emc_freq": emc},
                 sensor=None, clock=RealClock(), run_step=lambda fn, b, c: fn())
    dev.apply({"power_mode": "7W"})
    assert mode["v"] == "7W" and "emc_freq: its value before the power mode change could not be recorded" in caplog.text
    with pytest.raises(OSError):  # in the setting: its own write needs the original first
        dev.apply({"power_mode": "15W", "emc_freq": 204_000_000})
    assert dev.restore() == ["power_mode"] and mode["v"] == "15W"


def test_format_and_oom_detection():
    assert format_value(918_000_000, "Hz") == "918 MHz"
    assert format_value(1_497_600, "kHz") == "1.4976 GHz"
    assert format_value(4, "cores") == "4 cores"
    assert format_value(1, "cores") == "1 core"
    assert is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
