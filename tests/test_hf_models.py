"""Acceptance: real models nobody here wrote train on lazyxla exactly as in eager.

Four models from `transformers` (Llama, GPT-2, BERT, ViT), built from tiny configs (no weights, no
hub: `HF_HUB_OFFLINE=1` holds), and a ResNet-style convnet written from PyTorch building blocks
with BatchNorm in train and in eval mode. Each case trains 5 AdamW steps from identical initial
weights on identical data, once in eager on the CPU and once on `lazyxla.device()` with one
`lazyxla.sync()` per step, and checks:

- the float32 loss of every step (1e-4 relative) and the gradients of the first step;
- no op ran on the CPU fallback;
- the graph of each step compiles once: after step 2 (step 1 has no optimizer state yet, and its
  gradients are synced separately to be compared) `UncachedCompile` does not grow;
- one graph executes per step, although the SDPA mask builders read the padding mask's values
  mid-step (answered on the host, see below).

Weight tying: `model.to(device)` keeps tied parameters (GPT-2's and BERT's output embedding)
tied on lazyxla, as on CUDA (PyTorch/XLA unties them and needs `model.tie_weights()` after the
move); the test asserts the tying survived the move without re-tying.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import torch.nn.functional as F
import transformers  # a test dependency (pyproject's `test` extra, requirements.lock)
from torch import nn
from util import TINY_DECODER

import lazyxla
from lazyxla.debug import metrics

transformers.logging.set_verbosity_error()

STEPS = 5
RTOL = 1e-4  # float32 losses and first-step gradients
GRAD_ATOL = 1e-6
VOCAB = 96
BATCH, SEQ = 4, 16

Batch = dict[str, torch.Tensor]


def _uncached() -> int:
    return metrics.counter_value("UncachedCompile") or 0


def _executions() -> int:
    return metrics.counter_value("ExecuteComputation") or 0


def _fallback_counts() -> dict[str, int]:
    return {op: metrics.counter_value(f"aten::{op}") or 0 for op in metrics.cpu_fallback_ops()}


# --- the models -------------------------------------------------------------------------------


_DECODER = dict(vocab_size=VOCAB, **TINY_DECODER)  # (Llama, Mixtral)


def _llama(attn: str) -> nn.Module:
    cfg = transformers.LlamaConfig(**_DECODER)
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation=attn)


def _gpt2(attn: str) -> nn.Module:
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation=attn)


def _falcon(attn: str) -> nn.Module:
    """Multi-query attention (one key/value head for every query head, without enable_gqa): with
    a padding mask, SDPA's bool mask on PyTorch's math kernel."""
    cfg = transformers.FalconConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        new_decoder_architecture=False,
        multi_query=True,
        alibi=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    return transformers.FalconForCausalLM._from_config(cfg, attn_implementation=attn)


def _mixtral(attn: str) -> nn.Module:
    """Mixture of experts: transformers counts tokens per expert with an integer `histc` on any
    device but the CPU (lazyxla's meta kernels must not refuse it as the CPU's does)."""
    cfg = transformers.MixtralConfig(**_DECODER, num_local_experts=4, num_experts_per_tok=2)
    return transformers.MixtralForCausalLM._from_config(cfg, attn_implementation=attn)


def _bert(attn: str) -> nn.Module:
    cfg = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertForMaskedLM._from_config(cfg, attn_implementation=attn)


def _vit(attn: str) -> nn.Module:
    cfg = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=5,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.ViTForImageClassification._from_config(cfg, attn_implementation=attn)


def _causal_lm_batches(steps: int, seed: int) -> list[Batch]:
    """Token ids with right padding in half the rows (masked out, labels -100)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=gen)
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        mask[1, SEQ - 5 :] = 0
        mask[3, SEQ - 2 :] = 0
        labels = ids.masked_fill(mask == 0, -100)
        out.append(dict(input_ids=ids, attention_mask=mask, labels=labels))
    return out


