"""Fake Jetson sysfs trees: the real layouts, units and values, written under a temporary root.

Each builder lays out what a board shows under ``/``: the device-tree model and compatible strings,
``/etc/nv_tegra_release``, the INA3221 power monitor (hwmon layout for JetPack 5+, iio for JetPack 4),
the GPU devfreq node (found by its ``of_node`` name, with the ``/sys/class/devfreq`` symlink), cpufreq
policies and CPU ``online`` files, the BPMP debugfs EMC clock, ``/etc/nvpmodel.conf`` and a stand-in for
the ``nvpmodel`` command. Values come from the project's Jetson facts (frequency tables, power modes) and
typical idle readings; the Orin Nano GPU table is the JetPack 6 one (306-624.75 MHz).

The tree is only files: nothing moves by itself. ``FakeJetson.settle()`` plays the governor (``cur_freq``
follows the limits) and ``set_rail()`` plays the power monitor; :mod:`fakes.board` drives both from the
simulated twin.
"""

from __future__ import annotations

import csv
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

# ------------------------------------------------------------------------------------------ board data

GPU_HZ = {
    "agx-orin-jp5": [114750000, 216750000, 318750000, 420750000, 522750000, 624750000, 726750000, 828750000,
                     930750000, 1032750000, 1134750000, 1236750000, 1300500000],
    "agx-orin-jp6": [306000000, 408000000, 510000000, 612000000, 714000000, 816000000, 918000000, 1020000000,
                     1122000000, 1224000000, 1300500000],
    "orin-nano": [306000000, 408000000, 510000000, 612000000, 624750000],
    "xavier-nx": [114750000, 204000000, 306000000, 408000000, 510000000, 599250000, 701250000, 752250000,
                  803250000, 854250000, 905250000, 956250000, 1007250000, 1058250000, 1109250000],
    "nano": [76800000, 153600000, 230400000, 307200000, 384000000, 460800000, 537600000, 614400000,
             691200000, 768000000, 844800000, 921600000],
}
ORIN_CPU_KHZ = [115200, 192000, 268800, 345600, 422400, 499200, 576000, 652800, 729600, 806400, 883200,
                960000, 1036800, 1113600, 1190400, 1267200, 1344000, 1420800, 1497600, 1574400, 1651200,
                1728000, 1804800, 1881600, 1958400, 2035200, 2112000, 2188800, 2201600]
CPU_KHZ = {
    "agx-orin-jp5": ORIN_CPU_KHZ,
    "agx-orin-jp6": ORIN_CPU_KHZ,
    "orin-nano": [f for f in ORIN_CPU_KHZ if f <= 1510400] + [1510400],
    "xavier-nx": [115200, 192000, 268800, 345600, 422400, 499200, 576000, 652800, 729600, 806400, 883200,
                  960000, 1036800, 1113600, 1190400, 1267200, 1344000, 1420800, 1497600, 1574400, 1651200,
                  1728000, 1804800, 1881600, 1907200],
    "nano": [102000, 204000, 307200, 403200, 518400, 614400, 710400, 825600, 921600, 1036800, 1132800,
             1224000, 1326000, 1428000, 1479000],
}
EMC = {  # (min_rate, max_rate, rate) Hz
    "agx-orin-jp5": (204000000, 3199000000, 3199000000),
    "agx-orin-jp6": (204000000, 3199000000, 3199000000),
    "orin-nano": (204000000, 2133000000, 2133000000),
    "xavier-nx": (204000000, 1866000000, 1600000000),
}
MODES = {
    "agx-orin-jp5": ([(0, "MAXN"), (1, "MODE_15W"), (2, "MODE_30W"), (3, "MODE_50W")], 2),
    "agx-orin-jp6": ([(0, "MAXN"), (1, "MODE_15W"), (2, "MODE_30W"), (3, "MODE_50W")], 2),
    "orin-nano": ([(0, "15W"), (1, "7W")], 0),
    "xavier-nx": ([(0, "MODE_15W_2CORE"), (1, "MODE_15W_4CORE"), (2, "MODE_15W_6CORE"), (3, "MODE_10W_2CORE"),
                   (4, "MODE_10W_4CORE"), (5, "MODE_10W_DESKTOP"), (6, "MODE_20W_2CORE"),
                   (7, "MODE_20W_4CORE"), (8, "MODE_20W_6CORE")], 5),
    "nano": ([(0, "MAXN"), (1, "5W")], 0),
}


