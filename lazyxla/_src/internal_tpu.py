"""torch_xla._internal.tpu: TPU host facts, from the environment and the PCI bus.

torch_xla reads the `tpu-env` field of the GCE metadata server when `TPU_SKIP_MDS_QUERY` is unset;
lazyxla reads only environment variables (`TPU_ACCELERATOR_TYPE`, `TPU_PROCESS_BOUNDS`, ...), the
way torch_xla does with `TPU_SKIP_MDS_QUERY=1`, and raises EnvironmentError off a TPU host.
"""

from __future__ import annotations

import glob
import os
import pathlib
import re
from typing import NamedTuple

_GOOGLE_PCI_VENDOR_ID = "0x1ae0"
_TPU_PCI_DEVICE_IDS = {"0x0027", "0x005e", "0x0056", "0x0062", "0x006f"}  # v2/3, v4, v5e, v5p, v6e


class MeshShape(NamedTuple):
    x: int
    y: int
    z: int

    @classmethod
    def from_string(cls, mesh: str) -> MeshShape:
        dims = [int(d) for d in mesh.split(",")]
        if len(dims) != 3:
            raise ValueError(f"mesh shape {mesh!r} must have three comma-separated dimensions")
        return cls(*dims)

    @property
    def size(self) -> int:
        return self.x * self.y * self.z

    def __mul__(self, other: tuple[int, ...]) -> MeshShape:  # type: ignore[override]
        return MeshShape(*(a * b for a, b in zip(self, other)))


def get_tpu_env() -> dict[str, str | None]:
    """`ACCELERATOR_TYPE`, `TPU_PROCESS_BOUNDS`, `TPU_CHIPS_PER_PROCESS_BOUNDS`, `WORKER_ID`."""
    env = os.environ.get
    return {
        "ACCELERATOR_TYPE": env("TPU_ACCELERATOR_TYPE") or env("ACCELERATOR_TYPE"),
        "TPU_PROCESS_BOUNDS": env("TPU_PROCESS_BOUNDS") or env("TPU_HOST_BOUNDS"),
        "TPU_CHIPS_PER_PROCESS_BOUNDS": env("TPU_CHIPS_PER_PROCESS_BOUNDS")
        or env("TPU_CHIPS_PER_HOST_BOUNDS"),
        "WORKER_ID": env("CLOUD_TPU_TASK_ID") or env("TPU_WORKER_ID"),
    }


def version() -> int:
    """The TPU generation (4 for a `v4-8`), from `TPU_ACCELERATOR_TYPE`."""
    kind = get_tpu_env()["ACCELERATOR_TYPE"]
    if not kind:
        raise OSError(
            "not a TPU host: TPU_ACCELERATOR_TYPE is unset (lazyxla does not query the GCE "
            "metadata server; set TPU_ACCELERATOR_TYPE=v4-8, for example)"
        )
    m = re.match(r"^(?:v|tpu)(\d)([A-Za-z]?){7}-(\d+)$", kind)
    if not m:
        raise OSError(f"Failed to parse TPU version from accelerator type {kind!r}")
    return int(m.group(1))


def get_tpu_type() -> str:
    """The accelerator type without its core count (`v4` for `v4-8`)."""
    kind = get_tpu_env()["ACCELERATOR_TYPE"]
    if not kind:
        raise OSError("not a TPU host: TPU_ACCELERATOR_TYPE is unset")
    return kind.rsplit("-", 1)[0]


def num_available_chips() -> int:
    """TPU chips attached to this host through PCI (0 on a host without TPUs)."""
    n = 0
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        if pathlib.Path(vendor).read_text().strip() != _GOOGLE_PCI_VENDOR_ID:
            continue
        device = pathlib.Path(os.path.join(os.path.dirname(vendor), "device")).read_text().strip()
        n += device in _TPU_PCI_DEVICE_IDS
    return n


def num_logical_cores_per_chip() -> int:
    return 2 if version() <= 3 else 1


def num_available_devices() -> int:
    return num_available_chips() * num_logical_cores_per_chip()


def process_bounds_size() -> int | None:
    bounds = get_tpu_env()["TPU_PROCESS_BOUNDS"]
    return MeshShape.from_string(bounds).size if bounds else None


def get_worker_ips() -> list[str]:
    """The TPU workers' hostnames (`TPU_WORKER_HOSTNAMES`, comma-separated), else localhost."""
    names = os.environ.get("TPU_WORKER_HOSTNAMES")
    return names.split(",") if names else ["localhost"]


def num_tpu_workers() -> int:
    return process_bounds_size() or len(get_worker_ips())


def num_expected_global_devices() -> int:
    return num_available_devices() * num_tpu_workers()


def num_local_processes() -> int:
    chips = num_available_chips()
    total = process_bounds_size()
    return min(chips, total) if total else chips


def task_id() -> int | None:
    raw = os.environ.get("CLOUD_TPU_TASK_ID")
    return int(raw) if raw else None


def worker_id() -> int:
    raw = get_tpu_env()["WORKER_ID"]
    if raw is None:
        raise OSError("not a TPU host: neither CLOUD_TPU_TASK_ID nor TPU_WORKER_ID is set")
    return int(raw)
