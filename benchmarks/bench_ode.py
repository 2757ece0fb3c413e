"""Speed, memory and scaling of every ODE block against HF Marian, side by side, in one run.

    .venv/bin/python -m benchmarks.bench_ode            # full run (base-like dims)
    .venv/bin/python -m benchmarks.bench_ode --quick    # tiny dims, seconds (run by tests/test_benchmarks.py)
    .venv/bin/python -m benchmarks.bench_ode --device cuda   # on a GPU (memory from the CUDA allocator)

Writes <out-dir>/<run-name>-<time stamp>.json (one per run: the history), <out-dir>/<run-name>.json (a link to
the newest of them), <out-dir>/<run-name>.md and <out-dir>/<run-name>.png (default out-dir benchmarks/results,
run-name `latest`). Every ratio in the report is computed from the raw numbers stored next to it in the JSON.
See benchmarks/README.md.

Timing: training steps and inference run in this process, all models loaded, measured round-robin (model A, B,
C, ... then again) so that load bursts and allocator or frequency drift hit every model alike. Peak memory needs
a process per point: each training variant (and each scaling point, which is timed there too) runs once more in
a fresh process (method: see benchmarks/common.py); those step times are kept as `fresh_process_step_s_all`.
Every time is the minimum over the timed repetitions (the least disturbed one); all repetitions are stored.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.common import BASE_DIMS, INFERENCE_VARIANTS, STAGES, TINY_DIMS, VARIANTS

RESULTS = Path(__file__).resolve().parent / "results"

FULL = {
    "dims": BASE_DIMS,
    "train": {"batch": 32, "src_len": 32, "tgt_len": 32, "warmup": 1, "reps": 2, "round_robin_reps": 8},
    "infer": {"batch": 16, "src_len": 32, "new_tokens": 32, "warmup": 1, "reps": 8},
    "scaling": {
        "lengths": [16, 32, 64, 128, 256, 512],
        "length_tokens": 512,
        "depths": [6, 12, 24, 48],
        "depth_batch": 8,
        "depth_len": 32,
        "methods": ["euler", "rk2", "rk4"],
        "warmup": 1,
        "reps": 2,
    },
    "matmul_n": 2048,
}
QUICK = {
    "dims": TINY_DIMS,
    "train": {"batch": 4, "src_len": 8, "tgt_len": 8, "warmup": 1, "reps": 1, "round_robin_reps": 1},
    "infer": {"batch": 2, "src_len": 8, "new_tokens": 4, "warmup": 1, "reps": 1},
    "scaling": {
        "lengths": [8, 16],
        "length_tokens": 32,
        "depths": [2, 4],
        "depth_batch": 2,
        "depth_len": 8,
        "methods": ["euler", "rk2", "rk4"],
        "warmup": 0,
        "reps": 1,
    },
    "matmul_n": 256,
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def in_fresh_process(ctx, function, spec: dict) -> dict:
    with ctx.Pool(1, maxtasksperchild=1) as pool:
        return pool.apply(function, (spec,))


# ----------------------------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------------------------


def train_round_robin(setup: dict, device: str) -> dict:
    """Training step times of every variant and dtype, all models in this process, timed in turn."""
    dims, t = setup["dims"], setup["train"]
    batch = common.make_batch(t["batch"], t["src_len"], t["tgt_len"], dims.vocab_size, device=device)
    models, optimizers = {}, {}
    for name in VARIANTS:
        torch.manual_seed(0)
        models[name] = common.build_model(name, dims).to(device).train()
        optimizers[name] = torch.optim.Adam(models[name].parameters(), lr=1e-4)
    times = {dtype: {name: [] for name in VARIANTS} for dtype in ("fp32", "bf16")}
    for rep in range(t["warmup"] + t["round_robin_reps"]):
        for dtype in times:
            for name in VARIANTS:
                elapsed = common.train_step(models[name], optimizers[name], batch, dtype)
                if rep >= t["warmup"]:
                    times[dtype][name].append(elapsed)
    return times


def bench_training(ctx, setup: dict, process: dict, device: str) -> dict:
    dims, t = setup["dims"], setup["train"]
    tokens = t["batch"] * t["tgt_len"]
    round_robin = train_round_robin(setup, device)
    out: dict = {"fp32": {}, "bf16": {}}
    for dtype in ("fp32", "bf16"):
        for name in VARIANTS:
            spec = {"model": name, "dims": dims.as_dict(), "dtype": dtype, "device": device, **process, **t}
            result = in_fresh_process(ctx, common.train_worker, spec)
            flops = common.train_flops(name, dims, t["batch"], t["src_len"], t["tgt_len"])
            step = min(round_robin[dtype][name])
            out[dtype][name] = {
                "step_s_all": round_robin[dtype][name],
                "fresh_process_step_s_all": result["step_s_all"],
                "peak_mem_mb": result["peak_mem_mb"],
                "tensor_peak_mb": result["tensor_peak_mb"],
                "params": result["params"],
                "step_s": step,
                "target_tokens_per_step": tokens,
                "tokens_per_s": tokens / step,
                "train_flops_per_step": flops["train_step"],
                "encoder_flop_share": flops["encoder_share"],
                "achieved_gflops": flops["train_step"] / step / 1e9,
                "seconds_per_tflop": step / (flops["train_step"] / 1e12),
            }
            log(f"train {dtype:4s} {name:16s} {step:7.3f} s/step  {result['peak_mem_mb']:8.1f} MB")
    return out


@torch.no_grad()
def bench_inference(setup: dict, device: str) -> dict:
    dims, t = setup["dims"], setup["infer"]
    batch = common.make_batch(t["batch"], t["src_len"], 1, dims.vocab_size, seed=1, device=device)
    src = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    n = t["new_tokens"]
    models = {}
    for name in INFERENCE_VARIANTS:
        torch.manual_seed(0)
        models[name] = common.build_model(name, dims).to(device).eval()
    gen = {"max_new_tokens": n, "min_new_tokens": n, "do_sample": False, "use_cache": True}
    tasks = {
        "beam4_s": lambda m: m.generate(**src, num_beams=4, **gen),
        "greedy_s": lambda m: m.generate(**src, num_beams=1, **gen),
        "encoder_forward_s": lambda m: m.get_encoder()(**src),
    }
    times: dict = {name: {task: [] for task in tasks} for name in models}
    for rep in range(t["warmup"] + t["reps"]):
        for name, model in models.items():
            for task, run in tasks.items():
                elapsed = common.timed(lambda run=run, model=model: run(model), device)
                if rep >= t["warmup"]:
                    times[name][task].append(elapsed)
    out = {}
    for name in models:
        best = {task: min(values) for task, values in times[name].items()}
        out[name] = {
            **{f"{task}_all": values for task, values in times[name].items()},
            **best,
            "beam4_sentences_per_s": t["batch"] / best["beam4_s"],
            "greedy_tokens_per_s": t["batch"] * n / best["greedy_s"],
            "encoder_forward_ms": 1000 * best["encoder_forward_s"],
        }
        log(
            f"infer {name:16s} beam4 {out[name]['beam4_sentences_per_s']:7.2f} sent/s  greedy "
            f"{out[name]['greedy_tokens_per_s']:8.1f} tok/s  encoder {out[name]['encoder_forward_ms']:8.1f} ms"
        )
    return out


def bench_scaling(ctx, setup: dict, process: dict, device: str) -> dict:
    dims, s = setup["dims"], setup["scaling"]
    base = {"dims": dims.as_dict(), "device": device, **process, "warmup": s["warmup"], "reps": s["reps"]}
    length_points, depth_points = [], []
    for length in s["lengths"]:
        batch = max(1, s["length_tokens"] // length)
        for method in s["methods"]:
            spec = {**base, "method": method, "layers": dims.encoder_layers, "length": length, "batch": batch}
            result = in_fresh_process(ctx, common.encoder_worker, spec)
            length_points.append(
                {
                    "method": method,
                    "length": length,
                    "batch": batch,
                    "step_s": min(result["step_s_all"]),
                    **result,
                }
            )
            log(f"scale length {length:4d} {method:5s} {length_points[-1]['step_s']:.3f} s")
    for layers in s["depths"]:
        for method in s["methods"]:
            spec = {
                **base,
                "method": method,
                "layers": layers,
                "length": s["depth_len"],
                "batch": s["depth_batch"],
            }
            result = in_fresh_process(ctx, common.encoder_worker, spec)
            depth_points.append(
                {"method": method, "layers": layers, "step_s": min(result["step_s_all"]), **result}
            )
            log(f"scale depth {layers:3d} {method:5s} {depth_points[-1]['step_s']:.3f} s")
    return {
        "what": "encoder alone, forward + backward of mean(h^2), fp32, no optimizer; plain features",
        "length_tokens_per_batch": s["length_tokens"],
        "depth_batch": s["depth_batch"],
        "depth_length": s["depth_len"],
        "length": length_points,
        "depth": depth_points,
        "expected": "time and activation memory linear in depth; an s-stage encoder about s times the Euler one",
    }


# ----------------------------------------------------------------------------------------------------------
# Targets: each a ratio of two raw numbers of the JSON, addressed by path
# ----------------------------------------------------------------------------------------------------------


def lookup(results: dict, path: list):
    value = results
    for key in path:
        value = value[key]
    return value


def _training(dtype: str, name: str, metric: str) -> list[str]:
    return ["training", dtype, name, metric]


def _inference(name: str, metric: str) -> list[str]:
    return ["inference", name, metric]


_DTYPES = ("fp32", "bf16")
_BEAM4 = "beam4_sentences_per_s"

TARGETS: list[tuple[str, list[str], list[str], str, float]] = [
    *[
        (f"residual vs Marian: training tokens/s ({d})", _training(d, "residual", "tokens_per_s"),
         _training(d, "marian", "tokens_per_s"), ">=", 1.0)
        for d in _DTYPES
    ],
    ("residual vs Marian: beam-4 sentences/s", _inference("residual", _BEAM4), _inference("marian", _BEAM4), ">=", 1.0),
    *[
        (f"residual vs Marian: peak training memory ({d})", _training(d, "residual", "tensor_peak_mb"),
         _training(d, "marian", "tensor_peak_mb"), "<=", 1.0)
        for d in _DTYPES
    ],
    ("RK2 vs residual: beam-4 sentences/s", _inference("rk2", _BEAM4), _inference("residual", _BEAM4), ">=", 0.93),
    ("RK4 vs residual: beam-4 sentences/s", _inference("rk4", _BEAM4), _inference("residual", _BEAM4), ">=", 0.83),
    *[
        (f"{name} training step time / FLOP prediction ({d})", _training(d, name, "seconds_per_tflop"),
         _training(d, "residual", "seconds_per_tflop"), "<=", 1.05)
        for d in _DTYPES
        for name in ("rk2", "rk2_gated", "rk4", "pc_rk2", "pc_rk4")
    ],
    *[
        row
        for d in _DTYPES
        for row in (
            (f"RK2 vs residual: peak training memory ({d})", _training(d, "rk2", "tensor_peak_mb"),
             _training(d, "residual", "tensor_peak_mb"), "<=", 1.25),
            (f"RK2 + ode_checkpoint_stages vs residual: peak training memory ({d})",
             _training(d, "rk2_ckpt", "tensor_peak_mb"), _training(d, "residual", "tensor_peak_mb"), "<=", 1.05),
        )
    ],
    *[
        (f"{name}: bf16 autocast vs fp32 training tokens/s", _training("bf16", name, "tokens_per_s"),
         _training("fp32", name, "tokens_per_s"), ">=", 1.7)
        for name in VARIANTS
    ],
]  # fmt: skip
"""The targets: (name, numerator path, denominator path, comparison, goal) of a ratio of two raw numbers."""

_TRAINING_PAIRS = [
    ("ode_checkpoint_stages speed cost: rk2_ckpt / rk2 step time", "step_s", "rk2_ckpt", "rk2"),
    (
        "paper features (RPR + dense): residual_paper / residual step time",
        "step_s",
        "residual_paper",
        "residual",
    ),
    ("paper features: residual_paper / residual peak memory", "tensor_peak_mb", "residual_paper", "residual"),
    ("paper model: rk2_gated_paper / residual step time", "step_s", "rk2_gated_paper", "residual"),
    ("paper model: rk2_gated_paper / residual peak memory", "tensor_peak_mb", "rk2_gated_paper", "residual"),
    *[
        row
        for pc, rk in (("pc_rk2", "rk2"), ("pc_rk4", "rk4"))
        for row in (
            (f"PCformer: {pc} / {rk} step time", "step_s", pc, rk),
            (f"PCformer: {pc} / residual step time", "step_s", pc, "residual"),
            (f"PCformer: {pc} / residual peak memory", "tensor_peak_mb", pc, "residual"),
        )
    ],
    ("process RSS peak (with allocator slack): residual / marian", "peak_mem_mb", "residual", "marian"),
    ("process RSS peak: rk2 / residual", "peak_mem_mb", "rk2", "residual"),
    ("process RSS peak: rk2_ckpt / residual", "peak_mem_mb", "rk2_ckpt", "residual"),
]
INFORMATIVE: list[tuple[str, list[str], list[str]]] = [
    *[
        (f"{name} ({d})", _training(d, a, metric), _training(d, b, metric))
        for d in _DTYPES
        for name, metric, a, b in _TRAINING_PAIRS
    ],
    *[
        (f"{name} vs residual: beam-4 sentences/s", _inference(name, _BEAM4), _inference("residual", _BEAM4))
        for name in ("residual_paper", "rk2_gated_paper", "pc_rk2", "pc_rk4")
    ],
]
"""Ratios without a target (name, numerator path, denominator path): the cost of checkpointing and of the
paper's features."""