@dataclass(frozen=True)
class BoardSpec:
    model: str
    compatible: tuple[str, ...]
    release: str
    gpu_dev: str  # the GPU device dir (holds of_node and devfreq/<node>)
    gpu_node: str  # the devfreq node name
    gpu_of_name: str
    cpus: int
    clusters: tuple[int, ...]  # first CPU of each cpufreq policy
    monitors: tuple[tuple[str, str, tuple[tuple[str, int, int], ...]], ...]  # (layout, bus-addr, rails)
    update_interval_ms: int | None


_R35 = "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, DATE: Tue Aug  1 19:57:35 UTC 2023"
_R36 = "# R36 (release), REVISION: 3.0, GCID: 36923193, BOARD: generic, EABI: aarch64, DATE: Fri Jul 19 23:24:25 UTC 2024"
_R32 = "# R32 (release), REVISION: 7.4, GCID: 33514132, BOARD: t210ref, EABI: aarch64, DATE: Fri Jun  9 04:25:08 UTC 2023"

# rails: (label, mV, mA) at idle
BOARDS: dict[str, BoardSpec] = {
    "agx-orin-jp5": BoardSpec(
        "NVIDIA Jetson AGX Orin Developer Kit", ("nvidia,p3737-0000+p3701-0005", "nvidia,p3701-0005",
                                                 "nvidia,tegra234"), _R35,
        "sys/devices/17000000.ga10b", "17000000.ga10b", "ga10b", 12, (0, 4, 8),
        (("hwmon", "1-0040", (("VDD_GPU_SOC", 5008, 1184), ("VDD_CPU_CV", 5008, 392), ("VIN_SYS_5V0", 4992, 968),
                              ("sum of shunt voltages", 0, 0))),
         ("hwmon", "1-0041", (("NC", 0, 0), ("VDDQ_VDD2_1V8AO", 4992, 232), ("NC", 0, 0)))),
        8),
    "agx-orin-jp6": BoardSpec(
        "NVIDIA Jetson AGX Orin Developer Kit", ("nvidia,p3737-0000+p3701-0005", "nvidia,p3701-0005",
                                                 "nvidia,tegra234"), _R36,
        "sys/devices/platform/bus@0/17000000.gpu", "17000000.gpu", "gpu", 12, (0, 4, 8),
        (("hwmon", "1-0040", (("VDD_GPU_SOC", 5008, 1184), ("VDD_CPU_CV", 5008, 392), ("VIN_SYS_5V0", 4992, 968),
                              ("sum of shunt voltages", 0, 0))),
         ("hwmon", "1-0041", (("NC", 0, 0), ("VDDQ_VDD2_1V8AO", 4992, 232), ("NC", 0, 0)))),
        8),
    "orin-nano": BoardSpec(
        "NVIDIA Jetson Orin Nano Developer Kit", ("nvidia,p3768-0000+p3767-0005", "nvidia,p3767-0005",
                                                  "nvidia,tegra234"), _R36,
        "sys/devices/platform/bus@0/17000000.gpu", "17000000.gpu", "gpu", 6, (0, 4),
        (("hwmon", "1-0040", (("VDD_IN", 5080, 936), ("VDD_CPU_GPU_CV", 5080, 152), ("VDD_SOC", 5080, 256),
                              ("sum of shunt voltages", 0, 0))),),
        8),
    "xavier-nx": BoardSpec(
        "NVIDIA Jetson Xavier NX Developer Kit", ("nvidia,p3509-0000+p3668-0001", "nvidia,p3668-0001",
                                                  "nvidia,tegra194"), _R35,
        "sys/devices/17000000.gv11b", "17000000.gv11b", "gv11b", 6, (0, 2, 4),
        (("hwmon", "7-0040", (("VDD_IN", 5032, 808), ("VDD_CPU_GPU_CV", 5032, 184), ("VDD_SOC", 5032, 320),
                              ("sum of shunt voltages", 0, 0))),),
        None),
    "nano": BoardSpec(
        "NVIDIA Jetson Nano Developer Kit", ("nvidia,p3449-0000-b00+p3448-0000", "nvidia,jetson-nano",
                                             "nvidia,tegra210"), _R32,
        "sys/devices/gpu.0", "57000000.gpu", "gpu", 4, (0,),
        (("iio", "6-0040", (("POM_5V_IN", 5072, 424), ("POM_5V_GPU", 5064, 40), ("POM_5V_CPU", 5064, 120))),),
        None),
}