def _masked_lm_batches(steps: int, seed: int) -> list[Batch]:
    """BERT's objective: ~25 % of the tokens replaced by [MASK] (id 1) and predicted."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        ids = torch.randint(2, VOCAB, (BATCH, SEQ), generator=gen)
        masked = torch.rand(BATCH, SEQ, generator=gen) < 0.25
        masked[:, 0] = True  # at least one target per row
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        mask[2, SEQ - 4 :] = 0
        masked &= mask.bool()
        out.append(
            dict(
                input_ids=ids.masked_fill(masked, 1),
                attention_mask=mask,
                token_type_ids=torch.zeros(BATCH, SEQ, dtype=torch.long),
                labels=ids.masked_fill(~masked, -100),
            )
        )
    return out


def _image_batches(steps: int, seed: int, classes: int = 5, size: int = 16) -> list[Batch]:
    gen = torch.Generator().manual_seed(seed)
    return [
        dict(
            pixel_values=torch.randn(BATCH * 2, 3, size, size, generator=gen),
            labels=torch.randint(0, classes, (BATCH * 2,), generator=gen),
        )
        for _ in range(steps)
    ]


def _hf_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(**batch).loss


HF_MODELS: dict[str, tuple[Callable[[str], nn.Module], Callable[[int, int], list[Batch]]]] = {
    "llama": (_llama, _causal_lm_batches),
    "gpt2": (_gpt2, _causal_lm_batches),
    "falcon": (_falcon, _causal_lm_batches),
    "mixtral": (_mixtral, _causal_lm_batches),
    "bert": (_bert, _masked_lm_batches),
    "vit": (_vit, _image_batches),
}


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 conv/BN, ReLU, identity or 1x1-conv/BN shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class ResNet(nn.Module):
    """A small ResNet: stem, max-pool, three stages of basic blocks, global average pool, linear."""

    def __init__(self, classes: int = 5, width: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)
        )
        self.pool = nn.MaxPool2d(2)
        self.layers = nn.Sequential(
            BasicBlock(width, width, 1),
            BasicBlock(width, 2 * width, 2),
            BasicBlock(2 * width, 2 * width, 1),
        )
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.pool(self.stem(x))))


def _convnet_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return F.cross_entropy(model(batch["pixel_values"]), batch["labels"])


# --- the comparison ---------------------------------------------------------------------------


def _to(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device) for k, v in batch.items()}


def _compare_training(
    cpu_model: nn.Module,
    batches: list[Batch],
    loss_fn: Callable[[nn.Module, Batch], torch.Tensor],
    train_mode: bool = True,
) -> tuple[nn.Module, nn.Module]:
    """Train copies of `cpu_model` on the CPU and on lazyxla; assert the checks listed above."""
    dev = lazyxla.device()
    dev_model = copy.deepcopy(cpu_model).to(dev)  # ties survive: see the module docstring
    # named_parameters() lists a tied parameter once: equal names mean the same tying.
    assert [n for n, _ in dev_model.named_parameters()] == [
        n for n, _ in cpu_model.named_parameters()
    ]
    cpu_model.train(train_mode)
    dev_model.train(train_mode)
    kw = dict(lr=1e-3, weight_decay=1e-2)
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), **kw)
    dev_opt = torch.optim.AdamW(dev_model.parameters(), **kw)

    cpu_losses = []
    for i, batch in enumerate(batches):
        cpu_opt.zero_grad()
        loss = loss_fn(cpu_model, batch)
        loss.backward()
        if i == 0:
            cpu_grads = {n: p.grad.clone() for n, p in cpu_model.named_parameters()}
        cpu_opt.step()
        cpu_losses.append(loss.item())

    fallbacks_before = _fallback_counts()
    dev_losses, compiles, executions = [], [], []
    for i, batch in enumerate(batches):
        executed = _executions()
        dev_opt.zero_grad()
        loss = loss_fn(dev_model, _to(batch, dev))
        loss.backward()
        if i == 0:
            lazyxla.sync()  # one graph for all the gradients, read below without compiling
            for name, p in dev_model.named_parameters():
                assert p.grad is not None, f"{name}: no gradient on lazyxla"
                torch.testing.assert_close(
                    p.grad.cpu(), cpu_grads[name], rtol=RTOL, atol=GRAD_ATOL, msg=name
                )
        dev_opt.step()
        lazyxla.sync()
        dev_losses.append(loss.detach())
        compiles.append(_uncached())
        executions.append(_executions() - executed)
    dev_losses = [float(v.item()) for v in dev_losses]

    for i, (a, b) in enumerate(zip(cpu_losses, dev_losses, strict=True)):
        assert b == pytest.approx(a, rel=RTOL, abs=0.0), f"step {i}: lazyxla {b} vs eager {a}"
    assert compiles[-1] == compiles[1], f"UncachedCompile grew after step 2: {compiles}"
    # One graph per step (two in step 1: its gradients are synced to be compared).
    assert executions == [2] + [1] * (len(batches) - 1), executions
    after = _fallback_counts()
    fallbacks = [op for op, n in after.items() if n > fallbacks_before.get(op, 0)]
    assert fallbacks == [], f"ops ran on the CPU fallback: {fallbacks}"
    return cpu_model, dev_model


# transformers' SDPA mask builders branch on the padding mask's values to drop the mask when nothing
# is padded (`_ignore_causal_mask_sdpa`: `fast_all(padding_mask)`, then `fast_all` of its two
# halves; `_ignore_bidirectional_mask_sdpa`: `padding_mask.all()`), mid-step, where PyTorch/XLA
# executes a small graph for each. lazyxla answers these integer reads on the host and leaves the
# step pending (Note [Small integer reads on the host]): every model runs one graph per step.


@pytest.mark.parametrize(
    "name,attn",
    [
        ("llama", "sdpa"),
        ("llama", "eager"),
        ("gpt2", "sdpa"),
        ("bert", "sdpa"),
        ("vit", "sdpa"),
        ("falcon", "sdpa"),
        ("mixtral", "sdpa"),
    ],
)
def test_transformers_model_trains_like_eager(name: str, attn: str) -> None:
    make_model, make_batches = HF_MODELS[name]
    torch.manual_seed(0)
    model = make_model(attn)
    assert model.config._attn_implementation == attn
    _compare_training(model, make_batches(STEPS, seed=7), _hf_loss)


@pytest.mark.parametrize("bn_mode", ["train", "eval"])
def test_resnet_trains_like_eager(bn_mode: str) -> None:
    """BatchNorm in train mode (batch statistics, running stats updated) or eval mode (frozen)."""
    torch.manual_seed(0)
    model = ResNet()
    if bn_mode == "eval":  # non-trivial running statistics to normalize with
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    batches = _image_batches(STEPS + 1, seed=11)
    cpu_model, dev_model = _compare_training(
        model, batches[:STEPS], _convnet_loss, train_mode=bn_mode == "train"
    )
    for (name, b_cpu), (_, b_dev) in zip(
        cpu_model.named_buffers(), dev_model.named_buffers(), strict=True
    ):
        torch.testing.assert_close(b_dev.cpu(), b_cpu, rtol=RTOL, atol=1e-5, msg=name)
    # Inference with the (updated) running statistics, on a batch neither model has seen.
    cpu_model.eval()
    dev_model.eval()
    before = _fallback_counts()
    with torch.no_grad():
        want = cpu_model(batches[-1]["pixel_values"])
        got = dev_model(batches[-1]["pixel_values"].to(lazyxla.device())).cpu()
    torch.testing.assert_close(got, want, rtol=RTOL, atol=1e-5)
    assert _fallback_counts() == before
