"""Consolidating FSDP v1 checkpoints (torch_xla's `distributed.fsdp.state_dict_utils`): every
rank's sharded `state_dict()` into the unwrapped model's full state dict, on the CPU."""

from __future__ import annotations

import glob
from collections import OrderedDict
from typing import Any

import torch


def consolidate_sharded_state_dicts(
    state_dict_list: list[dict[str, torch.Tensor]], shard_metadata: dict[str, Any]
) -> OrderedDict:
    """The full state dict of the unwrapped model.

    Args:
        state_dict_list: each rank's `model.state_dict()` of the FSDP-wrapped model, in rank
            order.
        shard_metadata: `model.get_shard_metadata()` of any rank.
    """
    world = shard_metadata["world_size"]
    if len(state_dict_list) != world:
        raise ValueError(
            f"consolidate_sharded_state_dicts: {len(state_dict_list)} state dicts for a model "
            f"sharded over {world} ranks: pass every rank's state_dict(), in rank order"
        )
    shard_info, names = shard_metadata["shard_info"], shard_metadata["unwrapped_names"]
    full: OrderedDict = OrderedDict()
    for key, value in state_dict_list[0].items():
        info = shard_info.get(key)
        if info is None:  # a buffer or unsharded value: every rank holds the same one
            full[names.get(key, key)] = value
            continue
        flat = torch.cat([sd[key].detach().cpu().reshape(-1) for sd in state_dict_list])
        full[info["_orig_name"]] = flat[: info["_numel"]].reshape(info["_orig_size"]).clone()
    return full


def consolidate_sharded_model_checkpoints(
    ckpt_prefix: str, ckpt_suffix: str = "*.pth", save_path: str = "", save_model: bool = True
) -> tuple[OrderedDict, str | None]:
    """Load every rank's checkpoint `ckpt_prefix + ckpt_suffix` (each a dict with "model": the
    FSDP model's `state_dict()` and "shard_metadata": its `get_shard_metadata()`), consolidate
    them, and save `{"model": full_state_dict}` to `save_path` (default
    `ckpt_prefix + "_consolidated.pth"`) if `save_model`. Returns (state dict, path or None)."""
    pattern = ckpt_prefix + ckpt_suffix
    paths = glob.glob(pattern)
    if not paths:
        raise FileNotFoundError(f"Cannot find any files matching {pattern}.")
    ckpts = sorted(
        ((torch.load(p, map_location="cpu", weights_only=False), p) for p in paths),
        key=lambda c: c[0]["shard_metadata"]["rank"],
    )
    for rank, (ckpt, path) in enumerate(ckpts):
        meta = ckpt["shard_metadata"]
        if meta["world_size"] != len(ckpts) or meta["rank"] != rank:
            raise ValueError(
                f"{path} is rank {meta['rank']} of {meta['world_size']}, but {len(ckpts)} files "
                f"match {pattern}: check for missing or unexpected files"
            )
    full = consolidate_sharded_state_dicts(
        [c["model"] for c, _ in ckpts], ckpts[0][0]["shard_metadata"]
    )
    out = None
    if save_model:
        out = save_path or ckpt_prefix + "_consolidated.pth"
        torch.save({"model": full}, out)
    return full, out
