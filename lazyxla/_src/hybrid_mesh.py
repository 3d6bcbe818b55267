"""torch_xla's `HybridMesh`: a mesh over ICI-connected devices within slices and DCN across them,
in torch_xla's device order (see the class)."""

from __future__ import annotations

import numpy as np

from . import api
from .sharding import Mesh


class HybridMesh(Mesh):
    """A mesh over ICI-connected devices within slices and DCN across slices.

    With TPU device attributes (`coords`, `slice_index`) the devices are ordered as torch_xla
    orders them: each slice's devices by their physical torus coordinates (JAX's
    `_create_device_mesh_for_nd_torus`, which torch_xla copies), slices as DCN blocks. Without
    them (CPU, GPU) there is no physical topology to follow: devices are ordered by id, the plain
    mesh of shape `ici_mesh_shape * dcn_mesh_shape`, DCN axes outermost.
    """

    def __init__(
        self,
        *,
        ici_mesh_shape: tuple[int, ...],
        dcn_mesh_shape: tuple[int, ...] | None = None,
        axis_names: tuple[str, ...] | None = None,
    ) -> None:
        if dcn_mesh_shape is None:
            dcn_mesh_shape = (1,) * len(ici_mesh_shape)
        if len(ici_mesh_shape) != len(dcn_mesh_shape):
            raise AssertionError("ici_mesh_shape and dcn_mesh_shape must have the same rank")
        self.ici_mesh_shape = tuple(ici_mesh_shape)
        self.dcn_mesh_shape = tuple(dcn_mesh_shape)
        mesh_shape = tuple(i * d for i, d in zip(ici_mesh_shape, dcn_mesh_shape))
        ids = _tpu_hybrid_device_ids(self.ici_mesh_shape, self.dcn_mesh_shape)
        if ids is None:
            n = int(np.prod(mesh_shape))
            # Slice-major order: each DCN block holds one slice's contiguous device ids.
            ids = np.arange(n).reshape(tuple(dcn_mesh_shape) + tuple(ici_mesh_shape))
            r = len(mesh_shape)
            order = [x for i in range(r) for x in (i, r + i)]
            ids = ids.transpose(order).reshape(mesh_shape)
        super().__init__(ids.ravel(), mesh_shape, axis_names)


def _tpu_hybrid_device_ids(ici: tuple[int, ...], dcn: tuple[int, ...]) -> np.ndarray | None:
    """torch_xla's HybridMesh device order from TPU device attributes, or None off TPU. Read
    through the public modules (`torch_xla.runtime`, `xla_model`), as torch_xla reads them."""
    from jax._src.mesh_utils import _create_device_mesh_for_nd_torus

    import lazyxla.core.xla_model as xm
    import lazyxla.runtime as xr

    if xm.xla_device_hw(api.device()) != "TPU":
        return None
    attrs = sorted(xr.global_runtime_device_attributes(), key=lambda a: _device_index(a["name"]))
    if not attrs or "coords" not in attrs[0]:
        return None
    multislice = "slice_index" in attrs[0]
    if multislice and np.prod(dcn) == 1:
        raise ValueError("Provide dcn_mesh_shape to create a mesh for multislice")
    if not multislice and np.prod(dcn) > 1:
        raise ValueError("Invalid dcn_mesh_shape for single slice mesh")

    def torus(devices: list[int]) -> np.ndarray:
        if np.prod(ici) != len(devices):
            raise ValueError(
                f"Number of devices {len(devices)} must equal the product of mesh_shape {ici}"
            )
        coords = [attrs[d]["coords"] for d in devices]
        physical = np.empty(tuple(c + 1 for c in max(coords)), dtype=int)
        for c, d in zip(coords, devices):
            physical[c[0], c[1], c[2]] = d
        return _create_device_mesh_for_nd_torus(physical, ici, allow_split_physical_axes=True)[0]

    if not multislice:
        return torus(list(range(xr.global_runtime_device_count())))
    slices: dict[int, list[int]] = {}
    for d, a in enumerate(attrs):
        slices.setdefault(a["slice_index"], []).append(d)
    granules = [slices[k] for k in sorted(slices)]
    if np.prod(dcn) != len(granules):
        raise ValueError(
            f"Number of slices {len(granules)} must equal the product of dcn_mesh_shape {dcn}"
        )
    meshes = [torus(g) for g in granules]
    blocks = np.arange(len(granules)).reshape(dcn)
    return np.block(np.vectorize(lambda i: meshes[i], otypes=[object])(blocks).tolist())


def _device_index(name: str) -> int:
    """The index of a runtime device name such as `TPU:3`."""
    return int(name.rsplit(":", 1)[1])
