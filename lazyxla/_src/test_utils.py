"""torch_xla.test.test_utils: training-loop printing, TensorBoard summaries, isolated tests."""

from __future__ import annotations

import multiprocessing
import time
import unittest
from collections.abc import Callable
from datetime import datetime
from typing import Any

from . import metrics, metrics_compare, runtime_api


def mp_test(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run a `unittest.TestCase` method in its own process; the test fails if the process does."""

    def wrapper(*args: Any, **kwargs: Any) -> int | None:
        proc = multiprocessing.Process(target=func, args=args, kwargs=kwargs)
        proc.start()
        proc.join()
        if args and isinstance(args[0], unittest.TestCase):
            args[0].assertEqual(proc.exitcode, 0)
        return proc.exitcode

    return wrapper


def _device_spec(device: Any) -> str:
    ordinal = runtime_api.global_ordinal()
    return str(device) if ordinal < 0 else f"{device}/{ordinal}"


def write_to_summary(
    summary_writer: Any,
    global_step: int | None = None,
    dict_to_write: dict[str, float] | None = None,
    write_xla_metrics: bool = False,
) -> None:
    """Write `dict_to_write`'s scalars (and, optionally, every metric as a scalar) to a writer.

    With `write_xla_metrics`, each parsed metric of `metrics_report()` is written under its parsed
    name, plus `aten_ops_sum` (the total of the `aten::` CPU-fallback counters).
    """
    if summary_writer is None:
        return
    for k, v in (dict_to_write or {}).items():
        summary_writer.add_scalar(k, v, global_step)
    if write_xla_metrics:
        parsed = metrics_compare.parse_metrics_report(metrics.metrics_report())
        aten = 0
        for name, value in parsed.items():
            if name.startswith("aten::"):
                aten += value
            summary_writer.add_scalar(name, value, global_step)
        summary_writer.add_scalar("aten_ops_sum", aten, global_step)


def close_summary_writer(summary_writer: Any) -> None:
    """Flush and close `summary_writer` (None: nothing to do)."""
    if summary_writer is not None:
        summary_writer.flush()
        summary_writer.close()


def get_summary_writer(logdir: str | None) -> Any:
    """A TensorBoard `SummaryWriter` logging to `logdir` (None when `logdir` is empty).

    Uses tensorboardX, as torch_xla does, or else `torch.utils.tensorboard`.
    """
    if not logdir:
        return None
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError(
                f"get_summary_writer({logdir!r}) needs tensorboardX or tensorboard: "
                "pip install tensorboardX, or pass logdir=None to write no summaries"
            ) from e
    writer = SummaryWriter(log_dir=logdir)
    write_to_summary(writer, 0, dict_to_write={"TensorboardStartTimestamp": time.time()})
    return writer


def now(format: str = "%H:%M:%S") -> str:
    return datetime.now().strftime(format)


def print_training_update(
    device: Any,
    step: int,
    loss: float,
    rate: float,
    global_rate: float,
    epoch: int | None = None,
    summary_writer: Any = None,
) -> None:
    """Print `| Training Device=.. Epoch=.. Step=.. Loss=.. Rate=.. GlobalRate=.. Time=..`."""
    parts = [
        "Training",
        f"Device={_device_spec(device)}",
        f"Epoch={epoch}" if epoch is not None else None,
        f"Step={step}",
        f"Loss={loss:.5f}",
        f"Rate={rate:.2f}",
        f"GlobalRate={global_rate:.2f}",
        f"Time={now()}",
    ]
    print("|", " ".join(p for p in parts if p), flush=True)
    if summary_writer:
        write_to_summary(
            summary_writer,
            dict_to_write={"examples/sec": rate, "average_examples/sec": global_rate},
        )


def print_test_update(
    device: Any, accuracy: float | None, epoch: int | None = None, step: int | None = None
) -> None:
    """Print `| Test Device=... Step=... Epoch=... Accuracy=... Time=...`."""
    parts = [
        "Test",
        f"Device={_device_spec(device)}",
        f"Step={step}" if step is not None else None,
        f"Epoch={epoch}" if epoch is not None else None,
        f"Accuracy={accuracy:.2f}" if accuracy is not None else None,
        f"Time={now()}",
    ]
    print("|", " ".join(p for p in parts if p), flush=True)
