"""Which Jetson a sysfs tree is: model, module (from the device-tree part number) and JetPack release."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from edgetune.power.sysfs import read_text

__all__ = ["JETPACK", "MODULES", "BoardInfo", "detect_board"]

#: device-tree ``compatible`` part numbers -> module (NVIDIA's module data sheets)
MODULES = {
    "p3701-0000": "AGX Orin 32GB", "p3701-0004": "AGX Orin 32GB", "p3701-0005": "AGX Orin 64GB",
    "p3767-0000": "Orin NX 16GB", "p3767-0001": "Orin NX 8GB", "p3767-0003": "Orin Nano 8GB",
    "p3767-0004": "Orin Nano 4GB", "p3767-0005": "Orin Nano 8GB",
    "p3668-0000": "Xavier NX", "p3668-0001": "Xavier NX 16GB", "p2888-0001": "AGX Xavier 16GB",
    "p2888-0004": "AGX Xavier 32GB", "p2888-0006": "AGX Xavier 8GB", "p3448-0000": "Nano 4GB",
    "p3448-0002": "Nano 4GB (eMMC)", "p3448-0003": "Nano 2GB", "p3310-1000": "TX2",
}
#: L4T major release -> JetPack release
JETPACK = {"32": "JetPack 4", "34": "JetPack 5", "35": "JetPack 5", "36": "JetPack 6", "38": "JetPack 7"}


@dataclass(frozen=True)
class BoardInfo:
    """What the tree says the board is."""

    model: str = ""  # /proc/device-tree/model, e.g. "NVIDIA Jetson AGX Orin Developer Kit"
    module: str = ""  # from the compatible part number, e.g. "Orin Nano 8GB"
    l4t: str = ""  # e.g. "R36.3.0"
    jetpack: str = ""  # e.g. "JetPack 6"

    @property
    def family(self) -> str:
        text = f"{self.model} {self.module}".lower()
        for name in ("orin", "xavier", "thor", "nano", "tx2"):
            if name in text:
                return name
        return ""

    def describe(self) -> str:
        name = self.model or "NVIDIA Jetson (model unknown)"
        extra = ", ".join(x for x in (self.module, f"L4T {self.l4t}" if self.l4t else "", self.jetpack) if x)
        return f"{name} ({extra})" if extra else name


def detect_board(root: Path) -> BoardInfo:
    """Board model, module and software release from the device tree and ``/etc/nv_tegra_release``."""
    model = ""
    for rel in ("proc/device-tree/model", "sys/firmware/devicetree/base/model"):
        try:
            model = read_text(root / rel)
            break
        except OSError:
            continue
    module = ""
    for rel in ("proc/device-tree/compatible", "sys/firmware/devicetree/base/compatible"):
        try:
            compatible = (root / rel).read_bytes().decode("ascii", "replace")
        except OSError:
            continue
        for part in re.findall(r"p\d{4}-\d{4}", compatible):
            if part in MODULES:
                module = MODULES[part]
                break
        break
    l4t = jetpack = ""
    try:
        release = read_text(root / "etc/nv_tegra_release")
        m = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", release)
        if m:
            l4t = f"R{m.group(1)}.{m.group(2)}"
            jetpack = JETPACK.get(m.group(1), "")
    except OSError:
        pass
    return BoardInfo(model, module, l4t, jetpack)

