"""The jtop backend against a fake jtop client that follows jetson-stats' API, and ``--device auto``'s choice."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fakes.jetson_tree import build_jetson
from fakes.jtop_service import FAKE_JTOP_DIR, orin_nano, read_state, update_state, write_state

from edgetune.cli import main
from edgetune.power import DeviceError, KnobWriteError, PowerMonitor, open_device, registry
from edgetune.power.knobs import KNOBS, KnobRole
from edgetune.power.monitor import MIN_UPDATES_PER_WINDOW
from edgetune.search.trial import MeasurementProtocol, measure_setting
from edgetune.workloads import Workload

REPO = Path(__file__).resolve().parents[1]
ORIN_NANO_W = {"VDD_IN": 4.754, "VDD_CPU_GPU_CV": 0.772, "VDD_SOC": 1.300}  # int(mV * mA / 1000) mW, in W


class Service:
    """A fake jtop service under a root: its socket file and the state the fake client reads."""

    def __init__(self, root: Path, state_file: Path) -> None:
        self.root = root
        self.socket = root / "run/jtop.sock"
        self.path = state_file

    def start(self) -> Service:
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.socket.touch()
        return self

    def update(self, **changes):
        return update_state(self.path, **changes)

    @property
    def state(self) -> dict:
        return read_state(self.path)

    def env(self, tmp_path: Path) -> dict[str, str]:
        env = dict(os.environ, EDGETUNE_SYSFS_ROOT=str(self.root), EDGETUNE_STATE_DIR=str(tmp_path / "state"),
                   FAKE_JTOP_STATE=str(self.path))
        env["PYTHONPATH"] = os.pathsep.join([str(FAKE_JTOP_DIR), str(REPO)])
        return env


@pytest.fixture
def fake_jtop(tmp_path, monkeypatch):
    """``make(root=None, **state changes)``: a fake service (stopped until ``.start()``) under ``root``."""
    monkeypatch.syspath_prepend(str(FAKE_JTOP_DIR))
    monkeypatch.delitem(sys.modules, "jtop", raising=False)
    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("FAKE_NVML_STATE", raising=False)

    def make(root: Path | None = None, **changes) -> Service:
        root = Path(root or tmp_path / "root")
        root.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv("EDGETUNE_SYSFS_ROOT", str(root))
        service = Service(root, tmp_path / "jtop.json")
        state = orin_nano(service.socket)
        state.update(changes)
        monkeypatch.setenv("FAKE_JTOP_STATE", write_state(service.path, state)["FAKE_JTOP_STATE"])
        return service

    yield make
    sys.modules.pop("jtop", None)  # never leak the fake to other tests


# ------------------------------------------------------------------------------------------ power


def test_rails_and_total_in_watts(fake_jtop):
    service = fake_jtop().start()
    device = open_device("jtop")
    try:
        assert device.name == "jtop" and not device.simulated
        assert device.compute.torch_device == "cuda:0"  # the module's GPU: training runs there
        assert device.description == ("NVIDIA Jetson Orin Nano Developer Kit (NVIDIA Jetson Orin Nano (Developer "
                                      "kit), L4T 36.3.0, JetPack 6.0)")
        sensor = device.sensor
        assert sensor.rails == ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC") and sensor.total_label == "VDD_IN"
        assert sensor.update_period_s == 1.0 and sensor.energy_j() is None
        reading = sensor.read()
        assert reading.total_w == pytest.approx(ORIN_NANO_W["VDD_IN"])
        assert reading.rails == pytest.approx(ORIN_NANO_W)
        service.update(rails={"VDD_IN": [5040, 2480], "VDD_CPU_GPU_CV": [5040, 1300], "VDD_SOC": [5040, 420]})
        assert sensor.read().total_w == pytest.approx(12.499)  # int(5040 * 2.48) mW
        assert sensor.read().rails["VDD_CPU_GPU_CV"] == pytest.approx(6.552)
        notes = " | ".join(device.notes)
        assert "every 1 s" in notes and "at least 4 s" in notes and "VDD_CPU_GPU_CV is one rail" in notes
    finally:
        device.close()


def test_derived_total_without_an_input_rail(fake_jtop):
    # an AGX Orin module: no board input rail; jtop's total is the sum of the rails
    fake_jtop(rails={"VDD_GPU_SOC": [5008, 1184], "VDD_CPU_CV": [5008, 392], "VIN_SYS_5V0": [4992, 968]}).start()
    device = open_device("jtop")
    try:
        assert device.sensor.total_label == "derived: VDD_CPU_CV + VDD_GPU_SOC + VIN_SYS_5V0"
        reading = device.sensor.read()
        assert reading.total_w == pytest.approx(sum(reading.rails.values()))
        assert reading.total_w == pytest.approx((1963 + 5929 + 4832) / 1e3)
    finally:
        device.close()


def test_service_interval_set_by_an_earlier_client_is_the_update_period(fake_jtop):
    fake_jtop(interval_s=0.5).start()
    device = open_device("jtop", interval_s=2.0)
    try:
        assert device.sensor.update_period_s == 0.5
        assert PowerMonitor(device.sensor, device.clock).avg_window_s == 0.5 * MIN_UPDATES_PER_WINDOW
    finally:
        device.close()


def test_budget_window_spans_several_jtop_updates(fake_jtop):
    fake_jtop().start()
    device = open_device("jtop")
    try:
        monitor = PowerMonitor(device.sensor, device.clock)
        assert monitor.avg_window_s == monitor.min_measure_s == 4.0 == MIN_UPDATES_PER_WINDOW * 1.0
        assert monitor.rate_hz == 50.0
    finally:
        device.close()
    twin = open_device("sim:orin-nano", compute=False)  # sysfs-speed sensors keep the window asked for
    monitor = PowerMonitor(twin.sensor, twin.clock)
    assert monitor.avg_window_s == 1.0 and monitor.min_measure_s == 0.0


def _tiny_workload() -> Workload:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))

    def make_batch(batch_size, generator):
        return (torch.randn(batch_size, 3, 32, 32, generator=generator),
                torch.randint(0, 10, (batch_size,), generator=generator))

    return Workload.from_model("tiny", model, make_batch, default_batch_size=32, seed=0)


def test_a_slow_sensor_makes_each_measurement_span_the_widened_window():
    # the twin's INA3221 slowed to jtop's 1-s updates, on its virtual clock: a 2-s protocol measures 4 s
    device = open_device("sim:orin-nano", compute=False)
    device.sensor.update_period_s = 1.0
    protocol = MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=2.0)
    with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:
        m = measure_setting(device, _tiny_workload(), 64, {}, protocol, monitor)
    assert m.ok and m.avg_window_s == 4.0 and m.duration_s >= 4.0


# ------------------------------------------------------------------------------------------ knobs


def test_power_mode_set_and_restored_through_the_service(fake_jtop, tmp_path):
    service = fake_jtop().start()
    device = open_device("jtop")
    try:
        mode = device.knobs["power_mode"]
        assert mode.values == ("15W", "7W") and mode.read() == "15W" and mode.writable
        with device.restoring():
            device.apply({"power_mode": "7W"})
            assert service.state["nvpmodel"]["id"] == 1 and mode.read() == "7W"
            assert len(list((tmp_path / "state").glob("jtop-*.json"))) == 1  # recorded before the switch
        assert service.state["nvpmodel"]["id"] == 0 and service.state["nvpmodel"]["switches"] == [1, 0]
        assert not list((tmp_path / "state").glob("*.json"))
    finally:
        device.close()


def test_a_board_without_nvpmodel_leaves_power_mode_out_with_its_note(fake_jtop):
    """The service reports no nvpmodel: no power_mode knob, and the note that says so is the one `edgetune
    restore` gives for a state file's power mode (``Device.missing_knobs``)."""
    fake_jtop(nvpmodel=None).start()
    device = open_device("jtop")
    try:
        assert "power_mode" not in device.knobs
        assert device.missing_knobs == {"power_mode": "no nvpmodel on this board: power_mode cannot be tuned"}
        assert device.missing_knobs["power_mode"] in device.notes
    finally:
        device.close()