def _ratio(results: dict, name: str, a: list[str], b: list[str]) -> dict:
    return {"name": name, "a": a, "b": b, "ratio": lookup(results, a) / lookup(results, b)}


def targets(results: dict) -> list[dict]:
    """Every row of :data:`TARGETS` with its ratio in ``results`` and whether it meets the goal."""
    rows = []
    for name, a, b, op, goal in TARGETS:
        row = _ratio(results, name, a, b)
        met = row["ratio"] >= goal if op == ">=" else row["ratio"] <= goal
        rows.append({**row, "op": op, "target": goal, "met": bool(met)})
    return rows


def informative_ratios(results: dict) -> list[dict]:
    """Every row of :data:`INFORMATIVE` with its ratio in ``results`` (process peaks named for the device)."""
    peak = common.process_peak_name(results["machine"].get("device", "cpu"))
    return [_ratio(results, name.replace("RSS", peak), a, b) for name, a, b in INFORMATIVE]


# ----------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------


_RULES = {"l": "---", "r": "---:", "c": ":---:"}


def _table(columns: str, header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table: ``columns`` aligns each column (``l``eft, ``r``ight or ``c``entred)."""
    rule = "|" + "|".join(_RULES[c] for c in columns) + "|"
    return [f"| {' | '.join(header)} |", rule, *(f"| {' | '.join(cells)} |" for cells in rows)]


def _scaling_rows(points: list[dict], key: str) -> list[list[str]]:
    """Cells of the scaling table over ``key`` (``length``: with the batch; ``layers``: with the time per depth
    relative to the shallowest point of the same method)."""
    euler = {p[key]: p for p in points if p["method"] == "euler"}
    first: dict[str, dict] = {}
    rows = []
    for p in points:
        e, f = euler[p[key]], first.setdefault(p["method"], p)
        cells = [str(p[key]), p["method"]] + ([str(p["batch"])] if key == "length" else [])
        cells += [
            f"{p['step_s']:.3f}",
            f"{p['peak_mem_mb']:.0f}",
            f"{p['step_s'] / e['step_s']:.2f}",
            f"{p['peak_mem_mb'] / e['peak_mem_mb']:.2f}",
        ]
        if key == "layers":
            cells.append(f"{p['step_s'] / f['step_s']:.2f} (linear: {p['layers'] / f['layers']:.0f})")
        rows.append(cells)
    return rows


def _native_bf16(machine: dict) -> bool:
    """Whether the run's bf16 figures are native (results from before this was recorded count as native: they
    were measured on machines with AVX512_BF16 and AMX)."""
    return machine.get("native_bf16", {}).get("native", True)


def _bf16_note(machine: dict) -> str:
    """The machine line's CPU capability and bf16 kind; empty for runs from before they were recorded."""
    if "native_bf16" not in machine:
        return ""
    kind = (
        "native" if _native_bf16(machine) else "EMULATED: its bf16 figures do not hold where bf16 is native"
    )
    return f" PyTorch CPU capability {machine['cpu_capability']}; bf16 {kind} ({machine['native_bf16']['reason']})."


