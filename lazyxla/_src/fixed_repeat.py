"""torch_xla's `custom_kernel.repeat_with_fixed_output_size`: `repeat_interleave` with a static
output length, so the graph does not depend on the values of `repeats`."""

from __future__ import annotations

import torch


def repeat_with_fixed_output_size(
    input: torch.Tensor, repeats: torch.Tensor, total_repeat_length: int
) -> torch.Tensor:
    """`torch.repeat_interleave(input, repeats)` cut or padded to `total_repeat_length`: longer
    results are truncated, shorter ones filled with `input[-1]`. 1-D `input` and `repeats`.

    Output element `k` is `input[j]` for the first `j` whose running total of repeats exceeds
    `k` (a `searchsorted` over the cumulative sum), so every shape is static.
    """
    if input.dim() != 1 or repeats.dim() != 1:
        raise ValueError(
            "repeat_with_fixed_output_size takes 1-D input and repeats, got shapes "
            f"{tuple(input.shape)} and {tuple(repeats.shape)}"
        )
    if input.size(0) != repeats.size(0):
        raise ValueError(
            f"repeat_with_fixed_output_size: input has {input.size(0)} elements but repeats has "
            f"{repeats.size(0)}; they must match"
        )
    ends = torch.cumsum(repeats, dim=0)
    positions = torch.arange(total_repeat_length, device=input.device, dtype=ends.dtype)
    index = torch.searchsorted(ends, positions, right=True).clamp(max=input.size(0) - 1)
    return input[index]
