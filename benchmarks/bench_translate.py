"""Translation speed on CPU, side by side in one run: HF MarianMT, the ODE Transformer (residual, RK2 and RK4
encoder blocks) in float32, in dynamic int8 and compiled, and CTranslate2's Marian in float32 and int8.

    .venv/bin/python -m benchmarks.bench_translate --threads 1    # d 512, 6-6 layers, vocab 8k (~20 min, 2 cores)
    .venv/bin/python -m benchmarks.bench_translate --quick        # tiny dims, a smoke run (tests/test_benchmarks.py)

Every system translates the same random source sentences (random weights) into exactly `new_tokens` tokens
(`min_new_tokens = max_new_tokens`; CTranslate2's `min_decoding_length = max_decoding_length`), in four settings:
batch 16 / batch 1, beam 4 / greedy (batch 1: `batch1_sentences` sentences one at a time). Systems are interleaved:
each round times every system once per setting, and a system's figure is its best round, in sentences per second.

Systems: `marian` (MarianMTModel of the same dims, dynamic cache); `<model>` (float32, `generate` with its default
dynamic cache); `<model>-int8` (`modeling_ode.quantization.quantize_int8`, dynamic cache); `<model>-int8-compiled`
(int8 with `ode_transformer.train.translate.compile_decoding`: static cache, each greedy step compiled by transformers' `generate`;
greedy settings only, as transformers compiles no beam-search step); `ct2` / `ct2-int8` (the Marian model converted
with CTranslate2's TransformersConverter into a temporary folder; skipped with a note when ctranslate2 is not
installed: `pip install '.[bench]'`). The goals of issue #43 are checked as ratios of one run, and a torch.profiler
summary of the int8 residual model's decoding (top operators) says where its time goes.

RK goals (issue #57): RK2 and RK4 over residual, in each system family and setting, at least
`RK_GOAL_OF_PREDICTED` of the FLOP-predicted ratio (`common.GENERATE_FLOP_FORMULA`: the encoder's extra stages
against the same decoder, for that batch, beam and source / target length), not a flat ratio: a fast decoder
exposes the encoder's fixed cost, most at batch 16 greedy. The machine record names PyTorch's kernel level and the
CPU's VNNI / AMX / AVX512_BF16 flags (int8 and bf16 speed depend on them).

Writes <out-dir>/translate-<time stamp>.json and <out-dir>/translate.json/.md (the newest).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.common import BASE_DIMS, TINY_DIMS
from modeling_ode.compat import raise_recompile_limit
from modeling_ode.quantization import quantize_int8
from ode_transformer.train.translate import compile_decoding

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("residual", "rk2", "rk4")
SETTINGS = {  # name -> (batch size, beams)
    "batch16_beam4": (16, 4),
    "batch16_greedy": (16, 1),
    "batch1_beam4": (1, 4),
    "batch1_greedy": (1, 1),
}
GREEDY = tuple(setting for setting, (_, beams) in SETTINGS.items() if beams == 1)
FULL = {
    "dims": BASE_DIMS,
    "src_len": 20,
    "new_tokens": 30,
    "batch1_sentences": 4,
    "rounds": 3,
    "compile": MODELS,  # which int8 models also run compiled (10-60 s of compiling per batch shape)
}
QUICK = {
    "dims": TINY_DIMS,
    "src_len": 6,
    "new_tokens": 3,
    "batch1_sentences": 1,
    "rounds": 1,
    "compile": (),
}
# issue #43's goals: (name, system, over system, settings, at least)
GOALS = (
    ("residual int8 vs CTranslate2 int8, batch 16 beam 4", "residual-int8", "ct2-int8", ("batch16_beam4",), 1.0),
    ("residual int8 vs CTranslate2 int8, batch 1", "residual-int8", "ct2-int8", ("batch1_beam4", "batch1_greedy"), 0.7),
    ("residual ONNX int8 vs CTranslate2 int8, batch 16 beam 4", "residual-onnx-int8", "ct2-int8", ("batch16_beam4",), 1.0),
    ("residual ONNX int8 vs CTranslate2 int8, batch 1", "residual-onnx-int8", "ct2-int8", ("batch1_beam4", "batch1_greedy"), 0.7),
    ("residual int8 compiled vs CTranslate2 int8, batch 1", "residual-int8-compiled", "ct2-int8", ("batch1_greedy",), 0.7),
)  # fmt: skip
# issue #57's RK goals: (name, system, over system, settings); met when measured / FLOP-predicted ratio is at least
# RK_GOAL_OF_PREDICTED. The model of a system is its name's first part (rk2-int8 -> rk2).
RK_GOAL_OF_PREDICTED = 0.9
RK_GOALS = tuple(
    (f"{rk.upper()}{label} vs residual{label}", f"{rk}{suffix}", f"residual{suffix}", settings)
    for label, suffix, settings in (
        (" fp32", "", tuple(SETTINGS)),
        (" int8", "-int8", tuple(SETTINGS)),
        (" ONNX int8", "-onnx-int8", tuple(SETTINGS)),
        (" int8 compiled", "-int8-compiled", GREEDY),
    )
    for rk in ("rk2", "rk4")
)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------------
# Systems: each is a function (input_ids, attention_mask, beams) -> generated ids, timed by the caller
# ----------------------------------------------------------------------------------------------------------


def torch_system(model: torch.nn.Module, new_tokens: int, **generate_kwargs):
    def translate(input_ids: torch.Tensor, attention_mask: torch.Tensor, beams: int) -> torch.Tensor:
        with torch.no_grad():
            return model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                num_beams=beams,
                do_sample=False,
                min_new_tokens=new_tokens,
                max_new_tokens=new_tokens,
                **generate_kwargs,
            )

    return translate


def runs_in(system: str, setting: str) -> bool:
    """Compiled systems run the greedy settings only: transformers' `generate` compiles no beam-search step."""
    return not (system.endswith("-compiled") and SETTINGS[setting][1] > 1)


