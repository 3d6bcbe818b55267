"""nn.MultiheadAttention's and nn.Transformer*'s inference fast path on lazyxla tensors.

# Note [Transformer fast path]
PyTorch's `MultiheadAttention`, `TransformerEncoderLayer` and `TransformerEncoder` take a fused
"fast path" in inference (eval mode, no gradient) on the CPU, CUDA and any PrivateUse1 device,
lazyxla's included (torch_xla's "xla" device is not one of them). That path calls fused kernels
lazyxla runs only through the CPU fallback (`_native_multi_head_attention`,
`_transformer_encoder_layer_fwd`: a sync and two host copies per call), and `TransformerEncoder`
given a `src_key_padding_mask` packs its input into a nested tensor, which a lazy tensor cannot
be: `nn.TransformerEncoder` inference with padding failed outright. On lazyxla tensors these
modules run their standard path instead, which computes the same values from lowered ops; it is
the path torch_xla takes. The one observable difference is `TransformerEncoder`'s: its nested
path drops the padded positions and pads the output back with zeros before the final norm, so
here those positions are zeroed at the same point. Whether the nested path would be taken is
PyTorch's own decision: its `_nested_tensor_from_mask` call is intercepted. (That decision reads
whether the padding is left-aligned, a value read as in eager.)

This module lives outside `lazyxla._src`, whose frames torch.compile's dynamo skips (dynamo.py):
there, the replaced forwards would be a graph break in every compiled model holding one of these
modules. Here dynamo inlines them, and while it compiles they call PyTorch's forward unchanged.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules import transformer

from ._src.tensor import DEVICE_TYPE


@contextlib.contextmanager
def _standard_path() -> Iterator[None]:
    prev = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(prev)


def _lazy(t: Any) -> bool:
    """A lazyxla tensor, outside a torch.compile trace (Note [Transformer fast path])."""
    return (
        isinstance(t, torch.Tensor)
        and t.device.type == DEVICE_TYPE
        and not torch.compiler.is_compiling()
    )


class _WouldNest(Exception):
    """Raised by the intercepted `_nested_tensor_from_mask` on a lazyxla tensor."""


def _patch() -> None:
    mha_forward = torch.nn.MultiheadAttention.forward
    layer_forward = torch.nn.TransformerEncoderLayer.forward
    encoder_forward = torch.nn.TransformerEncoder.forward
    nested_from_mask = torch._nested_tensor_from_mask
    left_aligned = torch._nested_tensor_from_mask_left_aligned

    def standard_in_inference(forward: Any) -> Any:
        """`forward` on its standard path when its input (the first argument after `self`,
        positional or by name) is a lazyxla tensor, in inference."""
        name = list(inspect.signature(forward).parameters)[1]  # ("query", "src")

        def run(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            if _lazy(args[0] if args else kwargs.get(name)) and not self.training:
                with _standard_path():
                    return forward(self, *args, **kwargs)
            return forward(self, *args, **kwargs)

        return run

    def nested(t: Any, mask: Any, *args: Any, **kwargs: Any) -> Any:
        if _lazy(t):
            raise _WouldNest
        return nested_from_mask(t, mask, *args, **kwargs)

    def aligned(t: Any, mask: Any) -> bool:
        """Whether each row of `mask` (True: keep) is a run of Trues then Falses: lowered ops
        and one value read, not the CPU fallback's copy of the mask."""
        if not _lazy(mask):
            return left_aligned(t, mask)
        positions = torch.arange(mask.shape[-1], device=mask.device)
        prefix = positions < mask.sum(-1, keepdim=True)
        return bool((mask == prefix).all())

    def encoder(
        self: torch.nn.TransformerEncoder,
        src: Any,
        mask: Any = None,
        src_key_padding_mask: Any = None,
        is_causal: bool | None = None,
    ) -> Any:
        if not _lazy(src):
            return encoder_forward(self, src, mask, src_key_padding_mask, is_causal)
        try:
            return encoder_forward(self, src, mask, src_key_padding_mask, is_causal)
        except _WouldNest:
            pass
        # PyTorch would pack `src` by its padding: the same layers, masked, then zeros there.
        pad = F._canonical_mask(
            mask=src_key_padding_mask,
            mask_name="src_key_padding_mask",
            other_type=F._none_or_dtype(mask),
            other_name="mask",
            target_type=src.dtype,
        )
        mask = F._canonical_mask(
            mask=mask,
            mask_name="mask",
            other_type=None,
            other_name="",
            target_type=src.dtype,
            check_other=False,
        )
        batch_first = self.layers[0].self_attn.batch_first
        seq_len = transformer._get_seq_len(src, batch_first)
        is_causal = transformer._detect_is_causal_mask(mask, is_causal, seq_len)
        output = src
        with _standard_path():
            for mod in self.layers:
                output = mod(output, src_mask=mask, is_causal=is_causal, src_key_padding_mask=pad)
        padded = pad != 0  # (the nested path keeps the positions whose float mask is 0)
        output = output.masked_fill((padded if batch_first else padded.t()).unsqueeze(-1), 0.0)
        if self.norm is not None:
            output = self.norm(output)
        return output

    mha, layer = standard_in_inference(mha_forward), standard_in_inference(layer_forward)
    for new, old in ((mha, mha_forward), (layer, layer_forward), (encoder, encoder_forward)):
        new.__doc__, new.__name__ = old.__doc__, old.__name__
    torch.nn.MultiheadAttention.forward = mha
    torch.nn.TransformerEncoderLayer.forward = layer
    torch.nn.TransformerEncoder.forward = encoder
    torch._nested_tensor_from_mask = nested
    torch._nested_tensor_from_mask_left_aligned = aligned


_patch()
