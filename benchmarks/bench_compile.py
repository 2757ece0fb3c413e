"""torch.compile against eager, side by side in one run: training step time and greedy decoding speed of the
residual and the RK4 model (benchmarks/common.py's variants, plain stacking, as against Marian).

    .venv/bin/python -m benchmarks.bench_compile            # d 512, 6-6 (base dims); ~10 min on 2 cores
    .venv/bin/python -m benchmarks.bench_compile --quick    # tiny dims, a smoke run

Writes <out-dir>/compile-<time stamp>.json and <out-dir>/compile.json/.md (the newest). Training: forward +
backward + Adam on a fixed batch (fp32, dropout on); the compiled model is `torch.compile(model)` (inductor),
warmed up (compiled) before timing. Decoding: greedy `generate` with the static cache, whose decoding step is
one graph (tests/test_compile.py); compiled = the model's forward compiled with `fullgraph=True`. Eager and
compiled runs of one model alternate, and every time is the minimum over the repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.common import BASE_DIMS, TINY_DIMS

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("residual", "rk4")
FULL = {"dims": BASE_DIMS, "batch": 16, "src_len": 32, "tgt_len": 32, "new_tokens": 32, "reps": 5}
QUICK = {"dims": TINY_DIMS, "batch": 2, "src_len": 8, "tgt_len": 8, "new_tokens": 4, "reps": 1}


def _minimum(function, reps: int) -> float:
    times = []
    for _ in range(reps):
        begin = time.perf_counter()
        function()
        times.append(time.perf_counter() - begin)
    return min(times)


def bench_training(name: str, setup: dict) -> dict:
    """Seconds per training step, eager and compiled, from the same initial weights and batch."""
    torch.manual_seed(0)
    model = common.build_model(name, setup["dims"]).train()
    batch = common.make_batch(setup["batch"], setup["src_len"], setup["tgt_len"], setup["dims"].vocab_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    compiled = torch.compile(model)
    begin = time.perf_counter()
    for _ in range(2):  # the first call compiles, the second settles the optimizer state
        common.train_step(compiled, optimizer, batch, "fp32")
    compile_s = time.perf_counter() - begin
    eager_s, compiled_s = [], []
    for _ in range(setup["reps"]):  # alternate, so drift hits both alike
        eager_s.append(common.train_step(model, optimizer, batch, "fp32"))
        compiled_s.append(common.train_step(compiled, optimizer, batch, "fp32"))
    return {
        "eager_step_s": min(eager_s),
        "compiled_step_s": min(compiled_s),
        "first_compiled_calls_s": compile_s,
    }


def bench_decoding(name: str, setup: dict) -> dict:
    """Greedy tokens per second with the static cache, eager and with the forward compiled."""
    torch.manual_seed(0)
    model = common.build_model(name, setup["dims"]).eval()
    batch = common.make_batch(setup["batch"], setup["src_len"], 1, setup["dims"].vocab_size)
    kwargs = {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "max_new_tokens": setup["new_tokens"],
        "min_new_tokens": setup["new_tokens"],
        "num_beams": 1,
        "do_sample": False,
        "cache_implementation": "static",
        "disable_compile": True,  # transformers' own auto-compile stays off: we choose what is compiled
    }
    eager_forward = model.forward
    compiled_forward = torch.compile(model.forward, fullgraph=True)

    def generate(forward):
        model.forward = forward
        with torch.no_grad():
            return model.generate(**kwargs)

    begin = time.perf_counter()
    same = torch.equal(generate(compiled_forward), generate(eager_forward))
    compile_s = time.perf_counter() - begin
    tokens = setup["batch"] * setup["new_tokens"]
    eager_s, compiled_s = [], []
    for _ in range(setup["reps"]):
        eager_s.append(_minimum(lambda: generate(eager_forward), 1))
        compiled_s.append(_minimum(lambda: generate(compiled_forward), 1))
    model.forward = eager_forward
    return {
        "eager_tokens_per_s": tokens / min(eager_s),
        "compiled_tokens_per_s": tokens / min(compiled_s),
        "same_tokens": same,
        "first_calls_s": compile_s,
    }


def markdown(results: dict) -> str:
    lines = [
        "# torch.compile vs eager",
        "",
        f"`{results['command']}` on {results['machine']['cpu_model']}, {results['threads']} threads, "
        f"torch {results['torch']}, dims {results['dims']}.",
        "",
        "| model | train step eager (s) | compiled (s) | compiled speed-up | greedy tok/s eager | compiled | speed-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in results["models"].items():
        train, decode = row["training"], row["decoding"]
        lines.append(
            f"| {name} | {train['eager_step_s']:.3f} | {train['compiled_step_s']:.3f} | "
            f"{train['eager_step_s'] / train['compiled_step_s']:.2f}x | {decode['eager_tokens_per_s']:.0f} | "
            f"{decode['compiled_tokens_per_s']:.0f} | "
            f"{decode['compiled_tokens_per_s'] / decode['eager_tokens_per_s']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_compile", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="tiny dims, a smoke run")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    setup = QUICK if args.quick else FULL
    results = {
        "command": "python -m benchmarks.bench_compile" + (" --quick" if args.quick else ""),
        "machine": common.machine_info(),
        "threads": args.threads,
        "torch": torch.__version__,
        "dims": setup["dims"]._asdict() if hasattr(setup["dims"], "_asdict") else str(setup["dims"]),
        "setup": {key: value for key, value in setup.items() if key != "dims"},
        "models": {
            name: {"training": bench_training(name, setup), "decoding": bench_decoding(name, setup)}
            for name in MODELS
        },
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    text = json.dumps(results, indent=1) + "\n"
    (args.out_dir / f"compile-{stamp}.json").write_text(text)
    (args.out_dir / "compile.json").write_text(text)
    (args.out_dir / "compile.md").write_text(markdown(results))
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