class _Vocabulary:
    """What CTranslate2's Marian converter reads from a tokenizer: token strings by id, Marian's `<pad>` last (the
    converter drops the last row, the pad embedding Marian's decoder starts from), EOS and UNK."""

    eos_token, unk_token = "</s>", "<unk>"

    def __init__(self, size: int):
        self.tokens = ["<s>", "<pad0>", "</s>", "<unk>", *(f"w{i}" for i in range(4, size - 1)), "<pad>"]

    def get_vocab(self) -> dict[str, int]:
        return {token: index for index, token in enumerate(self.tokens)}


def ct2_systems(marian: torch.nn.Module, dims: common.Dims, threads: int, folder: Path, new_tokens: int):
    """{"ct2": ..., "ct2-int8": ...} from the Marian model's own weights, or a note why there are none."""
    try:
        import ctranslate2
        from ctranslate2.converters import TransformersConverter
    except ImportError:
        return {}, "ctranslate2 is not installed (pip install '.[bench]'): its rows are skipped"
    vocabulary = _Vocabulary(dims.vocab_size)

    class Converter(TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return vocabulary

    marian.save_pretrained(folder / "marian")
    Converter(str(folder / "marian")).convert(str(folder / "ct2"), force=True)
    systems = {}
    for name, compute_type in (("ct2", "float32"), ("ct2-int8", "int8")):
        translator = ctranslate2.Translator(
            str(folder / "ct2"),
            device="cpu",
            compute_type=compute_type,
            intra_threads=threads,
            inter_threads=1,
        )

        def translate(input_ids, attention_mask, beams, translator=translator):
            tokens = [
                [vocabulary.tokens[i] for i in row[mask.bool()].tolist()]
                for row, mask in zip(input_ids, attention_mask)
            ]
            results = translator.translate_batch(
                tokens,
                beam_size=beams,
                max_batch_size=len(tokens),
                min_decoding_length=new_tokens,
                max_decoding_length=new_tokens,
            )
            return [result.hypotheses[0] for result in results]

        systems[name] = translate
    return systems, f"ctranslate2 {ctranslate2.__version__}, Marian converted with TransformersConverter"


def onnx_int8_system(
    model: torch.nn.Module, threads: int, folder: Path, new_tokens: int, profile: bool = False
):
    """The model's int8 ONNX graphs (`ode-export --onnx --quantize int8`, TorchScript exporter: much quicker
    than dynamo) decoded by `ode_transformer.hub.onnx_generation.ONNXSeq2SeqGenerator`; exactly `new_tokens` tokens: its
    end-of-sentence id is one the model cannot write. None without the onnx extra.
    `profile`: onnxruntime profiles every run (`translate.generator.sessions`' `end_profiling` writes it)."""
    try:
        import onnxruntime

        from ode_transformer.hub.onnx_export import export_onnx
        from ode_transformer.hub.onnx_generation import ONNXSeq2SeqGenerator
    except ImportError:
        return None
    export_onnx(model, folder, dynamo=False, quantize="int8")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    if profile:
        options.enable_profiling, options.profile_file_prefix = True, str(folder / "profile")
    config = {
        **model.generation_config.to_dict(),
        "eos_token_id": model.config.vocab_size,
        "forced_eos_token_id": None,
    }
    generator = ONNXSeq2SeqGenerator(folder, config, session_options=options)

    def translate(input_ids, attention_mask, beams):
        return generator.generate(
            input_ids.numpy(), attention_mask.numpy(), num_beams=beams, max_new_tokens=new_tokens
        )

    translate.generator = generator
    return translate


def onnx_profile_top_ops(threads: int, folder: Path, setup: dict, setting: str, rows: int = 12) -> list[dict]:
    """onnxruntime's profile of the residual model's int8 graphs over one call set: kernel time per operator type,
    summed over the graphs' nodes (where the ONNX path's time goes)."""
    torch.manual_seed(0)  # the weights of build_systems' residual model
    model = common.build_model("residual", setup["dims"]).eval()
    translate = onnx_int8_system(model, threads, folder, setup["new_tokens"], profile=True)
    beams = SETTINGS[setting][1]
    for ids, mask in inputs_for(setting, setup):
        translate(ids, mask, beams)
    per_op: dict[str, list[float]] = {}
    for session in translate.generator.sessions.values():
        for event in json.loads(Path(session.end_profiling()).read_text()):
            if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                per_op.setdefault(event["args"]["op_name"], []).append(event["dur"])
    total = sum(sum(times) for times in per_op.values())
    ranked = sorted(per_op.items(), key=lambda item: sum(item[1]), reverse=True)[:rows]
    return [
        {"op": op, "self_ms": sum(times) / 1e3, "share": sum(times) / total, "calls": len(times)}
        for op, times in ranked
    ]


def build_systems(setup: dict, threads: int, folder: Path) -> tuple[dict, list[str]]:
    dims, new_tokens = setup["dims"], setup["new_tokens"]
    torch.manual_seed(0)
    marian = common.build_model("marian", dims).eval()
    systems = {"marian": torch_system(marian, new_tokens)}
    for name in MODELS:
        torch.manual_seed(0)
        model = common.build_model(name, dims).eval()
        systems[name] = torch_system(model, new_tokens)
        # int8 with the dynamic cache: in eager mode the static cache was slower at batch 1 (every step attends over
        # and reorders the whole preallocated length), and fbgemm's packed weights cannot be compiled
        systems[f"{name}-int8"] = torch_system(quantize_int8(copy.deepcopy(model)), new_tokens)
        if name in setup["compile"]:
            # the three models share one forward (dynamo's cache entries are per code object, guarded by model)
            raise_recompile_limit(64)
            compiled = compile_decoding(quantize_int8(copy.deepcopy(model)))
            systems[f"{name}-int8-compiled"] = torch_system(compiled, new_tokens)
        onnx_int8 = onnx_int8_system(model, threads, folder / f"{name}-onnx", new_tokens)
        if onnx_int8 is not None:
            systems[f"{name}-onnx-int8"] = onnx_int8
    ct2, note = ct2_systems(marian, dims, threads, folder, new_tokens)
    systems.update(ct2)
    notes = [
        note,
        f"int8 compiled (ode_transformer.train.translate.compile_decoding), greedy only: {', '.join(setup['compile']) or 'none'}",
        "onnx-int8: ode-export --onnx --quantize int8 (TorchScript exporter), decoded with ONNXSeq2SeqGenerator"
        if "residual-onnx-int8" in systems
        else "onnx, onnxscript or onnxruntime is not installed (pip install '.[onnx]'): the ONNX rows are skipped",
    ]
    return systems, notes


def count_tokens(output, source_rows: int, beams: int) -> int:
    """New tokens per sentence of one output: transformers' and the ONNX generator's rows hold the start token
    first."""
    if hasattr(output, "shape"):
        return output.shape[1] - 1
    return len(output[0])


# ----------------------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------------------


def inputs_for(setting: str, setup: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The calls of one setting: one batch of 16, or `batch1_sentences` single sentences (the batch's first rows)."""
    batch = common.make_batch(16, setup["src_len"], 1, setup["dims"].vocab_size)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    if SETTINGS[setting][0] == 16:
        return [(ids, mask)]
    calls = []
    for row in range(setup["batch1_sentences"]):
        length = int(mask[row].sum())
        calls.append((ids[row : row + 1, :length], mask[row : row + 1, :length]))
    return calls


def run_rounds(systems: dict, setup: dict) -> dict:
    """Seconds per call set, every system in turn in each round; the first call of each (compiling, warming the
    allocator) is not timed."""
    times = {setting: {name: [] for name in systems if runs_in(name, setting)} for setting in SETTINGS}
    new_tokens = {setting: {} for setting in SETTINGS}
    for setting, (_, beams) in SETTINGS.items():
        calls = inputs_for(setting, setup)
        for name, translate in systems.items():
            if not runs_in(name, setting):
                continue
            begin = time.perf_counter()
            output = translate(*calls[0], beams)
            new_tokens[setting][name] = count_tokens(output, len(calls[0][0]), beams)
            log(f"warm-up {setting} {name}: {time.perf_counter() - begin:.1f} s")
    for round_index in range(setup["rounds"]):
        for setting, (_, beams) in SETTINGS.items():
            calls = inputs_for(setting, setup)
            for name, translate in systems.items():
                if not runs_in(name, setting):
                    continue
                begin = time.perf_counter()
                for ids, mask in calls:
                    translate(ids, mask, beams)
                times[setting][name].append(time.perf_counter() - begin)
        log(f"round {round_index + 1} done")
    return {"seconds_all": times, "new_tokens": new_tokens}


def profile_top_ops(translate, setup: dict, setting: str, rows: int = 12) -> list[dict]:
    """torch.profiler's operators with the most self CPU time in one call set: where the time goes."""
    from torch.profiler import ProfilerActivity, profile

    beams = SETTINGS[setting][1]
    calls = inputs_for(setting, setup)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for ids, mask in calls:
            translate(ids, mask, beams)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    return [
        {
            "op": e.key,
            "self_ms": e.self_cpu_time_total / 1e3,
            "share": e.self_cpu_time_total / total,
            "calls": e.count,
        }
        for e in events[:rows]
    ]


# ----------------------------------------------------------------------------------------------------------
# FLOP prediction
# ----------------------------------------------------------------------------------------------------------


def flop_prediction(setup: dict) -> dict:
    """Per setting: each model's matmul FLOPs over the setting's calls (encoder, decoder with its output projection,
    total; `common.generate_flops` on each call's own batch and source length) and the predicted speed of RK2 and
    RK4 over residual, residual FLOPs / RK FLOPs."""
    out = {}
    for setting, (_, beams) in SETTINGS.items():
        calls = inputs_for(setting, setup)
        flops = {}
        for model in MODELS:
            parts = [
                common.generate_flops(
                    model, setup["dims"], len(ids), beams, ids.shape[1], setup["new_tokens"]
                )
                for ids, _ in calls
            ]
            flops[model] = {key: sum(part[key] for part in parts) for key in parts[0]}
        out[setting] = {
            "flops": flops,
            "predicted_vs_residual": {
                model: flops["residual"]["total"] / flops[model]["total"]
                for model in MODELS
                if model != "residual"
            },
        }
    return out


# ----------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------


def goals(results: dict) -> list[dict]:
    """Every goal in every setting: the measured speed ratio; for the RK goals also the FLOP-predicted ratio and
    measured / predicted, which is what `at_least` bounds there (`measure`: "ratio" or "of_predicted")."""
    out = []
    speed = results["sentences_per_s"]
    rows = [(label, system, over, settings, least, None) for label, system, over, settings, least in GOALS]
    for label, system, over, settings in RK_GOALS:
        rows.append((label, system, over, settings, RK_GOAL_OF_PREDICTED, system.split("-")[0]))
    for label, system, over, settings, least, model in rows:
        for setting in settings:
            predicted = results["flop_prediction"][setting]["predicted_vs_residual"][model] if model else None
            row = {
                "goal": label,
                "setting": setting,
                "measure": "of_predicted" if model else "ratio",
                "at_least": least,
                "predicted": predicted,
                "ratio": None,
                "of_predicted": None,
                "met": None,
            }
            if system in speed[setting] and over in speed[setting]:
                row["ratio"] = speed[setting][system] / speed[setting][over]
                row["of_predicted"] = row["ratio"] / predicted if model else None
                row["met"] = row[row["measure"]] >= least
            out.append(row)
    return out


def markdown(results: dict) -> str:
    m = results["machine"]
    load = m["load_average_at_start"][0]
    lines = [
        "# Translation speed on CPU (sentences/s)",
        "",
        f"`{results['command']}` on {m['cpu_model']} ({m['logical_cores']} logical cores; "
        f"{common.describe_cpu(m)}), {results['threads']} torch thread(s), torch {m['torch']}, transformers "
        f"{m['transformers']}. Dims {results['dims']}; random weights; source {results['setup']['src_len']} tokens "
        f"at most; exactly {results['setup']['new_tokens']} new tokens per sentence; batch 1 = "
        f"{results['setup']['batch1_sentences']} sentences one at a time; best of {results['setup']['rounds']} "
        "interleaved rounds.",
        "",
    ]
    if load > 1.5:
        lines += [f"**The machine had other load: load average {load:.2f} at the start.**", ""]
    lines += [f"- {note}" for note in results["notes"]] + [""]
    lines += ["| system | " + " | ".join(s.replace("_", ", ") for s in SETTINGS) + " |"]
    lines += ["|---|" + "---:|" * len(SETTINGS)]
    for name in results["systems"]:
        cells = [f"{results['sentences_per_s'][s][name]:.2f}" if runs_in(name, s) else "-" for s in SETTINGS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## FLOP-predicted speed of RK over residual",
        "",
        "Matmul FLOPs of each setting's calls (`common.GENERATE_FLOP_FORMULA`): the encoder runs RK2's and RK4's",
        "2 and 4 evaluations of F per layer once per sentence, the (Euler) decoder the same work for all three;",
        "predicted = residual FLOPs / RK FLOPs.",
        "",
        "| setting | residual MFLOP (encoder / decoder) | RK2 MFLOP | RK4 MFLOP | RK2 predicted | RK4 predicted |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for setting, prediction in results["flop_prediction"].items():
        flops, predicted = prediction["flops"], prediction["predicted_vs_residual"]
        residual = flops["residual"]
        lines.append(
            f"| {setting.replace('_', ', ')} | {residual['total'] / 1e6:.1f} ({residual['encoder'] / 1e6:.1f} / "
            f"{residual['decoder'] / 1e6:.1f}) | {flops['rk2']['total'] / 1e6:.1f} | {flops['rk4']['total'] / 1e6:.1f} "
            f"| {predicted['rk2']:.3f} | {predicted['rk4']:.3f} |"
        )
    lines += [
        "",
        "## Goals (ratios of this run)",
        "",
        f"RK rows: met at measured / predicted >= {RK_GOAL_OF_PREDICTED} (issue #57); the others: the ratio itself.",
        "",
        "| goal | setting | ratio | predicted | measured / predicted | goal | met |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for goal in results["goals"]:
        ratio = "n/a" if goal["ratio"] is None else f"{goal['ratio']:.2f}"
        predicted = "-" if goal["predicted"] is None else f"{goal['predicted']:.3f}"
        of_predicted = "-" if goal["predicted"] is None else "n/a"
        if goal["of_predicted"] is not None:
            of_predicted = f"{goal['of_predicted']:.2f}"
        target = f">= {goal['at_least']}" + (" of predicted" if goal["measure"] == "of_predicted" else "")
        short = goal["at_least"] - (goal[goal["measure"]] or 0)
        met = {None: "n/a", True: "met", False: f"**unmet** (short by {short:.2f})"}
        lines.append(
            f"| {goal['goal']} | {goal['setting']} | {ratio} | {predicted} | {of_predicted} | {target} | "
            f"{met[goal['met']]} |"
        )
    profiles = (  # (results key, system, profiler, the columns for time and count)
        ("profiles", "residual-int8", "torch.profiler, self CPU time", "self ms", "calls"),
        ("onnx_profiles", "residual-onnx-int8", "onnxruntime's profiler, kernel time by operator type", "ms", "nodes run"),
    )  # fmt: skip
    for key, system, profiler, time_column, count_column in profiles:
        for setting, ops in results[key].items():
            lines += ["", f"## Profile: {system}, {setting.replace('_', ', ')} ({profiler})", ""]
            lines += [f"| operator | {time_column} | share | {count_column} |", "|---|---:|---:|---:|"]
            lines += [f"| {o['op']} | {o['self_ms']:.1f} | {o['share']:.1%} | {o['calls']} |" for o in ops]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_translate", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="tiny dims, one round: a smoke run")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch (and CTranslate2) threads; the issue's: 1"
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    machine = common.machine_info()  # the load average before this run adds its own
    common.configure_process(args.threads, "keep-freed")
    machine["torch_threads"] = torch.get_num_threads()
    setup = QUICK if args.quick else FULL
    begin = time.time()
    with tempfile.TemporaryDirectory(prefix="bench_translate_") as folder:
        systems, notes = build_systems(setup, args.threads, Path(folder))
        log(f"systems: {', '.join(systems)}")
        measured = run_rounds(systems, setup)
        profiles = {
            setting: profile_top_ops(systems["residual-int8"], setup, setting)
            for setting in ("batch16_beam4", "batch1_greedy")
        }
        onnx_profiles = (
            {
                "batch16_beam4": onnx_profile_top_ops(
                    args.threads, Path(folder) / "profile", setup, "batch16_beam4"
                )
            }
            if "residual-onnx-int8" in systems
            else {}
        )
    sentences = {
        setting: len(inputs_for(setting, setup)) * (16 if SETTINGS[setting][0] == 16 else 1)
        for setting in SETTINGS
    }
    results = {
        "command": "python -m benchmarks.bench_translate"
        + (" --quick" if args.quick else "")
        + f" --threads {args.threads}",
        "machine": machine,
        "threads": args.threads,
        "dims": setup["dims"].as_dict(),
        "setup": {key: value for key, value in setup.items() if key != "dims"},
        "settings": {
            name: {"batch": b, "beams": k, "sentences": sentences[name]} for name, (b, k) in SETTINGS.items()
        },
        "systems": list(systems),
        "notes": notes,
        **measured,
        "sentences_per_s": {
            setting: {name: sentences[setting] / min(t) for name, t in per_system.items()}
            for setting, per_system in measured["seconds_all"].items()
        },
        "profiles": profiles,
        "onnx_profiles": onnx_profiles,
        "flop_formula": common.GENERATE_FLOP_FORMULA,
        "flop_prediction": flop_prediction(setup),
        "wall_s": time.time() - begin,
    }
    results["goals"] = goals(results)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=1) + "\n"
    (args.out_dir / f"translate-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(text)
    (args.out_dir / "translate.json").write_text(text)
    report = markdown(results)
    (args.out_dir / "translate.md").write_text(report)
    print(report)
    return results


if __name__ == "__main__":
    main()
