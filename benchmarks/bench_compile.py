"""torch.compile against eager, side by side in one run: training step time and greedy decoding speed of the
residual and the RK4 model (benchmarks/common.py's variants, plain stacking, as against Marian).

    .venv/bin/python -m benchmarks.bench_compile            # d 512, 6-6 (base dims)
    .venv/bin/python -m benchmarks.bench_compile --quick    # tiny dims, a smoke run
    .venv/bin/python -m benchmarks.bench_compile --dropout  # where compiled CPU training loses

Writes <out-dir>/compile-<time stamp>.json and <out-dir>/compile.json/.md (the newest). Training: forward +
backward + Adam on a fixed batch (fp32, dropout on); the compiled model is `torch.compile(model)` (inductor),
warmed up (compiled) before timing. Decoding: greedy `generate` with the static cache, whose decoding step is
one graph (tests/test_compile.py); compiled = the model's forward compiled with `fullgraph=True`. Eager and
compiled runs of one model alternate, and every time is the minimum over the repetitions.

``--dropout`` times only the residual model's training step, eager and compiled, three ways: dropout 0.1 (under
compile, inductor generates the random numbers inside its kernels), dropout 0.1 with inductor's
``fallback_random`` (aten's generator, as eager ``nnf.dropout``), and dropout 0 (no random numbers at all). It
writes compile-dropout-<time stamp>.json and compile-dropout.json/.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.common import BASE_DIMS, TINY_DIMS
from modeling_ode.compat import compiled_graph_count, inductor_fallback_random, reset_compiled_graphs

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("residual", "rk4")
FULL = {"dims": BASE_DIMS, "batch": 16, "src_len": 32, "tgt_len": 32, "new_tokens": 32, "reps": 5}
# One layer a side: a smoke run needs no more, and inductor's compile time grows with the layers.
QUICK_DIMS = dataclasses.replace(TINY_DIMS, encoder_layers=1, decoder_layers=1)
QUICK = {"dims": QUICK_DIMS, "batch": 2, "src_len": 8, "tgt_len": 8, "new_tokens": 4, "reps": 1}


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
    reset_compiled_graphs()  # compile afresh: a new model of a class compiled before would reuse its graphs
    graphs_before = compiled_graph_count()
    compiled = torch.compile(model)
    begin = time.perf_counter()
    for _ in range(2):  # the first call compiles, the second settles the optimizer state
        common.train_step(compiled, optimizer, batch, "fp32")
    compile_s = time.perf_counter() - begin
    compiled_graphs = compiled_graph_count() - graphs_before
    eager_s, compiled_s = [], []
    for _ in range(setup["reps"]):  # alternate, so drift hits both alike
        eager_s.append(common.train_step(model, optimizer, batch, "fp32"))
        compiled_s.append(common.train_step(compiled, optimizer, batch, "fp32"))
    return {
        "eager_step_s": min(eager_s),
        "compiled_step_s": min(compiled_s),
        "first_compiled_calls_s": compile_s,
        "compiled_graphs": compiled_graphs,
    }


DROPOUT_PROBE = (  # label, dropout, inductor's fallback_random
    ("dropout 0.1", 0.1, False),
    ("dropout 0.1, fallback_random", 0.1, True),
    ("dropout 0", 0.0, False),
)


def bench_dropout(setup: dict) -> dict:
    """The residual model's training step, eager and compiled, for each row of DROPOUT_PROBE."""
    rows = {}
    for label, dropout, fallback_random in DROPOUT_PROBE:
        dims = dataclasses.replace(setup["dims"], dropout=dropout)
        with inductor_fallback_random(fallback_random):  # read when the row compiles
            rows[label] = bench_training("residual", {**setup, "dims": dims})
    return rows


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


def _header(results: dict, title: str) -> list[str]:
    return [
        f"# {title}",
        "",
        f"`{results['command']}` on {results['machine']['cpu_model']}, {results['threads']} threads, "
        f"torch {results['torch']}, dims {results['dims']}.",
        "",
    ]


def dropout_markdown(results: dict) -> str:
    lines = _header(
        results, "torch.compile vs eager: what dropout costs a compiled CPU training step (residual)"
    )
    lines += ["| dropout | train step eager (s) | compiled (s) | compiled speed-up |", "|---|---|---|---|"]
    for label, train in results["dropout"].items():
        lines.append(
            f"| {label} | {train['eager_step_s']:.3f} | {train['compiled_step_s']:.3f} | "
            f"{train['eager_step_s'] / train['compiled_step_s']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def markdown(results: dict) -> str:
    lines = _header(results, "torch.compile vs eager") + [
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
    parser.add_argument("--dropout", action="store_true", help="only the dropout probe (module docstring)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    setup = QUICK if args.quick else FULL
    flags = "".join(f" --{name}" for name in ("quick", "dropout") if getattr(args, name))
    results = {
        "command": "python -m benchmarks.bench_compile" + flags,
        "machine": common.machine_info(),
        "threads": args.threads,
        "torch": torch.__version__,
        "dims": setup["dims"].as_dict(),
        "setup": {key: value for key, value in setup.items() if key != "dims"},
    }
    if args.dropout:
        results["dropout"] = bench_dropout(setup)
        name, report = "compile-dropout", dropout_markdown(results)
    else:
        results["models"] = {
            name: {"training": bench_training(name, setup), "decoding": bench_decoding(name, setup)}
            for name in MODELS
        }
        name, report = "compile", markdown(results)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=1) + "\n"
    (args.out_dir / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(text)
    (args.out_dir / f"{name}.json").write_text(text)
    (args.out_dir / f"{name}.md").write_text(report)
    print(report)
    return results


if __name__ == "__main__":
    main()
