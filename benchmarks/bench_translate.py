"""Translation speed on CPU on synthetic input (random sentences, random weights), side by side in one run: HF
MarianMT, the ODE Transformer (residual, RK2 and RK4 encoder blocks) in float32, in dynamic int8 and compiled, and
CTranslate2's Marian in float32 and int8.

    .venv/bin/python -m benchmarks.bench_translate --threads 1    # d 512, 6-6 layers, vocab 8k
    .venv/bin/python -m benchmarks.bench_translate --quick        # tiny dims, a smoke run (tests/test_benchmarks.py)

Every system translates the same random source sentences (random weights) into exactly `new_tokens` tokens
(`min_new_tokens = max_new_tokens`; CTranslate2's `min_decoding_length = max_decoding_length`), in four settings:
batch 16 / batch 1, beam 4 / greedy (batch 1: `batch1_sentences` sentences one at a time). Systems are interleaved:
each round times every system once per setting, and a system's figure is its best round, in sentences per second.

Systems: `marian` (MarianMTModel of the same dims, dynamic cache); `<model>` (float32, `generate` with its default
cache: `BeamSearchCache` with beams, dynamic greedy); `<model>-int8` (`modeling_ode.quantization.quantize_int8`, the
same cache); `<model>-int8-compiled`
(int8 with `ode_transformer.translate.compile_decoding`: static cache, each greedy step compiled by transformers' `generate`;
greedy settings only, as transformers compiles no beam-search step); `ct2` / `ct2-int8` (the Marian model converted
with CTranslate2's TransformersConverter into a temporary folder; skipped with a note when ctranslate2 is not
installed: `pip install '.[bench]'`). The speed goals (`GOALS`) are checked as ratios of one run, and a torch.profiler
summary of the int8 residual model's decoding (top operators) says where its time goes.

RK goals (`RK_GOALS`): RK2 and RK4 over residual, in each system family and setting, at least
`RK_GOAL_OF_PREDICTED` of the predicted ratio, not a flat ratio. The RK models differ from residual in the encoder
only, so the prediction keeps the residual system's measured time and scales only its encoder's part by the
encoder FLOP ratio (`predict_from_encoder`): `residual-encoder`, `residual-int8-encoder` and
`residual-onnx-int8-encoder` time the residual encoder alone on the same calls, in the same rounds. A prediction
from FLOPs alone (`common.GENERATE_FLOP_FORMULA`, in the report beside it) treats the decoder's per-step cost
(beam bookkeeping, small products, Python) as if it were matmuls, and so predicts RK far slower than it runs.
The machine record names PyTorch's kernel level and the CPU's VNNI / AMX / AVX512_BF16 flags (int8 and bf16 speed
depend on them).

Writes <out-dir>/translate-<time stamp>.json and <out-dir>/translate.json/.md (the newest).

A trained model on real text is the other benchmark's, `benchmarks.bench_real_text`; `--real-text MODEL_DIR`
(the spelling older results files record) runs it.
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

from benchmarks import bench_real_text, common
from benchmarks.common import BASE_DIMS, TINY_DIMS, log, spreads, write_results
from modeling_ode.compat import raise_recompile_limit
from modeling_ode.quantization import quantize_int8
from ode_transformer.cli import positive_int
from ode_transformer.translate import compile_decoding

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
    "compile": MODELS,  # which int8 models also run compiled (each batch shape compiles anew)
}
QUICK = {
    "dims": TINY_DIMS,
    "src_len": 6,
    "new_tokens": 3,
    "batch1_sentences": 1,
    "rounds": 1,
    "compile": (),
}
# The speed goals: (name, system, over system, settings, at least)
DYNAMIC_CACHE = "-dynamic-cache"  # suffix of a system decoding with cache_implementation="dynamic"
ENCODER = "-encoder"  # suffix of a system that runs only the residual encoder of a family, on the same calls
GOALS = (
    ("residual int8 vs CTranslate2 int8, batch 16 beam 4", "residual-int8", "ct2-int8", ("batch16_beam4",), 1.0),
    ("residual int8 vs CTranslate2 int8, batch 1", "residual-int8", "ct2-int8", ("batch1_beam4", "batch1_greedy"), 0.7),
    ("residual ONNX int8 vs CTranslate2 int8, batch 16 beam 4", "residual-onnx-int8", "ct2-int8", ("batch16_beam4",), 1.0),
    ("residual ONNX int8 vs CTranslate2 int8, batch 1", "residual-onnx-int8", "ct2-int8", ("batch1_beam4", "batch1_greedy"), 0.7),
    ("residual ONNX search int8 vs CTranslate2 int8", "residual-onnx-search-int8", "ct2-int8", ("batch16_beam4", "batch1_beam4", "batch1_greedy"), 1.0),
    ("residual int8 compiled vs CTranslate2 int8, batch 1", "residual-int8-compiled", "ct2-int8", ("batch1_greedy",), 0.7),
    ("residual int8, BeamSearchCache vs transformers' dynamic cache", "residual-int8", "residual-int8" + DYNAMIC_CACHE, ("batch16_beam4", "batch1_beam4"), 1.0),
)  # fmt: skip
# The RK goals: (name, system, over system, settings); met when measured / predicted ratio is at least
# RK_GOAL_OF_PREDICTED. The model of a system is its name's first part (rk2-int8 -> rk2).
RK_GOAL_OF_PREDICTED = 0.9
# a family's encoder, timed alone: the search graph runs the ONNX int8 encoder graph, compiled decoding the int8
# model's (eager) encoder
ENCODER_OF_FAMILY = {
    "": "",
    "-int8": "-int8",
    "-onnx-int8": "-onnx-int8",
    "-onnx-search-int8": "-onnx-int8",
    "-int8-compiled": "-int8",
}
RK_GOALS = tuple(
    (f"{rk.upper()}{label} vs residual{label}", f"{rk}{suffix}", f"residual{suffix}", settings)
    for label, suffix, settings in (
        (" fp32", "", tuple(SETTINGS)),
        (" int8", "-int8", tuple(SETTINGS)),
        (" ONNX int8", "-onnx-int8", tuple(SETTINGS)),
        (" ONNX search int8", "-onnx-search-int8", tuple(SETTINGS)),
        (" int8 compiled", "-int8-compiled", GREEDY),
    )
    for rk in ("rk2", "rk4")
)


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


def encoder_system(encoder: torch.nn.Module):
    """The encoder alone on a call (`generate` runs it once per call, before expanding the beams)."""

    def encode(input_ids: torch.Tensor, attention_mask: torch.Tensor, beams: int):
        with torch.no_grad():
            return encoder(input_ids=input_ids, attention_mask=attention_mask)

    return encode


def runs_in(system: str, setting: str) -> bool:
    """Compiled systems run the greedy settings only: transformers' `generate` compiles no beam-search step. The
    dynamic-cache system runs the beam settings only: greedy search decodes with that cache anyway."""
    beams = SETTINGS[setting][1]
    return not (system.endswith("-compiled") and beams > 1) and not (
        system.endswith(DYNAMIC_CACHE) and beams == 1
    )


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
    model: torch.nn.Module,
    threads: int,
    folder: Path,
    new_tokens: int,
    profile: bool = False,
    search: bool = False,
    export: bool = True,
):
    """The model's int8 ONNX graphs (`ode-export --onnx --quantize int8`, TorchScript exporter: much quicker
    than dynamo) decoded by `ode_transformer.onnx_generation.ONNXSeq2SeqGenerator`, or with `search` by the
    search graph beside them (`ode_transformer.onnx_search_decoding.ONNXSearchGenerator`: the whole search in
    onnxruntime); exactly `new_tokens` tokens: its end-of-sentence id is one the model cannot write, and the minimum
    length is the maximum. None without the onnx extra. `export`: write the graphs into `folder` first.
    `profile`: onnxruntime profiles every run (`translate.generator.sessions`' `end_profiling` writes it)."""
    try:
        import onnxruntime

        from ode_transformer.hub.onnx_export import export_onnx
        from ode_transformer.onnx_generation import ONNXSeq2SeqGenerator
        from ode_transformer.onnx_search_decoding import ONNXSearchGenerator
    except ImportError:
        return None
    if export:
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
    if search:
        config["early_stopping"] = True
    generator = (ONNXSearchGenerator if search else ONNXSeq2SeqGenerator)(
        folder, config, session_options=options
    )

    def translate(input_ids, attention_mask, beams):
        return generator.generate(
            input_ids.numpy(),
            attention_mask.numpy(),
            num_beams=beams,
            min_new_tokens=new_tokens,
            max_new_tokens=new_tokens,
        )

    translate.generator = generator
    return translate


def onnx_kernel_times(
    threads: int, folder: Path, setup: dict, setting: str, model_name: str, search: bool = False
) -> list[tuple]:
    """onnxruntime's profile of `model_name`'s int8 graphs (build_systems' weights) over one call set: (graph file,
    operator type, microseconds) per node run; with `search`, of the search graph (its subgraphs' nodes, and the
    BeamSearch node, whose time includes theirs)."""
    torch.manual_seed(0)  # the weights of build_systems' models
    model = common.build_model(model_name, setup["dims"]).eval()
    translate = onnx_int8_system(model, threads, folder, setup["new_tokens"], profile=True, search=search)
    beams = SETTINGS[setting][1]
    for ids, mask in inputs_for(setting, setup):
        translate(ids, mask, beams)
    return [
        (graph, event["args"]["op_name"], event["dur"])
        for graph, session in translate.generator.sessions.items()
        for event in json.loads(Path(session.end_profiling()).read_text())
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time")
    ]


SEARCH_OP = "BeamSearch (its own work)"


def onnx_profile_top_ops(
    threads: int, folder: Path, setup: dict, setting: str, rows: int = 12, search: bool = False
) -> list[dict]:
    """The residual model's int8 graphs over one call set: kernel time per operator type, summed over the graphs'
    nodes (where the ONNX path's time goes). With `search`, the search graph's: the BeamSearch node's own work
    (the search, and the beams' cache it gathers each step) is its time less its subgraphs' nodes'."""
    per_op: dict[str, list[float]] = {}
    for _, op, microseconds in onnx_kernel_times(threads, folder, setup, setting, "residual", search):
        per_op.setdefault(op, []).append(microseconds)
    if search and "BeamSearch" in per_op:
        inside = sum(sum(times) for op, times in per_op.items() if op != "BeamSearch")
        runs = per_op.pop("BeamSearch")
        per_op[SEARCH_OP] = [(sum(runs) - inside) / len(runs)] * len(runs)
    total = sum(sum(times) for times in per_op.values())
    ranked = sorted(per_op.items(), key=lambda item: sum(item[1]), reverse=True)[:rows]
    return [
        {"op": op, "self_ms": sum(times) / 1e3, "share": sum(times) / total, "calls": len(times)}
        for op, times in ranked
    ]


def onnx_graph_ms(threads: int, folder: Path, setup: dict, setting: str) -> dict[str, dict[str, float]]:
    """Per model, the int8 graphs' kernel milliseconds over one call set, by graph: where RK's extra time goes in
    ONNX (the encoder's extra stages, or the decoder), against the FLOP prediction's encoder / decoder split."""
    out = {}
    for name in MODELS:
        per_graph: dict[str, float] = {}
        for graph, _, microseconds in onnx_kernel_times(threads, folder / name, setup, setting, name):
            per_graph[graph] = per_graph.get(graph, 0.0) + microseconds / 1e3
        out[name] = per_graph
    return out


def build_systems(setup: dict, threads: int, folder: Path) -> tuple[dict, list[str]]:
    dims, new_tokens = setup["dims"], setup["new_tokens"]
    torch.manual_seed(0)
    marian = common.build_model("marian", dims).eval()
    systems = {"marian": torch_system(marian, new_tokens)}
    for name in MODELS:
        torch.manual_seed(0)
        model = common.build_model(name, dims).eval()
        systems[name] = torch_system(model, new_tokens)
        if name == "residual":
            systems[f"{name}{ENCODER}"] = encoder_system(model.get_encoder())
        # int8 with the default cache: in eager mode the static cache was slower at batch 1 (every step attends over
        # and reorders the whole preallocated length), and fbgemm's packed weights cannot be compiled
        int8 = quantize_int8(copy.deepcopy(model))
        systems[f"{name}-int8"] = torch_system(int8, new_tokens)
        if name == "residual":
            systems[f"{name}-int8{ENCODER}"] = encoder_system(int8.get_encoder())
        if name == "residual":  # what BeamSearchCache saves: the same model with transformers' dynamic cache
            systems[f"{name}-int8{DYNAMIC_CACHE}"] = torch_system(
                int8, new_tokens, cache_implementation="dynamic"
            )
        if name in setup["compile"]:
            # the three models share one forward (dynamo's cache entries are per code object, guarded by model)
            raise_recompile_limit(64)
            compiled = compile_decoding(quantize_int8(copy.deepcopy(model)))
            systems[f"{name}-int8-compiled"] = torch_system(compiled, new_tokens)
        onnx_int8 = onnx_int8_system(model, threads, folder / f"{name}-onnx", new_tokens)
        if onnx_int8 is not None:
            systems[f"{name}-onnx-int8"] = onnx_int8
            if name == "residual":
                systems[f"{name}-onnx-int8{ENCODER}"] = encoder_system(
                    onnx_int8.generator.model.get_encoder()
                )
            systems[f"{name}-onnx-search-int8"] = onnx_int8_system(
                model, threads, folder / f"{name}-onnx", new_tokens, search=True, export=False
            )
    ct2, note = ct2_systems(marian, dims, threads, folder, new_tokens)
    systems.update(ct2)
    notes = [
        note,
        f"int8 compiled (ode_transformer.translate.compile_decoding), greedy only: {', '.join(setup['compile']) or 'none'}",
        "onnx-int8: ode-export --onnx --quantize int8 (TorchScript exporter, fused graphs), decoded with "
        "ONNXSeq2SeqGenerator; onnx-search-int8: the search graph it writes beside them (ONNXSearchGenerator)"
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
    """`common.run_rounds` of the systems on `inputs_for`'s random batches, in every setting each system runs in;
    and the new tokens of each system's first output (every system must make exactly `new_tokens`)."""
    new_tokens = {setting: {} for setting in SETTINGS}

    def count(setting: str, name: str, output, call: tuple) -> None:
        if not name.endswith(ENCODER):
            new_tokens[setting][name] = count_tokens(output, len(call[0]), SETTINGS[setting][1])

    seconds = common.run_rounds(
        systems, SETTINGS, setup["rounds"], lambda setting: inputs_for(setting, setup), runs_in, count
    )
    return {"seconds_all": seconds, "new_tokens": new_tokens}


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


def predict_from_encoder(seconds: dict, flops: dict, model: str, suffix: str) -> dict | None:
    """The predicted speed of `model` over residual in the family of systems ending in `suffix`, from one
    setting's best times: the residual system's T, of which its encoder (the family's encoder system, timed alone)
    takes E; `model`'s encoder does r times the encoder's matmul FLOPs, the decoder the same work, so
    predicted = T / (T + (r - 1) E). `extra_share`: (r - 1) E of the predicted time. None where a system did not
    run."""
    residual, encoder = f"residual{suffix}", f"residual{ENCODER_OF_FAMILY[suffix]}{ENCODER}"
    if residual not in seconds or encoder not in seconds:
        return None
    total, part = min(seconds[residual]), min(seconds[encoder])
    extra = (flops[model]["encoder"] / flops["residual"]["encoder"] - 1) * part
    return {"predicted": total / (total + extra), "extra_share": extra / (total + extra), "encoder": encoder}


def goals(results: dict) -> list[dict]:
    """Every goal in every setting: the measured speed ratio; for the RK goals also the predicted ratio
    (`predict_from_encoder`), the FLOP-only one (`flop_prediction`) and measured / predicted, which is what
    `at_least` bounds there (`measure`: "ratio" or "of_predicted")."""
    out = []
    speed, spreads = results["sentences_per_s"], results.get("spread", {})
    rows = [(label, system, over, settings, least, None) for label, system, over, settings, least in GOALS]
    for label, system, over, settings in RK_GOALS:
        rows.append((label, system, over, settings, RK_GOAL_OF_PREDICTED, system.split("-")[0]))
    for label, system, over, settings, least, model in rows:
        for setting in settings:
            flop_prediction = results["flop_prediction"][setting]
            row = {
                "goal": label,
                "setting": setting,
                "measure": "of_predicted" if model else "ratio",
                "at_least": least,
                "predicted": None,
                "flop_predicted": flop_prediction["predicted_vs_residual"][model] if model else None,
                "ratio": None,
                "of_predicted": None,
                "met": None,
            }
            prediction = model and predict_from_encoder(
                results["seconds_all"][setting], flop_prediction["flops"], model, system[len(model) :]
            )
            if system in speed[setting] and over in speed[setting] and (prediction or not model):
                row["ratio"] = speed[setting][system] / speed[setting][over]
                if model:
                    row["predicted"] = prediction["predicted"]
                    row["of_predicted"] = row["ratio"] / prediction["predicted"]
                row["met"] = row[row["measure"]] >= least
                if model and setting in spreads:
                    share = prediction["extra_share"]
                    spread = spreads[setting]
                    row.update(
                        noise_flag(row, spread[system], spread[over], spread[prediction["encoder"]], share)
                    )
            out.append(row)
    return out


def noise_flag(
    row: dict, system: dict, residual: dict, encoder: dict | None = None, share: float = 0.0
) -> dict:
    """An RK row's `allowed` deviation, the relative spreads over the rounds of the two systems and of the encoder
    the prediction scales (weighted by its `share` of the predicted time) added, and whether it is `noise`: an RK
    system cannot beat residual (it does more work), nor its prediction, by more than that; such a row is no
    result (`met` None)."""
    allowed = system["relative"] + residual["relative"] + (encoder["relative"] * share if encoder else 0.0)
    noise = row["ratio"] > 1 + allowed or row["of_predicted"] > 1 + allowed
    return {"allowed": allowed, "noise": noise, **({"met": None} if noise else {})}


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
    lines += spread_table(results, SETTINGS)
    lines += [
        "",
        "## FLOPs of RK over residual",
        "",
        "Matmul FLOPs of each setting's calls (`common.GENERATE_FLOP_FORMULA`): the encoder runs RK2's and RK4's",
        "2 and 4 evaluations of F per layer once per sentence, the (Euler) decoder the same work for all three;",
        "predicted = residual FLOPs / RK FLOPs, a FLOP-only prediction: it counts the decoder's per-step cost",
        "(beam bookkeeping, small products, Python) as if it were matmuls. The goals below use the encoder FLOP",
        "ratio alone, on the residual encoder's measured time.",
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
        f"RK rows: met at measured / predicted >= {RK_GOAL_OF_PREDICTED}; the others: the ratio itself.",
        "RK rows' prediction: residual's best time T, its encoder's best time alone E (the family's",
        "`residual*-encoder` row), the RK encoder's FLOP ratio r: T / (T + (r - 1) E); FLOP-only: the table above.",
        "",
        "RK rows: flagged **noise**, not a result, where RK beats residual, or its prediction, by more than the",
        "rounds' spreads allow (allowed = the two systems' (worst - best) / best times added, and the encoder row's",
        "weighted by its extra stages' share of the predicted time).",
        "",
        "| goal | setting | ratio | predicted | FLOP-only predicted | measured / predicted | allowed | goal | met |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for goal in results["goals"]:
        ratio = "n/a" if goal["ratio"] is None else f"{goal['ratio']:.2f}"
        predicted = "-" if goal["predicted"] is None else f"{goal['predicted']:.3f}"
        flop_only = "-" if goal["flop_predicted"] is None else f"{goal['flop_predicted']:.3f}"
        of_predicted = "-" if goal["flop_predicted"] is None else "n/a"
        if goal["of_predicted"] is not None:
            of_predicted = f"{goal['of_predicted']:.2f}"
        target = f">= {goal['at_least']}" + (" of predicted" if goal["measure"] == "of_predicted" else "")
        short = goal["at_least"] - (goal[goal["measure"]] or 0)
        met = {None: "n/a", True: "met", False: f"**unmet** (short by {short:.2f})"}[goal["met"]]
        met = "**noise**" if goal.get("noise") else met
        allowed = f"{goal['allowed']:.2f}" if goal.get("allowed") is not None else "-"
        lines.append(
            f"| {goal['goal']} | {goal['setting']} | {ratio} | {predicted} | {flop_only} | {of_predicted} | {allowed} | "
            f"{target} | {met} |"
        )
    profiles = (  # (results key, system, profiler, the columns for time and count)
        ("profiles", "residual-int8", "torch.profiler, self CPU time", "self ms", "calls"),
        (
            "onnx_profiles",
            "residual-onnx-int8",
            "onnxruntime's profiler, kernel time by operator type",
            "ms",
            "nodes run",
        ),
        (
            "onnx_search_profiles",
            "residual-onnx-search-int8",
            "onnxruntime's profiler, kernel time by operator type",
            "ms",
            "nodes run",
        ),
    )
    for key, system, profiler, time_column, count_column in profiles:
        for setting, ops in results.get(key, {}).items():
            lines += ["", f"## Profile: {system}, {setting.replace('_', ', ')} ({profiler})", ""]
            lines += [f"| operator | {time_column} | share | {count_column} |", "|---|---:|---:|---:|"]
            lines += [f"| {o['op']} | {o['self_ms']:.1f} | {o['share']:.1%} | {o['calls']} |" for o in ops]
    for setting, by_model in results.get("onnx_graph_ms", {}).items():
        lines += graph_table(setting, by_model, results["flop_prediction"][setting]["flops"])
    return "\n".join(lines) + "\n"


def spread_table(results: dict, settings) -> list[str]:
    """Each system's sentences/s over the rounds, worst / median / best, and the rounds' order."""
    lines = [
        "",
        f"## Spread over the {results['setup']['rounds']} rounds (sentences/s: worst / median / best)",
        "",
        "Each round times every system once per setting, starting one system later than the round before.",
        "",
    ]
    lines += ["| system | " + " | ".join(s.replace("_", ", ") for s in settings) + " |"]
    lines += ["|---|" + "---:|" * len(settings)]
    for name in results["systems"]:
        cells = []
        for setting in settings:
            found = results["spread"][setting].get(name)
            cells.append(f"{found['min']:.2f} / {found['median']:.2f} / {found['max']:.2f}" if found else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def graph_table(setting: str, by_model: dict, flops: dict) -> list[str]:
    """ONNX int8 kernel time by graph, each RK model over residual, beside the FLOP ratio of the same part (the
    encoder graph; the two decoder graphs together)."""
    parts = {
        "encoder": ("encoder_model.onnx",),
        "decoder": ("decoder_model.onnx", "decoder_with_past_model.onnx"),
    }
    lines = [
        "",
        f"## ONNX int8 kernel time by graph, {setting.replace('_', ', ')} (onnxruntime's profiler)",
        "",
    ]
    lines += ["Milliseconds over the setting's calls; ratio = RK / residual, time and matmul FLOPs.", ""]
    lines += [
        "| part | "
        + " | ".join(f"{m} ms" for m in MODELS)
        + " | "
        + " | ".join(f"{m} time ratio | {m} FLOP ratio" for m in MODELS[1:])
        + " |"
    ]
    lines += ["|---|" + "---:|" * (len(MODELS) + 2 * (len(MODELS) - 1))]
    for part, graphs in parts.items():
        ms = {m: sum(by_model[m].get(g, 0.0) for g in graphs) for m in MODELS}
        ratios = [
            f"{ms[m] / ms['residual']:.2f} | {flops[m][part] / flops['residual'][part]:.2f}"
            for m in MODELS[1:]
        ]
        lines.append(
            f"| {part} | " + " | ".join(f"{ms[m]:.1f}" for m in MODELS) + " | " + " | ".join(ratios) + " |"
        )
    return lines


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_translate", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="tiny dims, one round: a smoke run")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch (and CTranslate2) threads; the issue's: 1"
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument(
        "--rounds", type=positive_int, default=None, help="interleaved rounds (default 3; --quick 1)"
    )
    parser.add_argument(
        "--no-compiled",
        action="store_true",
        help="leave out the compiled int8 systems (10-60 s of compiling per batch shape): a shorter run",
    )
    parser.add_argument(
        "--real-text",
        type=Path,
        metavar="MODEL_DIR",
        help="run the real-text benchmark instead, with the flags that follow: python -m benchmarks.bench_real_text "
        "MODEL_DIR (the older results files record this spelling)",
    )
    argv = sys.argv[1:] if argv is None else list(argv)
    args, real_text_flags = parser.parse_known_args(argv)
    if args.real_text is not None:
        return real_text_benchmark(args, real_text_flags)
    if real_text_flags:
        parser.error(f"unrecognized arguments: {' '.join(real_text_flags)}")
    machine = common.machine_info()  # the load average before this run adds its own
    common.configure_process(args.threads, "keep-freed")
    machine["torch_threads"] = torch.get_num_threads()
    setup = QUICK if args.quick else FULL
    if args.rounds is not None:
        setup = {**setup, "rounds": args.rounds}
    if args.no_compiled:
        setup = {**setup, "compile": ()}
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
        search_profiles = (
            {
                setting: onnx_profile_top_ops(
                    args.threads, Path(folder) / f"search-{setting}", setup, setting, search=True
                )
                for setting in ("batch16_beam4", "batch1_greedy")
            }
            if "residual-onnx-search-int8" in systems
            else {}
        )
        # where RK4's ONNX time goes where it falls short of its FLOP prediction
        onnx_graphs = (
            {"batch16_greedy": onnx_graph_ms(args.threads, Path(folder) / "graphs", setup, "batch16_greedy")}
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
        + f" --threads {args.threads}"
        + (f" --rounds {args.rounds}" if args.rounds else "")
        + (" --no-compiled" if args.no_compiled else ""),
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
        "spread": spreads(measured["seconds_all"], sentences),
        "profiles": profiles,
        "onnx_profiles": onnx_profiles,
        "onnx_search_profiles": search_profiles,
        "onnx_graph_ms": onnx_graphs,
        "flop_formula": common.GENERATE_FLOP_FORMULA,
        "flop_prediction": flop_prediction(setup),
        "wall_s": time.time() - begin,
    }
    results["goals"] = goals(results)
    write_results(results, args.out_dir, "translate", markdown(results))
    return results


def real_text_benchmark(args: argparse.Namespace, flags: list[str]) -> dict:
    """`--real-text MODEL_DIR FLAGS`: `python -m benchmarks.bench_real_text MODEL_DIR FLAGS`, the shared flags passed
    on (`--no-compiled` has no real-text systems to leave out)."""
    shared = ["--threads", str(args.threads), "--out-dir", str(args.out_dir)]
    shared += ["--quick"] * args.quick + (["--rounds", str(args.rounds)] if args.rounds else [])
    return bench_real_text.main([str(args.real_text), *shared, *flags])


if __name__ == "__main__":
    main()
