"""visualize_sharding / visualize_tensor_sharding render as torch_xla's (the expected tables are
built the way pytorch/xla's test/spmd/test_spmd_debugging.py builds them)."""

import numpy as np
import pytest
import rich.align
import rich.box
import rich.console
import rich.padding
import rich.style
import rich.table
import torch

import lazyxla
import lazyxla.distributed.spmd as xs

dev = lazyxla.device()


def _render(table) -> str:
    console = rich.console.Console()
    with console.capture() as cap:
        console.print(table)
    return cap.get()


def _expected(rows: list[list[str]]) -> str:
    use_color = bool(rich.console.Console().color_system)
    table = rich.table.Table(
        show_header=False,
        show_lines=not use_color,
        padding=0,
        highlight=not use_color,
        pad_edge=False,
        box=rich.box.SQUARE if not use_color else None,
    )
    for row in rows:
        table.add_row(
            *[
                rich.padding.Padding(
                    rich.align.Align(text, "center", vertical="middle"),
                    (1, 1, 1, 1),
                    style=rich.style.Style(bgcolor=None, color=None),
                )
                for text in row
            ]
        )
    return _render(table)


def test_tiled_2d_sharding_one_device_per_cell(capsys):
    table = xs.visualize_sharding("{devices=[2,4]0,4,1,5,2,6,3,7}")
    assert capsys.readouterr().out.startswith(
        "Visualizing {devices=[2,4]0,4,1,5,2,6,3,7} (showing up to the first two dimensions)"
    )
    want = [["CPU 0", "CPU 4", "CPU 1", "CPU 5"], ["CPU 2", "CPU 6", "CPU 3", "CPU 7"]]
    assert _render(table) == _expected(want)


def test_partial_replication_lists_each_tiles_devices():
    table = xs.visualize_sharding("{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}")
    assert _render(table) == _expected([["CPU [0, 2, 4, 6]"], ["CPU [1, 3, 5, 7]"]])


def test_replicated_is_one_cell_of_all_devices():
    table = xs.visualize_sharding("{replicated}")
    assert _render(table) == _expected([[f"CPU {list(range(8))}"]])


def test_tensor_sharding_reads_the_tensors_spec(mesh):
    t = torch.randn(8, 32).to(dev)
    xs.mark_sharding(t, mesh, ("x", None))  # rows over x (4), replicated over y (2)
    table = xs.visualize_tensor_sharding(t)
    want = [[f"CPU [{2 * i}, {2 * i + 1}]"] for i in range(4)]
    assert _render(table) == _expected(want)
    t2 = torch.randn(8, 8).to(dev)
    xs.mark_sharding(t2, xs.Mesh(np.arange(8), (2, 4)), (1, 0))
    want = [["CPU 0", "CPU 4"], ["CPU 1", "CPU 5"], ["CPU 2", "CPU 6"], ["CPU 3", "CPU 7"]]
    assert _render(xs.visualize_tensor_sharding(t2)) == _expected(want)


def test_bad_strings_are_clear_errors():
    with pytest.raises(ValueError, match="V1 sharding string"):
        xs.visualize_sharding("{devices=oops}")
    with pytest.raises(ValueError, match="1-D and 2-D"):
        xs.visualize_sharding("{devices=[2,2,2]0,1,2,3,4,5,6,7}")