def _bf16_marked(name: str, machine: dict) -> str:
    """A target's name, marked where it involves bf16 that this CPU emulates."""
    return f"{name} [bf16 emulated]" if "bf16" in name and not _native_bf16(machine) else name


def markdown(results: dict) -> str:
    m, st = results["machine"], results["settings"]
    peak = common.process_peak_name(m.get("device", "cpu"))  # runs before --device were all CPU
    dims = st["dims"]
    lines = [
        f"# ODE Transformer benchmarks ({results['mode']} run, {results['timestamp']})",
        "",
        f"Machine: {m['cpu_model']}, {m['logical_cores']} logical cores ({m['torch_threads']} torch threads), "
        f"{m['memory_gb']} GB, ISA {', '.join(m['isa'])}; torch {m['torch']}, transformers {m['transformers']}, "
        f"Python {m['python']}; load average at start {m['load_average_at_start'][0]:.1f}; CPU time stolen by the "
        f"VM host during the run {100 * m['cpu_steal_fraction']:.1f}%."
        + (f" Device: {m['accelerator']} ({m['device']})." if m.get("accelerator") else "")
        + _bf16_note(m),
        "",
        f"Dims: d_model {dims['d_model']}, ffn {dims['ffn_dim']}, {dims['heads']} heads, "
        f"{dims['encoder_layers']}-{dims['decoder_layers']} layers, vocab {dims['vocab_size']}, dropout "
        f"{dims['dropout']}. Training batch: {st['train']['batch']} x {st['train']['src_len']} source (padded, "
        f"lengths {st['train']['src_len'] // 2}..{st['train']['src_len']}) x {st['train']['tgt_len']} target tokens; "
        "Adam; times are the minimum over the timed steps after a warm-up step, all models timed in turn in one process. "
        f"glibc malloc policy: {st['malloc']} (see benchmarks/README.md).",
        f"Hardware limit (torch.matmul {st['matmul_n']}x{st['matmul_n']}, same run): "
        f"fp32 {results['matmul']['fp32_gflops']:.0f} GFLOP/s, bf16 {results['matmul']['bf16_gflops']:.0f} GFLOP/s.",
        "",
        "## Targets",
        "",
        *_table(
            "lrrc",
            ["target", "ratio", "goal", "met"],
            [
                [
                    _bf16_marked(row["name"], m),
                    f"{row['ratio']:.3f}",
                    f"{row['op']} {row['target']}",
                    "yes" if row["met"] else "**no**",
                ]
                for row in results["targets"]
            ],
        ),
        "",
        *_table(
            "lr",
            ["other ratio", "value"],
            [[_bf16_marked(row["name"], m), f"{row['ratio']:.3f}"] for row in results["informative"]],
        ),
        "",
        "## Training (forward + backward + Adam step)",
        "",
        *_table(
            "llrrrrrrr",
            [
                "model",
                "dtype",
                "s/step",
                "target tok/s",
                f"peak MB ({peak})",
                "live-tensor peak MB",
                "train GFLOP/step",
                "achieved GFLOP/s",
                "% of matmul peak",
            ],
            [
                [
                    name,
                    dtype + ("" if dtype == "fp32" or _native_bf16(m) else " (emulated)"),
                    f"{r['step_s']:.3f}",
                    f"{r['tokens_per_s']:.0f}",
                    f"{r['peak_mem_mb']:.0f}",
                    f"{r['tensor_peak_mb']:.0f}",
                    f"{r['train_flops_per_step'] / 1e9:.1f}",
                    f"{r['achieved_gflops']:.1f}",
                    f"{100 * r['achieved_gflops'] / results['matmul'][f'{dtype}_gflops']:.1f}",
                ]
                for dtype in ("fp32", "bf16")
                for name, r in results["training"][dtype].items()
            ],
        ),
    ]
    inf = results["settings"]["infer"]
    lines += [
        "",
        f"## Inference (fp32, batch {inf['batch']} x {inf['src_len']} source tokens, {inf['new_tokens']} new tokens, "
        "KV cache)",
        "",
        *_table(
            "lrrr",
            ["model", "beam-4 sentences/s", "greedy tokens/s", "encoder forward ms"],
            [
                [
                    name,
                    f"{r['beam4_sentences_per_s']:.2f}",
                    f"{r['greedy_tokens_per_s']:.1f}",
                    f"{r['encoder_forward_ms']:.1f}",
                ]
                for name, r in results["inference"].items()
            ],
        ),
    ]
    sc = results["scaling"]
    lines += [
        "",
        f"## Scaling ({sc['what']})",
        "",
        f"Expected: {sc['expected']}.",
        "",
        f"Sequence length ({sc['length_tokens_per_batch']} tokens per batch):",
        "",
        *_table(
            "rlrrrrr",
            ["length", "method", "batch", "s/step", f"peak MB ({peak})", "time / Euler", "memory / Euler"],
            _scaling_rows(sc["length"], "length"),
        ),
        "",
        f"Encoder depth ({sc['depth_batch']} x {sc['depth_length']} tokens):",
        "",
        *_table(
            "rlrrrrr",
            [
                "layers",
                "method",
                "s/step",
                f"peak MB ({peak})",
                "time / Euler",
                "memory / Euler",
                "time / shallowest",
            ],
            _scaling_rows(sc["depth"], "layers"),
        ),
    ]
    lines += [
        "",
        "## FLOP count",
        "",
        "```",
        results["flop_formula"],
        "```",
        "",
        f"Peak memory: {results['memory_method']}",
        "",
    ]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    names = list(results["training"]["fp32"])
    x = range(len(names))
    for offset, dtype in ((-0.2, "fp32"), (0.2, "bf16")):
        tr = results["training"][dtype]
        axes[0, 0].bar([i + offset for i in x], [tr[n]["tokens_per_s"] for n in names], 0.4, label=dtype)
        axes[0, 1].bar([i + offset for i in x], [tr[n]["peak_mem_mb"] for n in names], 0.4, label=dtype)
    for ax, title in ((axes[0, 0], "training target tokens/s"), (axes[0, 1], "peak training memory (MB)")):
        ax.set_xticks(list(x), names, rotation=35, ha="right")
        ax.set_title(title)
        ax.legend()
    inf = results["inference"]
    iname = list(inf)
    axes[0, 2].bar(range(len(iname)), [inf[n]["beam4_sentences_per_s"] for n in iname])
    axes[0, 2].set_xticks(range(len(iname)), iname, rotation=35, ha="right")
    axes[0, 2].set_title("beam-4 sentences/s (fp32)")
    sc = results["scaling"]
    for method in sorted({p["method"] for p in sc["length"]}, key=lambda m: STAGES[m]):
        pts = [p for p in sc["length"] if p["method"] == method]
        axes[1, 0].plot([p["length"] for p in pts], [p["step_s"] for p in pts], "o-", label=method)
        axes[1, 1].plot([p["length"] for p in pts], [p["peak_mem_mb"] for p in pts], "o-", label=method)
        dpts = [p for p in sc["depth"] if p["method"] == method]
        axes[1, 2].plot(
            [p["layers"] for p in dpts], [p["step_s"] for p in dpts], "o-", label=f"{method} time"
        )
    axes[1, 0].set(
        xscale="log", yscale="log", xlabel="sequence length", title="encoder step time (s), fixed tokens"
    )
    axes[1, 1].set(xscale="log", xlabel="sequence length", title="encoder peak memory (MB)")
    axes[1, 2].set(xlabel="encoder layers", title="encoder step time (s) vs depth")
    for ax in axes[1]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------------


