"""Small models in plain PyTorch, used by the demo, the benchmarks and the acceptance tests.

Nothing here knows about lazyxla: the same module runs in eager on CPU, under `torch.compile`, or
on `lazyxla.device()` after `model.to(device)`. Initialization is deterministic given
`torch.manual_seed`.

- `MLP`: 4 x Linear(512, 512) with ReLU between them (the step benchmark's model).
- `Decoder`: a decoder-only transformer: token embedding, pre-norm blocks of RMSNorm,
  grouped-query causal attention with optional rotary embeddings (explicit matmul + softmax, not
  SDPA) and a SwiGLU MLP, a final RMSNorm and a tied or untied lm_head.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MLP", "Attention", "Decoder", "DecoderConfig", "DecoderBlock", "SwiGLU"]


class MLP(nn.Module):
    """`depth` Linear(width, width) layers with `activation` (ReLU by default) between them
    (4 x 512 by default)."""

    def __init__(
        self,
        width: int = 512,
        depth: int = 4,
        activation: Callable[[torch.Tensor], torch.Tensor] = F.relu,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the layers, with the activation after all but the last."""
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.activation(x)
        return x


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Hyper-parameters of `Decoder`."""

    vocab_size: int = 64
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_dim: int | None = None  # None: about 8/3 * dim, rounded up to a multiple of 16
    max_seq_len: int = 64
    rope: bool = True
    rope_theta: float = 10000.0
    tie_embeddings: bool = True
    norm_eps: float = 1e-6
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim} is not a multiple of n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads")
        if self.rope and self.head_dim % 2:
            raise ValueError("rotary embeddings need an even head_dim")

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.dim // self.n_heads

    @property
    def hidden_dim(self) -> int:
        """Width of the SwiGLU hidden layer."""
        if self.ffn_dim is not None:
            return self.ffn_dim
        return 16 * math.ceil(8 * self.dim / 3 / 16)


def rotary_tables(
    head_dim: int, max_seq_len: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(cos, sin)` of shape `(max_seq_len, head_dim)` for the rotate-half form of RoPE."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` (..., T, head_dim) by position; `cos`/`sin` are (T, head_dim)."""
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    """Grouped-query causal self-attention, written as explicit matmul + masked softmax."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.n_kv_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def _repeat_kv(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n_kv, T, hd) → (B, n_heads, T, hd): each kv head serves n_heads / n_kv queries."""
        rep = self.n_heads // self.n_kv_heads
        if rep == 1:
            return x
        b, h, t, d = x.shape
        return x[:, :, None].expand(b, h, rep, t, d).reshape(b, h * rep, t, d)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        """`x` (B, T, dim); `mask` (T, T) bool, True where attention is *not* allowed."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            q = apply_rotary(q, cos, sin)
            k = apply_rotary(k, cos, sin)
        k = self._repeat_kv(k)
        v = self._repeat_kv(v)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        scores = scores.masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v)  # (B, H, T, hd)
        out = out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim)
        return self.o_proj(out)


class SwiGLU(nn.Module):
    """`down(silu(gate(x)) * up(x))`."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the gated MLP."""
        return self.down(F.silu(self.gate(x)) * self.up(x))


class DecoderBlock(nn.Module):
    """Pre-norm residual block: `x + attn(norm(x))`, then `x + mlp(norm(x))`."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg.dim, cfg.hidden_dim)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        """Apply attention then the MLP, each with a residual connection."""
        x = x + self.attn(self.attn_norm(x), mask, rope)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    """A decoder-only transformer language model; `forward(tokens)` returns logits (B, T, vocab)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        # Tied: the logits reuse `embed.weight` in forward rather than sharing one Parameter between
        # two modules, a tie that `model.to(device)` breaks on PyTorch/XLA (lazyxla keeps it).
        self.lm_head = (
            None if cfg.tie_embeddings else nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        )
        mask = torch.ones(cfg.max_seq_len, cfg.max_seq_len, dtype=torch.bool).triu(1)
        self.register_buffer("causal_mask", mask, persistent=False)
        if cfg.rope:
            cos, sin = rotary_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 style init: N(0, init_std), output projections scaled by 1/sqrt(2 * n_layers)."""
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:  # RMSNorm weights
                nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down.weight")):
                nn.init.normal_(p, 0.0, out_std)
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of the next token at every position of `tokens` (B, T)."""
        t = tokens.shape[1]
        if t > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {t} exceeds max_seq_len={self.cfg.max_seq_len}")
        mask = self.causal_mask[:t, :t]
        rope = (self.rope_cos[:t], self.rope_sin[:t]) if self.cfg.rope else None
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, mask, rope)
        x = self.norm(x)
        if self.lm_head is None:
            return F.linear(x, self.embed.weight)
        return self.lm_head(x)

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of `forward(tokens)` against `targets` (B, T)."""
        logits = self(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def num_parameters(self) -> int:
        """Number of parameters (a tied lm_head has none of its own)."""
        return sum(p.numel() for p in self.parameters())


# The seed notebook's 2-D sharding plan for this decoder on an (fsdp, tensor) mesh, by parameter
# name (its embed_tokens / gate_proj / up_proj / down_proj are embed / gate / up / down here).
SEED_SHARDING_PLAN: dict[str, tuple] = {
    "embed.": ("fsdp", "tensor"),
    "q_proj.": ("tensor", "fsdp"),
    "k_proj.": ("tensor", "fsdp"),
    "v_proj.": ("tensor", "fsdp"),
    "o_proj.": ("fsdp", "tensor"),
    "gate.": ("tensor", "fsdp"),
    "up.": ("tensor", "fsdp"),
    "down.": ("fsdp", "tensor"),
    "lm_head.": (("tensor", "fsdp"), None),
}


def seed_partition_spec(param_name: str) -> tuple | None:
    """The seed plan's partition spec for a `Decoder` parameter, or None (left replicated)."""
    for key, spec in SEED_SHARDING_PLAN.items():
        if key in param_name:
            return spec
    return None
