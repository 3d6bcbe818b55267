"""Text generation: transformers' `model.generate()` on lazyxla beside eager CPU.

A 2-layer Llama built from a config (random weights, no hub), greedy decoding of `--tokens` new
tokens with `cache_implementation="static"`, recorded lazily and with its decoding step compiled
(transformers' `CompileConfig(backend="lazyxla")`: dynamo traces the step once and lazyxla replays
it), and GPT-2 with its default dynamic cache. For each: compiles (`UncachedCompile`) of the first
and of a second call, time to first token and per-token latency (from a call with 1 new token and
one with N), both beside eager's, and whether the tokens equal eager's. `--hidden` takes several
sizes: on a small model eager's per-op cost (~1 us on tiny tensors) is below lazyxla's recording
floor (~4 us), on a larger one the executable's speed decides. See Note [What a value read syncs]
for the policy that keeps the static cache loop at one graph per token.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import transformers
from rich.console import Console
from rich.table import Table

import lazyxla
from lazyxla.debug import metrics

transformers.logging.set_verbosity_error()


def llama(hidden: int, vocab: int) -> torch.nn.Module:
    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").eval()


def gpt2(hidden: int, vocab: int) -> torch.nn.Module:
    cfg = transformers.GPT2Config(
        vocab_size=vocab, n_embd=hidden, n_layer=2, n_head=4, n_positions=256
    )
    return transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa").eval()


def _compiles() -> int:
    return metrics.counter_value("UncachedCompile") or 0


def compile_config() -> transformers.CompileConfig:
    """transformers' automatic compilation of the decoding step, with lazyxla's backend (its
    `_compile_all_devices` flag: transformers compiles on its own only on the devices it knows)."""
    cc = transformers.CompileConfig(backend="lazyxla")
    cc._compile_all_devices = True
    return cc


def generate(
    model: torch.nn.Module, ids: torch.Tensor, n: int, static: bool, compiled: bool = False
) -> torch.Tensor:
    kw = {"max_new_tokens": n, "min_new_tokens": n, "do_sample": False}
    if static:
        kw["cache_implementation"] = "static"
    if compiled:
        kw["compile_config"] = compile_config()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    return out.cpu()


def timed(fn, repeats: int) -> float:
    """Median seconds of `repeats` calls."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def run(
    name: str,
    make,
    static: bool,
    args: argparse.Namespace,
    hidden: int,
    table: Table,
    compiled: bool = False,
) -> None:
    torch.manual_seed(0)
    model = make(hidden, args.vocab)
    ids = torch.randint(0, args.vocab, (1, args.prompt))
    n = args.tokens
    ref = generate(model, ids, n, static)
    e_first = timed(lambda: generate(model, ids, 1, static), args.repeats)
    e_all = timed(lambda: generate(model, ids, n, static), args.repeats)

    dev = lazyxla.device()
    model.to(dev)
    ids_d = ids.to(dev)
    torch._dynamo.reset()  # (each model compiles its own step)
    c0 = _compiles()
    t0 = time.perf_counter()
    out = generate(model, ids_d, n, static, compiled)
    cold = time.perf_counter() - t0
    first_call = _compiles() - c0
    c1 = _compiles()
    generate(model, ids_d, n, static, compiled)
    second_call = _compiles() - c1
    generate(model, ids_d, 1, static, compiled)  # warm the 1-token graphs
    l_first = timed(lambda: generate(model, ids_d, 1, static, compiled), args.repeats)
    l_all = timed(lambda: generate(model, ids_d, n, static, compiled), args.repeats)
    e_tok = (e_all - e_first) / (n - 1)
    l_tok = (l_all - l_first) / (n - 1)
    table.add_row(
        f"{name}, hidden {hidden}",
        f"{first_call} / {second_call}",
        f"{cold:.1f}",
        f"{e_first * 1e3:.1f} / {l_first * 1e3:.1f}",
        f"{e_tok * 1e3:.2f} / {l_tok * 1e3:.2f}",
        f"{l_tok / e_tok:.2f}x",
        "yes" if torch.equal(out, ref) else "NO",
    )
    model.cpu()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--prompt", type=int, default=8)
    p.add_argument("--hidden", default="256,1024", help="model widths, comma-separated")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--models", default="llama,gpt2")
    args = p.parse_args()
    table = Table(
        title=f"generate(): 2 layers, vocab {args.vocab}, prompt {args.prompt}, {args.tokens} new "
        "tokens (eager / lazyxla)"
    )
    for col in (
        "model",
        "compiles 1st / 2nd call",
        "1st call s",
        "first token ms",
        "per token ms",
        "lazy/eager per token",
        "tokens = eager",
    ):
        table.add_column(col, justify="right")
    for hidden in (int(h) for h in args.hidden.split(",")):
        if "llama" in args.models:
            run("llama static cache", llama, True, args, hidden, table)
            run("llama static cache, step compiled", llama, True, args, hidden, table, True)
        if "gpt2" in args.models:
            run("gpt2 dynamic cache", gpt2, False, args, hidden, table)
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