# ------------------------------------------------------------------------------------------ the tree


def _w(path: Path, text: str | bytes, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, str):
        text = text.encode()
    path.write_bytes(text)
    path.chmod(mode)
    return path


@dataclass
class FakeJetson:
    """A fake board tree and the handles a test needs to play the hardware."""

    root: Path
    board: str
    spec: BoardSpec
    gpu: Path  # devfreq dir
    rail_files: dict[str, tuple[Path, ...]] = field(default_factory=dict)  # name -> (mV, mA) or (mW,)
    policies: list[Path] = field(default_factory=list)
    emc: Path | None = None
    thermal: dict[str, Path] = field(default_factory=dict)  # zone type -> its temp file

    @property
    def input_rail(self) -> str | None:
        return next((r for r in ("VDD_IN", "POM_5V_IN") if r in self.rail_files), None)

    def set_rail(self, name: str, mv: float, ma: float) -> None:
        """Publish a new reading, atomically (write then rename), as the monitor's next conversion."""
        files = self.rail_files[name]
        values = (round(mv * ma / 1e3),) if len(files) == 1 else (round(mv), round(ma))
        for path, value in zip(files, values):
            tmp = path.with_name(f".{path.name}.new")
            tmp.write_text(f"{value}\n")
            os.replace(tmp, path)

    def set_rail_text(self, name: str, text: str) -> None:
        """Garbage in a rail file (empty, negative, non-numeric), as a failing driver would show."""
        for path in self.rail_files[name]:
            tmp = path.with_name(f".{path.name}.new")
            tmp.write_text(text)
            os.replace(tmp, path)

    def set_temperature(self, zone: str, text: str) -> None:
        """A new ``temp`` reading of thermal zone ``zone`` (millidegrees, or garbage), atomically."""
        path = self.thermal[zone]
        tmp = path.with_name(f".{path.name}.new")
        tmp.write_text(text)
        os.replace(tmp, path)

    def remove_rail(self, name: str) -> None:
        for path in self.rail_files[name]:
            path.unlink()

    def settle(self) -> None:
        """Play the governors: each current frequency moves inside its (min, max) limits."""
        pairs = [(self.gpu / "cur_freq", self.gpu / "min_freq", self.gpu / "max_freq")]
        pairs += [(p / "scaling_cur_freq", p / "scaling_min_freq", p / "scaling_max_freq") for p in self.policies]
        for cur, lo, hi in pairs:
            c, a, b = (int(x.read_text()) for x in (cur, lo, hi))
            clamped = min(max(c, a), b)
            if clamped != c:
                cur.write_text(f"{clamped}\n")

    def knob_state(self) -> dict[str, str]:
        """Every knob-related file's content, for before/after comparisons."""
        files = [self.gpu / "min_freq", self.gpu / "max_freq"]
        for p in self.policies:
            files += [p / "scaling_min_freq", p / "scaling_max_freq"]
        files += sorted((self.root / "sys/devices/system/cpu").glob("cpu[0-9]*/online"))
        if self.emc is not None:
            files += [self.emc / "rate", self.emc / "mrq_rate_locked"]
        status = self.root / "var/lib/nvpmodel/status"
        if status.exists():
            files.append(status)
        return {str(f.relative_to(self.root)): f.read_text() for f in files}

    def make_read_only(self) -> None:
        """Knob files as the kernel shows attributes it will not store (mode 0444)."""
        for rel in self.knob_state():
            (self.root / rel).chmod(0o444)


