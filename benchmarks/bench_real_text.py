"""Translation speed and quality on real text: a trained model folder on real sentences of real lengths, decoded
as `ode-translate` decodes (its tokenization, batches sorted by length, `generate_ids`, early stopping at EOS and the
generation config's max length; length penalty 0.6 with beams), in two settings (batch 16 beam 4, batch 1 greedy)
and four paths: PyTorch float32 and int8 (`load_for_generation`), ONNX float32 and int8 (the folder's graphs
exported into a temporary folder, decoded by `load_onnx_for_generation`, as `ode-translate --backend onnx`).

    .venv/bin/python -m ode_transformer.train.demo --output_dir outputs/libreoffice_demo   # the demo model
    .venv/bin/python -m benchmarks.bench_real_text outputs/libreoffice_demo --threads 1
        # 256 test sentences, best of 3, quality on the whole test split (an idle machine for the speeds)
    .venv/bin/python -m benchmarks.bench_real_text outputs/libreoffice_demo --sentences 64 --rounds 2 \
        --quality-sentences 0 --out-dir /tmp/real   # a short look at the speeds only

The same interleaved rounds as the synthetic benchmark (`benchmarks.bench_translate`; `common.run_rounds`), best
round; then BLEU / chrF (sacrebleu, as `ode_transformer.train.metrics` scores the demo) of float32, PyTorch int8
and ONNX int8 on the whole test split (batch 16, beam 4). Goals: each int8 path within `BLEU_WITHIN` BLEU of
float32, and the backend `ode-translate --backend auto` picks (ode_transformer/translate.py `FASTEST`) is the
faster one measured at each setting and precision: where a row is unmet, refill `FASTEST` from this run's speeds.
Writes <out-dir>/translate-real-<time stamp>.json and translate-real.json/.md.

`python -m benchmarks.bench_translate --real-text MODEL_DIR ...`, the command the older results files record, runs
this benchmark too.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.common import log
from ode_transformer.cli import positive_int

RESULTS = Path(__file__).resolve().parent / "results"

REAL_SETTINGS = {"batch16_beam4": (16, 4), "batch1_greedy": (1, 1)}  # name -> (batch size, beams)
REAL_FULL = {"sentences": 256, "rounds": 3, "quality_sentences": None}  # None: the whole test split
REAL_QUICK = {"sentences": 4, "rounds": 1, "quality_sentences": 4}
LENGTH_PENALTY = 0.6  # the demo's (train/recipes/libreoffice_demo.yaml), in speed and quality alike
REAL_SYSTEMS = {  # name -> (ode-translate --backend, --quantize)
    "pytorch-fp32": ("pytorch", None),
    "pytorch-int8": ("pytorch", "int8"),
    "onnx-fp32": ("onnx", None),
    "onnx-int8": ("onnx", "int8"),
}
QUALITY_SYSTEMS = ("pytorch-fp32", "pytorch-int8", "onnx-int8")
# dynamic int8 quantises each batch as a whole: its hypotheses depend on batching
QUALITY_SETTING = "batch16_beam4"
BLEU_WITHIN = 0.3  # each int8 path's BLEU within this of fp32's


def real_sentences(test_files: list[Path] | None) -> tuple[list[str], list[str], str]:
    """Sources, references and where they come from: the demo's test split (the LibreOffice-help corpus that
    `ode_transformer.train.demo` trains and scores on), or two parallel text files."""
    if test_files:
        from ode_transformer.files import read_lines

        sources, references = (read_lines(path) for path in test_files)
        if len(sources) != len(references) or not sources:
            raise SystemExit(f"--test-files: {len(sources)} sources against {len(references)} references")
        return sources, references, f"{test_files[0]} / {test_files[1]}"
    from ode_transformer.train.data import libreoffice

    test = libreoffice("test")
    return list(test["source"]), list(test["target"]), "the demo's LibreOffice-help test split (en-de)"


def real_systems(model_dir: str, threads: int, folder: Path) -> tuple[dict, list[str]]:
    """{name: (model, tokenizer)} of REAL_SYSTEMS, loaded as `ode-translate --backend B [--quantize int8]` loads
    them (the ONNX graphs exported into `folder`, where ode-export would write MODEL/onnx); the ONNX rows are
    skipped with a note without the onnx extra."""
    from ode_transformer.translate import load_for_generation, load_onnx_for_generation

    systems, notes = {}, []
    for name, (backend, quantize) in REAL_SYSTEMS.items():
        if backend == "pytorch":
            systems[name] = load_for_generation(model_dir, quantize=quantize)
            continue
        try:
            from ode_transformer.hub.onnx_export import export_onnx
        except ImportError:
            notes.append(f"{name}: the onnx extra is not installed (pip install '.[onnx]'): skipped")
            continue
        graphs = folder / name
        # the TorchScript exporter, as the synthetic rows: much quicker than dynamo, the same operators
        export_onnx(systems["pytorch-fp32"][0], graphs, dynamo=False, quantize=quantize)
        systems[name] = load_onnx_for_generation(model_dir, quantize, graphs=graphs, threads=threads)
    return systems, notes


def decode_system(model) -> object:
    """A system of `run_rounds`: one batch of token-id sequences through `generate_ids`, ode-translate's decoder
    (padding, the generation config's max length and early stopping at EOS), with the beams of the setting."""
    from ode_transformer.translate import generate_ids

    def translate(sequences, beams):
        penalty = {"length_penalty": LENGTH_PENALTY} if beams > 1 else {}
        return generate_ids(model, sequences, batch_size=len(sequences), num_beams=beams, **penalty)

    return translate


def real_calls(setting: str, setup: dict) -> list[tuple[list[list[int]]]]:
    """A setting's calls: the sentences in ode-translate's batches (`length_batches`: longest first)."""
    from ode_transformer.translate import length_batches

    sequences = setup["sequences"]
    batches = length_batches([len(ids) for ids in sequences], REAL_SETTINGS[setting][0])
    return [([sequences[i] for i in batch],) for batch in batches]


def quality(systems: dict, sources: list[str], references: list[str]) -> dict:
    """BLEU and chrF (sacrebleu, as `ode_transformer.train.metrics` scores the demo) of QUALITY_SYSTEMS on
    `sources`, decoded as `ode-translate` decodes (QUALITY_SETTING's batch and beams, LENGTH_PENALTY)."""
    from ode_transformer.train import metrics
    from ode_transformer.translate import generate_texts

    batch, beams = REAL_SETTINGS[QUALITY_SETTING]
    out = {}
    for name in QUALITY_SYSTEMS:
        if name not in systems:
            continue
        begin = time.perf_counter()
        hypotheses = generate_texts(
            *systems[name], sources, batch_size=batch, num_beams=beams, length_penalty=LENGTH_PENALTY
        )
        bleu = metrics.sacrebleu_score(hypotheses, references)
        out[name] = {
            "bleu": bleu["score"],
            "chrf": metrics.chrf_score(hypotheses, references)["score"],
            "bleu_signature": bleu["signature"],
            "sentences": len(sources),
            "seconds": time.perf_counter() - begin,
        }
        log(f"quality {name}: BLEU {out[name]['bleu']:.2f}, chrF {out[name]['chrf']:.2f}")
    return out


def real_goals(results: dict) -> list[dict]:
    """The goals on real text: each int8 path's BLEU within BLEU_WITHIN of fp32's, and, per setting and
    precision, the backend ode-translate's table (`FASTEST`) picks is the faster one measured."""
    from ode_transformer.translate import fastest_backend

    rows = []
    scores = results["quality"]
    for name in QUALITY_SYSTEMS[1:]:
        difference = None
        if name in scores and "pytorch-fp32" in scores:
            difference = scores[name]["bleu"] - scores["pytorch-fp32"]["bleu"]
        rows.append(
            {
                "goal": f"{name} BLEU within {BLEU_WITHIN} of pytorch-fp32",
                "setting": "quality",
                "value": difference,
                "met": None if difference is None else abs(difference) <= BLEU_WITHIN,
            }
        )
    for setting in REAL_SETTINGS:
        batch, beams = REAL_SETTINGS[setting]
        for precision, suffix in (("float32", "fp32"), ("int8", "int8")):
            picked, _ = fastest_backend(batch, beams, precision)
            speeds = {
                b: results["sentences_per_s"][setting].get(f"{b}-{suffix}") for b in ("pytorch", "onnx")
            }
            fastest = max(speeds, key=speeds.get) if None not in speeds.values() else None
            rows.append(
                {
                    "goal": f"ode-translate --backend auto ({precision}) picks the faster path (ode_transformer/translate.py FASTEST)",
                    "setting": setting,
                    "value": {"picked": picked, "fastest": fastest, "sentences_per_s": speeds},
                    "met": None if fastest is None else picked == fastest,
                }
            )
    return rows


def real_markdown(results: dict) -> str:
    m, setup = results["machine"], results["setup"]
    lengths = setup["source_tokens"]
    lines = [
        "# Translation speed and quality on real text (sentences/s)",
        "",
        f"`{results['command']}` on {m['cpu_model']} ({m['logical_cores']} logical cores; {common.describe_cpu(m)}), "
        f"{results['threads']} thread(s), torch {m['torch']}, transformers {m['transformers']}"
        f"{', onnxruntime ' + results['onnxruntime'] if results['onnxruntime'] else ''}. Model {results['model']} "
        f"({results['model_summary']}); {setup['sentences']} sentences of {results['text']} (source {lengths['min']}-"
        f"{lengths['max']} tokens, median {lengths['median']}), in ode-translate's batches sorted by length, decoded "
        f"as ode-translate decodes (early stopping at EOS, the generation config's max length; length penalty "
        f"{LENGTH_PENALTY} with beams); best of {setup['rounds']} interleaved rounds.",
        "",
    ]
    if m["load_average_at_start"][0] > 1.5:
        lines += [
            f"**The machine had other load: load average {m['load_average_at_start'][0]:.2f} at the start.**",
            "",
        ]
    lines += [f"- {note}" for note in results["notes"]] + [""]
    lines += ["| system | " + " | ".join(s.replace("_", ", ") for s in REAL_SETTINGS) + " |"]
    lines += ["|---|" + "---:|" * len(REAL_SETTINGS)]
    for name in results["systems"]:
        cells = [f"{results['sentences_per_s'][s][name]:.2f}" for s in REAL_SETTINGS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    batch, beams = REAL_SETTINGS[QUALITY_SETTING]
    lines += ["", f"## Quality (batch {batch}, beam {beams}, length penalty {LENGTH_PENALTY})", ""]
    if results["quality"]:
        lines += ["| system | BLEU | chrF | sentences |", "|---|---:|---:|---:|"]
        for name, q in results["quality"].items():
            lines.append(f"| {name} | {q['bleu']:.2f} | {q['chrf']:.2f} | {q['sentences']} |")
        lines += ["", f"BLEU signature: `{next(iter(results['quality'].values()))['bleu_signature']}`"]
    else:
        lines.append("Not measured in this run (--quality-sentences 0).")
    lines += ["", "## Goals", "", "| goal | setting | measured | met |", "|---|---|---|---|"]
    for goal in results["goals"]:
        value = goal["value"]
        if isinstance(value, dict):
            value = f"picks {value['picked']}; fastest {value['fastest']}"
        elif value is not None:
            value = f"{value:+.2f} BLEU"
        met = {None: "n/a", True: "met", False: "**unmet**"}[goal["met"]]
        lines.append(f"| {goal['goal']} | {goal['setting'].replace('_', ', ')} | {value or 'n/a'} | {met} |")
    lines += ["", "ode-translate's table (ode_transformer/translate.py `FASTEST`, as of this run):", ""]
    lines += ["| batch, beams | float32 | int8 |", "|---|---|---|"]
    for setting, picks in results["fastest_table"].items():
        lines.append(f"| {setting} | {picks.get('float32', '-')} | {picks.get('int8', '-')} |")
    return "\n".join(lines) + "\n"


def run_real_text(args: argparse.Namespace, argv: list[str], machine: dict) -> dict:
    """Speed of REAL_SYSTEMS in REAL_SETTINGS, quality of QUALITY_SYSTEMS, their goals; the results written."""
    from ode_transformer.translate import FASTEST, encode_texts

    setup = dict(REAL_QUICK if args.quick else REAL_FULL)
    setup.update(
        {k: v for k in ("sentences", "rounds", "quality_sentences") if (v := getattr(args, k)) is not None}
    )
    sources, references, text = real_sentences(args.test_files)
    begin = time.time()
    with tempfile.TemporaryDirectory(prefix="bench_real_text_") as folder:
        systems, notes = real_systems(str(args.model_dir), args.threads, Path(folder))
        model, tokenizer = systems["pytorch-fp32"]
        # the split's first sentences, tokenized as ode-translate tokenizes them
        setup["sequences"] = encode_texts(model, tokenizer, sources[: setup["sentences"]])
        log(f"systems: {', '.join(systems)}")
        seconds_all = common.run_rounds(
            {name: decode_system(m) for name, (m, _) in systems.items()},
            REAL_SETTINGS,
            setup["rounds"],
            lambda setting: real_calls(setting, setup),
        )
        count = len(sources) if setup["quality_sentences"] is None else setup["quality_sentences"]
        scores = quality(systems, sources[:count], references[:count]) if count else {}
    lengths = sorted(len(ids) for ids in setup.pop("sequences"))
    setup["sentences"] = len(lengths)
    setup["source_tokens"] = {"min": lengths[0], "median": lengths[len(lengths) // 2], "max": lengths[-1]}
    config = model.config
    onnxruntime = importlib.util.find_spec("onnxruntime") and __import__("onnxruntime").__version__
    results = {
        "command": " ".join(["python -m benchmarks.bench_real_text", *argv]),
        "machine": machine,
        "threads": args.threads,
        "onnxruntime": onnxruntime or None,
        "model": str(args.model_dir),
        "model_summary": f"d {config.d_model}, {config.encoder_layers}-{config.decoder_layers} layers, encoder "
        f"{config.encoder_ode_method}, {model.num_parameters() / 1e6:.1f}M parameters",
        "text": text,
        "setup": setup,
        "settings": {name: dict(zip(("batch", "beams"), REAL_SETTINGS[name])) for name in REAL_SETTINGS},
        "systems": list(systems),
        "notes": notes,
        "seconds_all": seconds_all,
        "sentences_per_s": {
            setting: {name: setup["sentences"] / min(t) for name, t in per_system.items()}
            for setting, per_system in seconds_all.items()
        },
        "spread": common.spreads(seconds_all, dict.fromkeys(seconds_all, setup["sentences"])),
        "quality": scores,
        "fastest_table": {f"{b}, {k}": picks for (b, k), picks in FASTEST.items()},
        "wall_s": time.time() - begin,
    }
    results["goals"] = real_goals(results)
    common.write_results(
        results,
        args.out_dir,
        "translate-real",
        real_markdown(results),
    )
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_real_text", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "model_dir",
        type=Path,
        metavar="MODEL_DIR",
        help="a trained model folder (the demo's: python -m ode_transformer.train.demo)",
    )
    parser.add_argument("--quick", action="store_true", help="few sentences, one round: a smoke run")
    parser.add_argument("--threads", type=int, default=1, help="torch (and onnxruntime) threads")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument(
        "--rounds", type=positive_int, default=None, help="interleaved rounds (default 3; --quick 1)"
    )
    parser.add_argument("--sentences", type=positive_int, default=None, help="sentences timed (default 256)")
    parser.add_argument(
        "--quality-sentences",
        type=int,
        default=None,
        help="sentences scored for BLEU / chrF (default: the whole test split; 0: none)",
    )
    parser.add_argument(
        "--test-files",
        type=Path,
        nargs=2,
        metavar=("SOURCE", "REFERENCE"),
        help="parallel text files in place of the demo's test split",
    )
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    machine = common.machine_info()  # the load average before this run adds its own
    common.configure_process(args.threads, "keep-freed")
    machine["torch_threads"] = torch.get_num_threads()
    return run_real_text(args, argv, machine)


if __name__ == "__main__":
    main()
