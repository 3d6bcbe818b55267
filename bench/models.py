"""Per-step training time of four `transformers` models: eager, lazyxla, and lazyxla's limit.

Llama (causal LM), GPT-2 (causal LM), BERT (masked LM) and ViT (image classification), built from
small configs (no weights: `HF_HUB_OFFLINE=1` holds), SDPA attention, dropout off, AdamW. A step is
`zero_grad; loss; backward; optimizer.step` on one batch resident on the device; the text batches
carry a padding mask, as tokenized batches do.

- eager: PyTorch on the CPU.
- lazyxla: record the step, `lazyxla.sync(wait=True)`: tracing + cache lookup + execution. This
  includes the padding-mask reads of transformers' SDPA mask builders (answered on the host,
  Note [Small integer reads on the host]).
- limit: the cached jitted executable of the step's graph, called directly on the same inputs
  (`exe(cap.data, cap.scalars)`): lazyxla with zero tracing, zero bookkeeping and no mid-step reads.

Each figure is the median over timed steps, after warm-up (which includes every compile). The
modes are timed in interleaved rounds, so that a change of load on a shared machine hits them all.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax
import torch
import transformers
from _timing import interleaved_ms, warm
from rich.console import Console
from rich.table import Table

import lazyxla
from lazyxla._src import graph
from lazyxla.debug import metrics

transformers.logging.set_verbosity_error()

VOCAB, BATCH, SEQ, HIDDEN, LAYERS, HEADS = 512, 8, 64, 64, 2, 4
IMAGE, PATCH, CLASSES = 32, 4, 10

Batch = dict[str, torch.Tensor]


def _llama() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=4 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS // 2,
        max_position_embeddings=SEQ,
    )
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")


def _gpt2() -> torch.nn.Module:
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_embd=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        n_positions=SEQ,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa")


def _bert() -> torch.nn.Module:
    cfg = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=4 * HIDDEN,
        max_position_embeddings=SEQ,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertForMaskedLM._from_config(cfg, attn_implementation="sdpa")


def _vit() -> torch.nn.Module:
    cfg = transformers.ViTConfig(
        image_size=IMAGE,
        patch_size=PATCH,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=4 * HIDDEN,
        num_labels=CLASSES,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.ViTForImageClassification._from_config(cfg, attn_implementation="sdpa")


def _text_batch(gen: torch.Generator, mlm: bool) -> Batch:
    ids = torch.randint(2, VOCAB, (BATCH, SEQ), generator=gen)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1::2, SEQ - SEQ // 4 :] = 0  # half the rows padded
    if not mlm:
        return dict(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
    masked = (torch.rand(BATCH, SEQ, generator=gen) < 0.15) & mask.bool()
    return dict(
        input_ids=ids.masked_fill(masked, 1),
        attention_mask=mask,
        labels=ids.masked_fill(~masked, -100),
    )


def _image_batch(gen: torch.Generator) -> Batch:
    return dict(
        pixel_values=torch.randn(BATCH, 3, IMAGE, IMAGE, generator=gen),
        labels=torch.randint(0, CLASSES, (BATCH,), generator=gen),
    )


def workloads() -> dict[str, tuple[Callable[[], torch.nn.Module], Callable[[], Batch]]]:
    gen = lambda: torch.Generator().manual_seed(0)
    text = f"L{LAYERS} d{HIDDEN} vocab {VOCAB}, batch {BATCH}x{SEQ}"
    return {
        f"Llama ({text})": (_llama, lambda: _text_batch(gen(), mlm=False)),
        f"GPT-2 ({text})": (_gpt2, lambda: _text_batch(gen(), mlm=False)),
        f"BERT MLM ({text})": (_bert, lambda: _text_batch(gen(), mlm=True)),
        f"ViT (L{LAYERS} d{HIDDEN}, batch {BATCH} x 3x{IMAGE}x{IMAGE})": (
            _vit,
            lambda: _image_batch(gen()),
        ),
    }


class Workload:
    """A model, its AdamW and one batch, on a device, with a `step()` closure."""

    def __init__(self, make_model, make_batch, device) -> None:
        torch.manual_seed(0)
        self.model = make_model().to(device)  # tied weights stay tied on lazyxla
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.batch = {k: v.to(device) for k, v in make_batch().items()}

    def step(self) -> torch.Tensor:
        self.opt.zero_grad()
        loss = self.model(**self.batch).loss
        loss.backward()
        self.opt.step()
        return loss.detach()


EAGER, LAZY, LIMIT = "eager (CPU)", "lazyxla (record + sync + wait)", "limit (cached executable)"


def prepare(make_model, make_batch, warmup: int) -> tuple[dict, dict]:
    """Warm up every mode of one workload; return `({mode: step fn}, {mode: note})`."""
    eager = Workload(make_model, make_batch, torch.device("cpu"))
    warm(eager.step, warmup)

    lazy = Workload(make_model, make_batch, lazyxla.device())

    def lazy_step() -> None:
        lazy.step()
        lazyxla.sync(wait=True)

    compiles0 = metrics.counter_value("UncachedCompile") or 0
    runs0 = metrics.counter_value("ExecuteComputation") or 0
    warm_s = warm(lazy_step, warmup)
    compiles = (metrics.counter_value("UncachedCompile") or 0) - compiles0
    runs = (metrics.counter_value("ExecuteComputation") or 0) - runs0
    fallbacks = metrics.executed_fallback_ops()

    # The limit: record one more step, capture its pending graph (the same graph as every warm
    # step, so the executable comes from the cache), then finish the step with a sync.
    lazy.step()
    cap = graph.Capture(graph.pending_states(None))
    before = metrics.counter_value("UncachedCompile") or 0
    exe = graph.compile_capture(cap)
    assert (metrics.counter_value("UncachedCompile") or 0) == before, "limit graph not cached"
    scalars = cap.args()[-1]  # as an execution passes them (Note [Scalars seen again])
    lazyxla.sync(wait=True)

    modes = {
        EAGER: eager.step,
        LAZY: lazy_step,
        LIMIT: lambda: jax.block_until_ready(exe(cap.data, scalars)),
    }
    notes = {
        EAGER: "",
        LAZY: f"{compiles} compiles, {runs / warmup:.0f} graphs/step in warm-up ({warm_s:.0f} s)"
        + (f"; CPU fallback: {', '.join(fallbacks)}" if fallbacks else ""),
        LIMIT: "exe(cap.data, cap.scalars)",
    }
    return modes, notes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=4)
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="intra-op threads of eager PyTorch (default 1: on a shared 2-core machine, OpenMP "
        "with 2 threads stalls for ~1 s at a time whenever another process takes a core)",
    )
    parser.add_argument("--only", help="run only the workloads whose name contains this")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    console = Console()
    n = args.rounds * args.per_round

    for name, (make_model, make_batch) in workloads().items():
        if args.only and args.only.lower() not in name.lower():
            continue
        with console.status(f"{name}: warming up (compiles)"):
            modes, notes = prepare(make_model, make_batch, args.warmup)
        with console.status(f"{name}: timing"):
            ms = interleaved_ms(modes, args.rounds, args.per_round)
        table = Table(
            title=f"{name}, AdamW: median of {n} steps per mode ({args.rounds} interleaved "
            f"rounds), after {args.warmup} warm-up; eager on {args.torch_threads} thread(s)"
        )
        table.add_column("mode")
        table.add_column("ms / step", justify="right")
        table.add_column("vs eager", justify="right")
        table.add_column("vs limit", justify="right")
        for mode, v in ms.items():
            table.add_row(mode, f"{v:.2f}", f"{v / ms[EAGER]:.2f}x", f"{v / ms[LIMIT]:.2f}x")
        console.print(table)
        console.print(f"lazyxla: {notes[LAZY]}\n")


if __name__ == "__main__":
    main()