def build_jetson(root: Path, board: str, *, nvpmodel: bool = True, boot_mode: int | None = None) -> FakeJetson:
    """Lay out board ``board`` (a key of :data:`BOARDS`) under ``root``, booted in nvpmodel mode ``boot_mode``
    (default: the conf's default mode): its GPU TPC power-gating mask is the GPU's live one, and the fake
    ``nvpmodel`` switches live only to modes with that mask, as L4T's does."""
    spec = BOARDS[board]
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    _w(root / "proc/device-tree/model", spec.model + "\x00", 0o444)
    _w(root / "proc/device-tree/compatible", "".join(c + "\x00" for c in spec.compatible), 0o444)
    _w(root / "etc/nv_tegra_release", spec.release + "\n")
    _w(root / "proc/sys/kernel/random/boot_id", "5b0e7f2a-3c1d-4e8b-9a6f-0d2c4b8e1f37\n", 0o444)

    fake = FakeJetson(root, board, spec, gpu=root)
    # power monitors
    for n, (layout, addr, rails) in enumerate(spec.monitors):
        if layout == "hwmon":
            dev = root / "sys/bus/i2c/devices" / addr
            _w(dev / "name", "ina3221\n", 0o444)
            hw = dev / "hwmon" / f"hwmon{n + 1}"
            drv = root / "sys/bus/i2c/drivers/ina3221"
            drv.mkdir(parents=True, exist_ok=True)
            if not (drv / addr).exists():
                (drv / addr).symlink_to(os.path.relpath(dev, drv))
            _w(hw / "name", "ina3221\n", 0o444)
            if spec.update_interval_ms is not None:
                _w(hw / "update_interval", f"{spec.update_interval_ms}\n")
            for k, (label, mv, ma) in enumerate(rails, start=1):
                if label.startswith("sum"):
                    k = 7
                _w(hw / f"in{k}_label", label + "\n", 0o444)
                v = _w(hw / f"in{k}_input", f"{mv}\n", 0o444)
                if label.startswith("sum"):
                    continue
                c = _w(hw / f"curr{k}_input", f"{ma}\n", 0o444)
                _w(hw / f"curr{k}_max", "32760\n")
                _w(hw / f"curr{k}_crit", "32760\n")
                if label != "NC":
                    fake.rail_files[label] = (v, c)
        else:
            dev = root / "sys/bus/i2c/drivers/ina3221x" / addr / f"iio:device{n}"
            _w(dev / "name", "ina3221x\n", 0o444)
            for k, (label, mv, ma) in enumerate(rails):
                _w(dev / f"rail_name_{k}", label + "\n", 0o444)
                _w(dev / f"in_voltage{k}_input", f"{mv}\n", 0o444)
                _w(dev / f"in_current{k}_input", f"{ma}\n", 0o444)
                p = _w(dev / f"in_power{k}_input", f"{round(mv * ma / 1000)}\n", 0o444)
                _w(dev / f"warn_current_limit_{k}", "32760\n")
                _w(dev / f"crit_current_limit_{k}", "32760\n")
                fake.rail_files[label] = (p,)

    # GPU devfreq, with the class symlink and the device's of_node
    gpu_dev = root / spec.gpu_dev
    _w(gpu_dev / "of_node/name", spec.gpu_of_name + "\x00", 0o444)
    _w(gpu_dev / "load", "0\n", 0o444)
    _w(gpu_dev / "railgate_enable", "1\n")
    table = GPU_HZ[board]
    node = gpu_dev / "devfreq" / spec.gpu_node
    _w(node / "available_frequencies", " ".join(map(str, table)) + "\n", 0o444)
    _w(node / "cur_freq", f"{table[0]}\n", 0o444)
    _w(node / "min_freq", f"{table[0]}\n")
    _w(node / "max_freq", f"{table[-1]}\n")
    _w(node / "governor", "nvhost_podgov\n")
    (node / "device").symlink_to(os.path.relpath(gpu_dev, node))
    cls = root / "sys/class/devfreq"
    cls.mkdir(parents=True, exist_ok=True)
    (cls / spec.gpu_node).symlink_to(os.path.relpath(node, cls))
    # an unrelated devfreq node (the NVDLA / VIC engines sit beside the GPU on real boards)
    other = root / "sys/devices/15340000.vic/devfreq/15340000.vic"
    _w(root / "sys/devices/15340000.vic/of_node/name", "vic\x00", 0o444)
    _w(other / "available_frequencies", "115200000 729600000\n", 0o444)
    (other / "device").symlink_to(os.path.relpath(root / "sys/devices/15340000.vic", other))
    (cls / "15340000.vic").symlink_to(os.path.relpath(other, cls))
    fake.gpu = node

    # CPUs: online files and one cpufreq policy per cluster
    cpu = root / "sys/devices/system/cpu"
    khz = CPU_KHZ[board]
    for c in range(spec.cpus):
        d = cpu / f"cpu{c}"
        d.mkdir(parents=True, exist_ok=True)
        if c != 0:
            _w(d / "online", "1\n")
    _w(cpu / "online", f"0-{spec.cpus - 1}\n", 0o444)
    for first in spec.clusters:
        p = cpu / "cpufreq" / f"policy{first}"
        _w(p / "scaling_available_frequencies", " ".join(map(str, khz)) + " \n", 0o444)
        _w(p / "cpuinfo_min_freq", f"{khz[0]}\n", 0o444)
        _w(p / "cpuinfo_max_freq", f"{khz[-1]}\n", 0o444)
        _w(p / "scaling_min_freq", f"{khz[0]}\n")
        _w(p / "scaling_max_freq", f"{khz[-1]}\n")
        _w(p / "scaling_cur_freq", f"{khz[len(khz) // 2]}\n", 0o444)
        _w(p / "scaling_governor", "schedutil\n")
        fake.policies.append(p)

    if board in EMC:
        lo, hi, rate = EMC[board]
        emc = root / "sys/kernel/debug/bpmp/debug/clk/emc"
        _w(emc / "min_rate", f"{lo}\n", 0o444)
        _w(emc / "max_rate", f"{hi}\n", 0o444)
        _w(emc / "rate", f"{rate}\n")
        _w(emc / "mrq_rate_locked", "0\n")
        fake.emc = emc

    # thermal zones (millidegrees): JetPack 6 names them cpu-thermal ... tj-thermal (1/32 K steps), older
    # releases CPU-therm, GPU-therm, AUX-therm (half-kelvin steps, no junction zone)
    zones = ((("cpu-thermal", 43531), ("gpu-thermal", 42937), ("soc0-thermal", 41218), ("tj-thermal", 43531))
             if "R36" in spec.release else (("CPU-therm", 44000), ("GPU-therm", 41500), ("AUX-therm", 40000)))
    for n, (name, milli) in enumerate(zones):
        zone = root / "sys/devices/virtual/thermal" / f"thermal_zone{n}"
        _w(zone / "type", name + "\n", 0o444)
        fake.thermal[name] = _w(zone / "temp", f"{milli}\n", 0o444)

    if nvpmodel:
        modes, default = MODES[board]
        conf = "\n".join(_mode_block(board, spec, i, name) for i, name in modes)
        _w(root / "etc/nvpmodel.conf", f"{_CONF_PREAMBLE}\n{conf}\n< PM_CONFIG DEFAULT={default} >\n")
        booted = default if boot_mode is None else boot_mode
        _w(root / "var/lib/nvpmodel/status", f"pmode:{booted:04d} fmode:normal\n")
        _w(root / "usr/sbin/nvpmodel", _NVPMODEL.replace("PYTHON", sys.executable), 0o755)
        mask = re.search(rf"ID={booted} NAME=\S+ >[^<]*TPC_PG_MASK (\d+)", conf)
        if mask:  # set at boot; the board without mode tables (Nano) gates no TPCs by mode
            _w(gpu_dev / "tpc_pg_mask", f"{mask[1]}\n", 0o444)
    return fake


