"""Boards for the fake jtop client (``fakes/jtop/jtop.py``): what a jtop service reports, as one JSON file.

Values as jetson-stats reports them on a Jetson Orin Nano 8GB developer kit (JetPack 6): the hardware
description, the three INA3221 rails at idle in mV and mA (the same readings as the fake sysfs tree in
:mod:`fakes.jetson_tree`), the nvpmodel modes ``15W`` (id 0, the default) and ``7W`` (id 1), and
jetson_clocks off.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FAKE_JTOP_DIR = Path(__file__).resolve().parent / "jtop"


def orin_nano(socket: Path | str, *, interval_s: float | None = None) -> dict[str, Any]:
    """An Orin Nano's service whose socket is ``socket`` (the test creates the file to 'start' it)."""
    return {
        "socket": str(socket),
        "service": "running",
        "access": "granted",
        "version": "4.2.12",
        "interval_s": interval_s,
        "board": {"Model": "NVIDIA Jetson Orin Nano Developer Kit",
                  "699-level Part Number": "699-13767-0005-300 R.1", "P-Number": "p3767-0005",
                  "Module": "NVIDIA Jetson Orin Nano (Developer kit)", "SoC": "tegra234",
                  "CUDA Arch BIN": "8.7", "Serial Number": "1421223056123", "L4T": "36.3.0", "Jetpack": "6.0"},
        "cpus": 6,
        "rails": {"VDD_IN": [5080, 936], "VDD_CPU_GPU_CV": [5080, 152], "VDD_SOC": [5080, 256]},
        "nvpmodel": {"models": ["15W", "7W"], "masks": ["0x1", "0x1"], "status": [True, True], "default": 0,
                     "id": 0, "fail": []},
        "jetson_clocks": {"enable": False, "config": False, "thread": "inactive", "boot": False},
    }


def write_state(path: Path, state: dict[str, Any]) -> dict[str, str]:
    """Write the service's state; returns the environment the fake client reads it through."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, path)
    return {"FAKE_JTOP_STATE": str(path)}


def read_state(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def update_state(path: Path, **changes: Any) -> dict[str, Any]:
    """Change top-level entries of the state (``service="stopped"``, ``rails={...}``) and write it back."""
    state = read_state(path)
    state.update(changes)
    write_state(path, state)
    return state
