"""bf16 autocast against fp32 on this machine: one demo-sized training step, the two precisions alternating.

``python -m benchmarks.bench_precision [--steps 6] [--json FILE]`` (``--quick``: tiny dims, a smoke run)

The model and batch are the demo's (``train/recipes/libreoffice_demo.yaml``: d 256, 3-3 layers, RK2-gated
encoder, vocabulary 8k; 48 sentences of 24 tokens, about its 2K-token batches). It records what
:mod:`ode_transformer.precision` decides for this CPU, so a figure says whether bf16 ran natively or emulated. To see a
machine with native bf16 behave like an AVX2-only one, run it with ``ONEDNN_MAX_CPU_ISA=AVX2
ATEN_CPU_CAPABILITY=avx2`` set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch

from benchmarks import common
from ode_transformer.precision import choose_precision, cpu_capability

DEMO_DIMS = common.Dims(
    d_model=256, ffn_dim=1024, heads=4, encoder_layers=3, decoder_layers=3, vocab_size=8000
)
RESTRICTIONS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")


def measure(steps: int, batch: int = 48, length: int = 24, dims: common.Dims = DEMO_DIMS) -> dict:
    """Median seconds per training step in fp32 and in bf16 autocast, the precisions alternating step by step
    after one warm-up step each."""
    torch.manual_seed(0)
    model = common.build_model("rk2_gated", dims).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    data = common.make_batch(batch, length, length, dims.vocab_size)
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for round_ in range(steps + 1):
        for dtype in times:
            seconds = common.train_step(model, optimizer, data, dtype)
            if round_:  # the first round warms up both
                times[dtype].append(seconds)
    medians = {dtype: statistics.median(values) for dtype, values in times.items()}
    return {
        "seconds_per_step": medians,
        "all_seconds": times,
        "bf16_over_fp32_time": medians["bf16"] / medians["fp32"],
        "batch": {"sentences": batch, "source_tokens": length, "target_tokens": length},
        "dims": dims.as_dict(),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_precision", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--steps", type=int, default=6, help="timed steps per precision")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--quick", action="store_true", help="tiny dims and one step: a smoke run")
    args = parser.parse_args(argv)
    choice = choose_precision("cpu")
    results = {
        "machine": common.machine_info(),
        "cpu_capability": cpu_capability(),
        "restrictions": {name: os.environ.get(name) for name in RESTRICTIONS},
        "auto_choice": choice.as_dict(),
        **(measure(1, batch=4, length=8, dims=common.TINY_DIMS) if args.quick else measure(args.steps)),
    }
    seconds = results["seconds_per_step"]
    print(
        f"{results['machine']['cpu_model']} ({results['cpu_capability']}), {torch.get_num_threads()} threads: "
        f"fp32 {seconds['fp32']:.2f} s, bf16 {seconds['bf16']:.2f} s per step "
        f"(bf16 / fp32 = {results['bf16_over_fp32_time']:.1f}x); --precision auto -> {choice.precision}: "
        f"{choice.reason}"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
