"""A fake x86 powercap/cpufreq tree: RAPL package and DRAM zones whose counters wrap, intel_pstate policies.

Layout and units as the kernel shows them: ``/sys/class/powercap/intel-rapl:<P>/{name,energy_uj,
max_energy_range_uj}`` for each package, sub-zones ``intel-rapl:<P>:<Z>`` named ``core``, ``uncore`` and
``dram``, a ``psys`` platform zone (``intel-rapl:1`` on client parts), µJ counters wrapping at
``max_energy_range_uj`` (262143328850 µJ on recent Intel parts).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

MAX_RANGE_UJ = 262_143_328_850


def _w(path: Path, text: str, mode: int = 0o444) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


@dataclass
class FakeRapl:
    root: Path
    counters: dict[str, Path] = field(default_factory=dict)  # zone name -> energy_uj
    policies: list[Path] = field(default_factory=list)

    def set_energy(self, zone: str, uj: int) -> None:
        path = self.counters[zone]
        tmp = path.with_name(".energy_uj.new")
        tmp.write_text(f"{uj % (MAX_RANGE_UJ + 1)}\n")
        os.replace(tmp, path)

    def add_energy(self, zone: str, joules: float) -> None:
        """Spend ``joules`` in ``zone``: the counter moves on, wrapping as the hardware's does."""
        now = int(self.counters[zone].read_text())
        self.set_energy(zone, now + round(joules * 1e6))

    def knob_state(self) -> dict[str, str]:
        files = [f for p in self.policies for f in (p / "scaling_min_freq", p / "scaling_max_freq")]
        return {str(f.relative_to(self.root)): f.read_text() for f in files}


def build_rapl(root: Path, *, packages: int = 1, dram: bool = True, cpus: int = 4,
               start_uj: int = 0, dies: int = 1) -> FakeRapl:
    """``packages`` CPU packages of ``dies`` dies each: where a package has several dies the kernel makes a
    zone per die, named ``package-<P>-die-<D>`` (``intel_rapl_common``), numbered on across packages."""
    root = Path(root)
    fake = FakeRapl(root)
    _w(root / "proc/cpuinfo", "".join(
        f"processor\t: {c}\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz\n\n"
        for c in range(cpus)))
    cap = root / "sys/class/powercap"
    zones = [(p, d) for p in range(packages) for d in range(dies)]
    for k, (p, d) in enumerate(zones):
        tag = f"{p}-die-{d}" if dies > 1 else f"{p}"
        pkg = cap / f"intel-rapl:{k}"
        _w(pkg / "name", f"package-{tag}\n")
        _w(pkg / "max_energy_range_uj", f"{MAX_RANGE_UJ}\n")
        fake.counters[f"package-{tag}"] = _w(pkg / "energy_uj", f"{start_uj}\n")
        _w(pkg / "enabled", "1\n", 0o644)
        subs = ["core", "uncore"] + (["dram"] if dram else [])
        for z, name in enumerate(subs):
            sub = pkg / f"intel-rapl:{k}:{z}"
            _w(sub / "name", f"{name}\n")
            _w(sub / "max_energy_range_uj", f"{MAX_RANGE_UJ}\n")
            counter = _w(sub / "energy_uj", f"{start_uj}\n")
            if name == "dram":
                fake.counters[f"dram-{tag}"] = counter
    psys = cap / f"intel-rapl:{len(zones)}"
    _w(psys / "name", "psys\n")
    _w(psys / "max_energy_range_uj", f"{MAX_RANGE_UJ}\n")
    _w(psys / "energy_uj", "123456789\n")
    for c in range(cpus):
        pol = root / f"sys/devices/system/cpu/cpufreq/policy{c}"
        _w(pol / "cpuinfo_min_freq", "800000\n")
        _w(pol / "cpuinfo_max_freq", "3200000\n")
        _w(pol / "scaling_min_freq", "800000\n", 0o644)
        _w(pol / "scaling_max_freq", "3200000\n", 0o644)
        _w(pol / "scaling_cur_freq", "2000000\n")
        _w(pol / "scaling_driver", "intel_pstate\n")
        _w(pol / "scaling_governor", "powersave\n", 0o644)
        fake.policies.append(pol)
    return fake
