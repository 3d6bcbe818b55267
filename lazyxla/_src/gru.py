"""torch_xla.experimental.gru: `nn.GRU` whose time loop is one `lax.scan` per layer.

Unrolling a GRU over T time steps records T copies of the cell (a graph, and a compile, that
grows with the sequence length); here each layer's recurrence is `scan(cell, h0, x)`, so the
graph holds the cell once. Parameters, their names and shapes, and the math are `nn.GRU`'s
(gates r, z, n; `h' = (1 - z) * n + z * h`), so weights load from and to `nn.GRU` state dicts.
Unidirectional only, as torch_xla's. Under the torch_xla alias it replaces `torch.nn.GRU`
(`torch.nn.GRU._orig` is PyTorch's), as `import torch_xla` does.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .tensor import is_lazy

_TorchGRU = nn.GRU  # PyTorch's own, even after the alias patches torch.nn.GRU


def _scan_layer(
    gru: Any, layer: int, x: torch.Tensor, h0: torch.Tensor
) -> tuple[torch.Tensor, Any]:
    """One layer of `gru` over the sequence `x` as one scan (a function, not a method: the class
    has torch's GRU's methods only, as torch_xla's tests check)."""
    from .scan import scan

    w_ih = getattr(gru, f"weight_ih_l{layer}")
    w_hh = getattr(gru, f"weight_hh_l{layer}")
    b_ih = getattr(gru, f"bias_ih_l{layer}") if gru.bias else None
    b_hh = getattr(gru, f"bias_hh_l{layer}") if gru.bias else None
    gates_x = F.linear(x, w_ih, b_ih)  # every step's input projection at once: (T, B, 3H)

    # The recurrent weights ride in the carry (scan traces `cell` on placeholders: it may
    # not close over tensors that need gradients).
    def cell(carry: tuple, gx: torch.Tensor) -> tuple[tuple, torch.Tensor]:
        h, w, b = carry
        gh = F.linear(h, w, b)
        xr, xz, xn = gx.chunk(3, dim=-1)
        hr, hz, hn = gh.chunk(3, dim=-1)
        r = torch.sigmoid(xr + hr)
        z = torch.sigmoid(xz + hz)
        n = torch.tanh(xn + r * hn)
        h_new = (1 - z) * n + z * h
        return (h_new, w, b), h_new.clone()

    if b_hh is None:
        b_hh = torch.zeros(w_hh.shape[0], dtype=w_hh.dtype, device=w_hh.device)
    (h_last, _, _), ys = scan(cell, (h0, w_hh, b_hh), gates_x)
    return h_last, ys


class GRU(_TorchGRU):
    """`nn.GRU` with a scan per layer on lazyxla tensors (PyTorch's GRU on other devices). As in
    torch_xla, a bidirectional GRU is PyTorch's GRU (with a warning)."""

    _orig: Any = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("bidirectional", False) or (len(args) > 7 and args[7]):
            logging.warning(
                "Scan-based GRU only supports unidirectional GRU. (bidirectional = False) "
                "Scan-based GRU falls back to the default nn.GRU implementation instead."
            )
            return _TorchGRU(*args, **kwargs)
        return super().__new__(cls)

    def forward(self, input, hx=None):  # torch's GRU's signature, unannotated: torch_xla compares
        if not is_lazy(input):
            return super().forward(input, hx)
        if input.dim() not in (2, 3):
            raise ValueError(f"GRU: expected a 2-D or 3-D input, got {input.dim()}-D")
        unbatched = input.dim() == 2
        x = input.unsqueeze(1) if unbatched else input
        if self.batch_first and not unbatched:
            x = x.transpose(0, 1)
        batch = x.shape[1]
        if hx is None:
            hx = x.new_zeros(self.num_layers, batch, self.hidden_size)
        elif unbatched:
            hx = hx.unsqueeze(1)
        finals = []
        for layer in range(self.num_layers):
            h_last, x = _scan_layer(self, layer, x, hx[layer])
            finals.append(h_last)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)
        out = x.transpose(0, 1) if self.batch_first and not unbatched else x
        h_n = torch.stack(finals)
        if unbatched:
            out, h_n = out.squeeze(1), h_n.squeeze(1)
        return out, h_n