def test_jetson_clocks_set_and_restored(fake_jtop):
    service = fake_jtop().start()
    device = open_device("jtop")
    clocks = device.knobs["jetson_clocks"]
    assert clocks.values == ("off", "on") and clocks.read() == "off"
    assert KNOBS["jetson_clocks"].role is KnobRole.CLOCK_LOCK and not KnobRole.CLOCK_LOCK.is_clock
    device.apply({"jetson_clocks": "off"})  # already off: jetson-stats would refuse "off" without stored clocks
    assert "switches" not in service.state["jetson_clocks"]
    device.apply({"jetson_clocks": "on", "power_mode": "7W"})
    assert service.state["jetson_clocks"]["enable"] is True and clocks.read() == "on"
    device.close()  # closing restores whatever is still changed
    state = service.state
    assert state["jetson_clocks"]["enable"] is False and state["nvpmodel"]["id"] == 0
    assert state["jetson_clocks"]["switches"] == [True, False] and state["clients"] == 0


def test_mode_needing_a_reboot_is_not_offered(fake_jtop):
    fake_jtop(nvpmodel={"models": ["MAXN", "15W", "7W"], "masks": ["0x3", "0x1", "0x1"],
                        "status": [False, True, True], "default": 1, "id": 1, "fail": []}).start()
    device = open_device("jtop")
    try:
        assert device.knobs["power_mode"].values == ("15W", "7W")
        assert any("MAXN not offered" in n and "reboot" in n for n in device.notes)
        with pytest.raises(DeviceError, match=r"power_mode: MAXN needs a reboot: .*`sudo nvpmodel -m 0` on the host"):
            device.knobs["power_mode"].set("MAXN")
    finally:
        device.close()


