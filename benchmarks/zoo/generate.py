"""Greedy decoding with the model's ``forward`` compiled, as people compile decoders.

    python -m benchmarks.zoo.generate --models hf_mistral,hf_gemma2 --out DIR

Each decoder of the zoo's lists (its config, a causal-LM head or, for an
encoder-decoder, a seq2seq-LM head, random weights) generates ``--tokens`` tokens greedily from 2x16 prompt tokens, ``--rounds``
times, with ``model.forward`` compiled by each column's backend; eager is the
reference. A decoding step is a graph of its own, with the cache's length as a
symbolic size from the third step on, and some caches (sliding windows) pass a
Python int besides: what the zoo's one-shot calls never show. Each column runs
in a process of its own with caches of its own (the first generate is a cold
start; a decision cached by an earlier run would hide what this one decides); rows
(the machine, then per column the same tokens as eager or not, the first
generate with its compiles, the median of the later ones) go to
``DIR/generate.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..process import child_env
from .in_turn import append_row, model_parser
from .run import machine

COLUMNS = ("eager", "inductor", "auto")
PROMPT = (2, 16)


def _decoder(name: str, device: str, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.Tensor]:
    from .models import EncoderDecoder, _torchvision_without_its_kernels
    from .wider import EVERY_MODEL

    _torchvision_without_its_kernels()
    import transformers

    base, _ = EVERY_MODEL[name].build()
    if isinstance(base, EncoderDecoder):
        base = base.model
    config = base.config
    torch.manual_seed(0)
    if config.is_encoder_decoder:
        head = transformers.AutoModelForSeq2SeqLM
        # T5's configs leave the decoder's first token to the tokenizer's pad id.
        if getattr(config, "decoder_start_token_id", None) is None:
            config.decoder_start_token_id = config.pad_token_id or 0
    else:
        head = transformers.AutoModelForCausalLM
    model = head.from_config(config).eval().to(device, dtype)
    high = min(config.vocab_size, 1000)
    prompt = torch.randint(3, high, PROMPT, generator=torch.Generator().manual_seed(0)).to(device)
    return model, prompt


def one_column(
    name: str, column: str, device: str, dtype: torch.dtype, tokens: int, rounds: int, cache: str = "dynamic"
) -> dict:
    """``name`` decoded under ``column`` in this process: tokens against eager's, times.
    ``cache``: transformers' growing cache, or ``static`` (preallocated, updated in place)."""
    model, prompt = _decoder(name, device, dtype)
    options: dict[str, Any] = {
        "max_new_tokens": tokens,
        "min_new_tokens": tokens,
        "do_sample": False,
        "pad_token_id": 0,
    }
    if cache == "static":
        options["cache_implementation"] = "static"
    with torch.no_grad():
        expected = model.generate(prompt, **options)
        if column == "reduce-overhead":
            model.forward = torch.compile(model.forward, mode="reduce-overhead")
        elif column != "eager":
            model.forward = torch.compile(model.forward, backend=column)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        seconds = []
        for _ in range(rounds):
            sync()
            start = time.perf_counter()
            got = model.generate(prompt, **options)
            sync()
            seconds.append(time.perf_counter() - start)
    later = seconds[2:] or seconds[1:]
    return {
        "model": name,
        "column": column,
        "cache": cache,
        "same_tokens": bool(torch.equal(got, expected)),
        "first_s": round(seconds[0], 2),
        "median_ms": round(1e3 * statistics.median(later), 2),
        "per_token_us": round(1e6 * statistics.median(later) / tokens, 1),
    }


def _in_own_process(name: str, column: str, args: Any) -> dict:
    command = [
        sys.executable, "-m", "benchmarks.zoo.generate", "--one", column, "--models", name,
        "--device", args.device, "--dtype", args.dtype,
        "--tokens", str(args.tokens), "--rounds", str(args.rounds), "--cache", args.cache,
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix=f"generate-{name}-{column}-") as caches:
        env = child_env(
            TORCHINDUCTOR_CACHE_DIR=os.path.join(caches, "inductor"),
            DISPATCH_CACHE_DIR=os.path.join(caches, "dispatch"),
        )
        done = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        error = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"model": name, "column": column, "error": error[:300]}
    return json.loads(lines[-1])


def main() -> None:
    parser = model_parser(__doc__.splitlines()[0])
    parser.set_defaults(device="cpu", dtype="float32")
    parser.add_argument("--columns", default=",".join(COLUMNS))
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cache", default="dynamic", choices=["dynamic", "static"])
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the column a child process runs
    args = parser.parse_args()
    if args.one:
        dtype = getattr(torch, args.dtype)
        row = one_column(args.models, args.one, args.device, dtype, args.tokens, args.rounds, args.cache)
        print(json.dumps(row), flush=True)
        return
    out = Path(args.out) / "generate.jsonl"
    append_row(out, {"machine": machine(args.device)})
    for name in args.models.split(","):
        for column in args.columns.split(","):
            append_row(
                out, {**_in_own_process(name, column, args), "device": args.device, "dtype": args.dtype}
            )


if __name__ == "__main__":
    main()