def _write_json(results: dict, out_dir: Path, name: str) -> None:
    """The run as ``<name>-<time stamp>.json`` (the history, one file per run) and ``<name>.json``, a link to
    the newest run rather than a copy of it."""
    stamped = out_dir / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    stamped.write_text(json.dumps(results, indent=1))
    latest = out_dir / f"{name}.json"
    latest.unlink(missing_ok=True)
    latest.symlink_to(stamped.name)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny dims, a few seconds per section")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--name", default="latest", help="file stem of the .json/.md/.png")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument(
        "--malloc",
        choices=common.MALLOC_POLICIES,
        default="keep-freed",
        help="glibc malloc policy of every process (see benchmarks/common.py: configure_process)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu, or cuda / cuda:N (run on an H200 by make gpu-check: docs/performance.md)",
    )
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)

    setup = QUICK if args.quick else FULL
    process = {"threads": args.threads, "malloc": args.malloc}
    common.configure_process(**process)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "transformers", "modeling_ode", "benchmarks.common"])
    started, ticks_at_start = time.time(), common.cpu_ticks()
    results: dict = {
        "mode": "quick" if args.quick else "full",
        "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": common.machine_info(args.device),
        "settings": {
            **{k: v for k, v in setup.items() if k != "dims"},
            "dims": setup["dims"].as_dict(),
            "malloc": args.malloc,
        },
        "memory_method": (common.__doc__.split("Peak memory method: ", 1)[1].replace("\n", " ").strip()),
        "flop_formula": common.FLOP_FORMULA,
    }
    log("matmul throughput")
    n = setup["matmul_n"]
    results["matmul"] = {
        "n": n,
        "fp32_gflops": common.matmul_gflops(n, torch.float32, device=args.device),
        "bf16_gflops": common.matmul_gflops(n, torch.bfloat16, device=args.device),
    }
    results["training"] = bench_training(ctx, setup, process, args.device)
    results["inference"] = bench_inference(setup, args.device)
    results["scaling"] = bench_scaling(ctx, setup, process, args.device)
    results["targets"] = targets(results)
    results["informative"] = informative_ratios(results)
    results["wall_s"] = time.time() - started
    ticks = common.cpu_ticks()
    total = ticks["total"] - ticks_at_start["total"]
    results["machine"]["cpu_steal_fraction"] = (
        (ticks["steal"] - ticks_at_start["steal"]) / total if total else 0.0
    )

    args.out_dir.mkdir(parents=True, exist_ok=True)
    _write_json(results, args.out_dir, args.name)
    (args.out_dir / f"{args.name}.md").write_text(markdown(results))
    if not args.no_plot:
        plot(results, args.out_dir / f"{args.name}.png")
    log(f"done in {results['wall_s']:.0f} s -> {args.out_dir}/{args.name}.{{json,md,png}}")
    return results


if __name__ == "__main__":
    main()