def test_refused_switch_is_one_line_and_the_original_is_kept(fake_jtop, tmp_path):
    nvp = orin_nano("x")["nvpmodel"] | {"fail": [1]}
    service = fake_jtop(nvpmodel=nvp).start()
    device = open_device("jtop", switch_timeout_s=0.3)
    try:
        with pytest.raises(KnobWriteError) as err:
            device.knobs["power_mode"].set("7W")
        message = str(err.value)
        assert "\n" not in message
        assert message.startswith("power_mode 7W: the jtop service did not make the change within 0.3 s")
        assert "nvpmodel reported an error" in message and "power_mode is back at its original value" in message
        assert service.state["nvpmodel"]["id"] == 0 and not list((tmp_path / "state").glob("*.json"))
    finally:
        device.close()


def test_jetson_clocks_started_outside_jtop_is_read_only(fake_jtop):
    fake_jtop(jetson_clocks={"enable": True, "config": False, "thread": "uncontrolled", "boot": False}).start()
    device = open_device("jtop")
    try:
        clocks = device.knobs["jetson_clocks"]
        assert clocks.read() == "on" and not clocks.writable and "outside jtop" in clocks.why_read_only
        with pytest.raises(KnobWriteError, match="jetson_clocks is read-only here"):
            clocks.set("off")
    finally:
        device.close()