# nvpmodel.conf's definitions section: it uses the mode blocks' keywords (a bare MAX_FREQ line), so a parser
# that reads fields outside a POWER_MODEL block would take it for a mode's cap.
_CONF_PREAMBLE = """# nvpmodel configuration
< PARAM TYPE=FILE NAME=CPU_ONLINE >
CORE_0 /sys/devices/system/cpu/cpu0/online

< PARAM TYPE=CLOCK NAME=GPU >
FREQ_TABLE /sys/devices/gpu.0/devfreq/17000000.gpu/available_frequencies
MAX_FREQ /sys/devices/gpu.0/devfreq/17000000.gpu/max_freq
MIN_FREQ /sys/devices/gpu.0/devfreq/17000000.gpu/min_freq

< PARAM TYPE=FILE NAME=EMC >
MAX_FREQ /sys/kernel/nvpmodel_emc_cap/emc_iso_cap
"""
#: the twin profile whose nvpmodel table (edgetune/power/profiles/power_modes.csv, from L4T's nvpmodel.conf)
#: a fake board's mode blocks are written from
_MODE_TABLE = {"agx-orin-jp5": "orin-agx", "agx-orin-jp6": "orin-agx", "orin-nano": "orin-nano",
               "xavier-nx": "xavier-nx"}
_CLUSTER = {"tegra194": "CPU_DENVER", "tegra234": "CPU_A78", "tegra210": "CPU_A57"}


