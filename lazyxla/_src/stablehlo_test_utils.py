"""Helpers torch_xla's StableHLO tests import (`torch_xla.utils.stablehlo_test_utils`).

The TensorFlow SavedModel helpers run only where `tensorflow` is installed (torch_xla's tests skip
those checks otherwise, through `has_tf_package()`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree


@functools.lru_cache
def has_tf_package() -> bool:
    """Whether TensorFlow can be imported (for the tf.saved_model checks)."""
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        return False
    return True


def wrap_func_as_nn_module(f: Callable[..., Any]) -> torch.nn.Module:
    """`f` as an `nn.Module` in eval mode whose `forward(*args)` calls it (for torch.export)."""

    class M(torch.nn.Module):
        def forward(self, *args: Any) -> Any:
            return f(*args)

    return M().eval()


def _tf() -> Any:
    if not has_tf_package():
        raise ImportError(
            "this helper loads a TensorFlow SavedModel: install tensorflow (tests call it only "
            "when has_tf_package() is True)"
        )
    import tensorflow as tf

    return tf


def load_save_model_and_inference(path: str, args: tuple[Any, ...]) -> Any:
    """Load the TF SavedModel at `path` and run its `f` on `args` (tensors become tf constants)."""
    tf = _tf()
    loaded = tf.saved_model.load(path)
    tf_args = pytree.tree_map_only(torch.Tensor, lambda x: tf.constant(x.numpy()), args)
    return loaded.f(*tf_args)


def compare_exported_program_and_saved_model_result(
    ep: Any, saved_model_path: str, args: tuple[Any, ...], atol: float = 1e-7
) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """Run `ep` and the SavedModel on `args`; assert equal dtypes and values within `atol`."""
    tf_out = load_save_model_and_inference(saved_model_path, args)
    with torch.no_grad():
        torch_out = ep.module()(*args)
    if not isinstance(torch_out, tuple):
        torch_out = (torch_out,)
    assert len(torch_out) == len(tf_out), (len(torch_out), len(tf_out))
    for t, f in zip(torch_out, tf_out):
        t_np, f_np = t.numpy(), f.numpy()
        assert t_np.dtype == f_np.dtype, f"torch dtype: {t.dtype}, tf dtype: {f.dtype}"
        assert np.allclose(t_np, f_np, atol=atol)
    return tuple(t.numpy() for t in torch_out), tuple(f.numpy() for f in tf_out)