def test_kill_9_then_restore_through_the_service(fake_jtop, tmp_path):
    service = fake_jtop().start()
    code = ("import time; from edgetune.power import open_device; d = open_device('jtop'); "
            "d.apply({'power_mode': '7W', 'jetson_clocks': 'on'}); print('changed', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], env=service.env(tmp_path), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "changed", proc.stderr.read()
    proc.kill()
    proc.wait(timeout=10)
    assert service.state["nvpmodel"]["id"] == 1 and service.state["jetson_clocks"]["enable"] is True
    done = subprocess.run([sys.executable, "-m", "edgetune", "restore"], env=service.env(tmp_path), cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "restored" in done.stdout and "power_mode=15W" in done.stdout and "jetson_clocks=off" in done.stdout
    assert "on jtop" in done.stdout and "interrupted edgetune run" in done.stdout
    state = service.state
    assert state["nvpmodel"]["id"] == 0 and state["jetson_clocks"]["enable"] is False
    assert not list((tmp_path / "state").glob("*.json"))


# ------------------------------------------------------------------------------------------ the service


@pytest.mark.parametrize(("changes", "started", "expected"), [
    ({}, False, ["does not exist", "`sudo systemctl start jtop`", "-v /run/jtop.sock:/run/jtop.sock"]),
    ({"service": "stopped"}, True, ["does not answer", "`sudo systemctl start jtop`", "/run/jtop.sock"]),
    ({"access": "denied"}, True, ["no permission", "`jtop` group", "sudo usermod -aG jtop $USER"]),
    ({"version": "4.3.1"}, True, ["does not match the jtop service", "Mismatch version", "host's jetson-stats"]),
])
def test_service_unreachable_is_one_line_naming_the_fix(fake_jtop, changes, started, expected):
    service = fake_jtop(**changes)
    if started:
        service.start()
    with pytest.raises(DeviceError) as err:
        open_device("jtop")
    message = str(err.value)
    assert "\n" not in message
    for part in expected:
        assert part in message
    (found,) = registry._module("jtop").probe()
    assert not found.found and found.summary == message


def test_cli_says_the_service_is_unreachable_in_one_line(fake_jtop, capsys):
    fake_jtop(access="denied").start()
    assert main(["monitor", "--device", "jtop", "--duration", "0.1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("edgetune: error: no permission to use the jtop service")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # jetson-stats' own use of distro
def test_real_jetson_stats_without_a_service_gets_the_same_line(monkeypatch, tmp_path):
    # the installed jetson-stats client itself, against this machine's (absent) /run/jtop.sock
    if importlib.util.find_spec("jtop") is None or os.path.exists("/run/jtop.sock"):
        pytest.skip("needs jetson-stats installed and no jtop service on this machine")
    monkeypatch.delitem(sys.modules, "jtop", raising=False)
    (tmp_path / "run").mkdir()
    (tmp_path / "run/jtop.sock").touch()  # the pre-check passes; the library finds no service at /run/jtop.sock
    with pytest.raises(DeviceError) as err:
        open_device("jtop", root=tmp_path)
    message = str(err.value)
    assert "\n" not in message and "The jtop.service is not active" in message
    assert "`sudo systemctl start jtop`" in message and "-v /run/jtop.sock:/run/jtop.sock" in message


def test_lost_service_is_counted_by_the_monitor(fake_jtop):
    service = fake_jtop().start()
    device = open_device("jtop")
    try:
        monitor = PowerMonitor(device.sensor, device.clock)
        assert monitor.sample() is not None
        service.update(service="stopped")
        assert monitor.sample() is None and monitor.dropped == 1
        assert monitor.last_error.startswith("lost the jtop service: Lost connection with jtop server")
    finally:
        device.close()


# ------------------------------------------------------------------------------------------ auto


def test_the_board_temperature_through_jtop_is_the_sysfs_zones_with_a_note_where_one_cannot_be_read(
        fake_jtop, tmp_path):
    """The thermal zones are world-readable, so the jtop device reads them itself; a junction zone that cannot
    be read is passed over for the GPU's and said in the notes, as on the sysfs device."""
    from fakes.jetson_tree import break_file

    board = build_jetson(tmp_path / "root", "orin-nano")
    fake_jtop(board.root).start()
    device = open_device("jtop")
    try:
        assert device.temperature_c is not None and not [n for n in device.notes if "thermal" in n]
    finally:
        device.close()
    tj = board.thermal["tj-thermal"]
    break_file(tj, "N/A")
    device = open_device("jtop")
    try:
        assert device.temperature_c == pytest.approx(42.937)  # gpu-thermal's
        assert [n for n in device.notes if "thermal" in n] == [
            f"thermal zone tj-thermal: {tj}: expected a number, read 'N/A'; the board temperature is gpu-thermal's"]
    finally:
        device.close()


def test_auto_picks_sysfs_where_it_can_write(fake_jtop, tmp_path):
    board = build_jetson(tmp_path / "root", "orin-nano")
    fake_jtop(board.root).start()
    choice = registry.choose_auto()
    assert choice.spec == "jetson" and not choice.measure_only
    assert choice.reason == "this process can write the Jetson's sysfs knobs"
    device = open_device("auto", detect_period_s=0)
    try:
        assert device.name == "jetson"
    finally:
        device.close()


def test_auto_picks_jtop_where_sysfs_is_read_only(fake_jtop, tmp_path):
    board = build_jetson(tmp_path / "root", "orin-nano", nvpmodel=False)
    board.make_read_only()  # a container's read-only /sys, or a user without root
    fake_jtop(board.root).start()
    choice = registry.choose_auto()
    assert choice.spec == "jtop" and not choice.measure_only
    assert "sysfs knobs are read-only here" in choice.reason and "jtop service answers" in choice.reason
    device = open_device("auto")
    try:
        assert device.name == "jtop" and set(device.knobs) == {"power_mode", "jetson_clocks"}
    finally:
        device.close()


def test_auto_is_measure_only_without_write_access_or_service(fake_jtop, tmp_path):
    board = build_jetson(tmp_path / "root", "orin-nano", nvpmodel=False)
    board.make_read_only()
    fake_jtop(board.root)  # installed, not running: no socket
    choice = registry.choose_auto()
    assert choice.spec == "jetson" and choice.measure_only
    assert choice.reason.startswith("measure-only: the Jetson's sysfs knobs are read-only here")
    assert "jtop service does not answer (no jtop service" in choice.reason
    device = open_device("auto", detect_period_s=0)
    try:
        assert device.name == "jetson" and device.measure_only
    finally:
        device.close()


def test_auto_picks_jtop_where_no_sysfs_tree_is_visible(fake_jtop):
    fake_jtop().start()  # an empty root with the socket: a container that mounts only /run/jtop.sock
    choice = registry.choose_auto()
    assert choice.spec == "jtop" and "no Jetson sysfs tree here" in choice.reason


def test_devices_says_which_backend_auto_picks_and_why(fake_jtop, tmp_path, capsys):
    board = build_jetson(tmp_path / "root", "orin-nano", nvpmodel=False)
    board.make_read_only()
    fake_jtop(board.root).start()
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "jetson: found (jetson)" in out and "jtop: found (jtop)" in out
    assert "power_mode  15W, 7W; now 15W; writable" in out
    assert "jetson_clocks off, on; now off; writable" in out
    assert "updates every 1 s, jtop service interval" in out
    assert "budgets are judged on a moving average of at least 4 s" in out
    auto = next(line for line in out.splitlines() if line.startswith("--device auto"))
    assert auto.startswith("--device auto opens jtop: the Jetson's sysfs knobs are read-only here")


def test_devices_json_has_the_auto_choice(fake_jtop, tmp_path, capsys):
    import json

    board = build_jetson(tmp_path / "root", "orin-nano", nvpmodel=False)
    board.make_read_only()
    fake_jtop(board.root)
    assert main(["devices", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["auto"]["spec"] == "jetson" and report["auto"]["measure_only"] is True
    jtop = next(p for p in report["platforms"] if p["platform"] == "jtop")
    assert not jtop["found"] and "sudo systemctl start jtop" in jtop["summary"]


def test_monitor_command_reports_the_widened_window(fake_jtop, capsys):
    fake_jtop().start()
    assert main(["monitor", "--device", "jtop", "--duration", "0.6"]) == 0
    out = capsys.readouterr().out
    assert "total = VDD_IN, 50 Hz (sensor updates every 1 s)" in out
    assert "4-s avg 4.75 W" in out and "max 4-s avg 4.75 W" in out