def _mode_block(board: str, spec: BoardSpec, mode_id: int, name: str) -> str:
    """One ``< POWER_MODEL >`` block as L4T writes it: online cores, TPC gating, clock limits per cluster."""
    lines = [f"< POWER_MODEL ID={mode_id} NAME={name} >"]
    table = Path(__file__).resolve().parents[2] / "edgetune/power/profiles/power_modes.csv"
    row = next((r for r in csv.DictReader(table.open()) if r["profile"] == _MODE_TABLE.get(board)
                and r["mode_name"] == name), None)
    if row is None:  # a board without a table (Nano): every core online, nothing capped
        return "\n".join(lines + [f"CPU_ONLINE CORE_{k} 1" for k in range(spec.cpus)]) + "\n"
    lines += [f"CPU_ONLINE CORE_{k} {int(k < int(row['cores_online']))}" for k in range(spec.cpus)]
    lines += [f"TPC_POWER_GATING TPC_PG_MASK {row['tpc_pg_mask']}", "GPU_POWER_CONTROL_ENABLE GPU_PWR_CNTL_EN on"]
    cluster = _CLUSTER[spec.compatible[-1].split(",")[-1]]
    for c in range(len(spec.clusters)):
        lines += [f"{cluster}_{c} MIN_FREQ {row['cpu_min_khz']}", f"{cluster}_{c} MAX_FREQ {row['cpu_max_khz']}"]
    lines += [f"GPU MIN_FREQ {row['gpu_min_hz']}", f"GPU MAX_FREQ {row['gpu_max_hz']}",
              "GPU_POWER_CONTROL_DISABLE GPU_PWR_CNTL_DIS auto", f"EMC MAX_FREQ {row['emc_max_hz']}",
              "DLA0_CORE MAX_FREQ -1", "PVA0_VPS MAX_FREQ -1"]
    return "\n".join(lines) + "\n"


# A stand-in for L4T's nvpmodel: the same arguments, output and status file, acting on the fake tree.
_NVPMODEL = '''#!PYTHON
import pathlib, re, sys
root = pathlib.Path(__file__).resolve().parents[2]
conf = (root / "etc/nvpmodel.conf").read_text()
modes = {int(i): n for i, n in re.findall(r"POWER_MODEL ID=(\\d+) NAME=(\\S+) >", conf)}
status = root / "var/lib/nvpmodel/status"
args = sys.argv[1:]
if args == ["-q"]:
    mode = int(re.search(r"pmode:(\\d+)", status.read_text()).group(1))
    print(f"NV Power Mode: {modes[mode]}")
    print(mode)
elif len(args) == 2 and args[0] == "-m" and args[1].isdigit():
    mode = int(args[1])
    refused = root / "etc/nvpmodel.refuse"  # test hook: modes the firmware refuses
    if mode not in modes or (refused.exists() and str(mode) in refused.read_text().split()):
        print(f"NVPM ERROR: failed to set power mode {mode}", file=sys.stderr)
        sys.exit(1)
    # another GPU TPC power-gating mask than the live one takes a reboot: the prompt, and without a YES the
    # lines a real board prints (L4T r35/r36); the status is the -EINVAL exit nvpmodel.service was seen with
    wanted = re.search(rf"ID={mode} NAME=\\S+ >[^<]*TPC_PG_MASK (\\d+)", conf)
    live = next(root.glob("sys/devices/**/tpc_pg_mask"), None)
    if wanted and live is not None and int(wanted.group(1)) != int(live.read_text()):
        print("NVPM WARN: Golden image context is already created")
        print(f"NVPM WARN: Reboot required for changing to this power mode: {mode}")
        print("NVPM WARN: DO YOU WANT TO REBOOT NOW? enter YES/yes to confirm:", flush=True)
        answer = sys.stdin.readline().strip()
        if answer in ("YES", "yes"):
            print("NVPM WARN: rebooting")  # a fake cannot reboot: the tests never answer
            sys.exit(0)
        if answer:
            print("NVPM ERROR: bad input!")
        print("NVPM ERROR: optMask is 1, no request for power mode")
        sys.exit(234)
    status.write_text(f"pmode:{mode:04d} fmode:normal\\n")
else:
    print("Usage: nvpmodel [-m mode] [-q]", file=sys.stderr)
    sys.exit(1)
'''


def break_file(path: Path, how: str) -> None:
    """A board file as a failing or changed driver leaves it: ``missing``, a ``directory``, or ``how`` as its
    text (garbage: ``"N/A"``, empty)."""
    path.unlink()
    if how == "directory":
        path.mkdir()
    elif how != "missing":
        path.write_text(how)


def reject_writes(path: Path) -> None:
    """Make writes to ``path`` fail as a kernel refusal does (a link to /dev/full: ENOSPC)."""
    path.unlink()
    path.symlink_to("/dev/full")
