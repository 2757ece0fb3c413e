"""The README's main job (``make demo``): train a small ODE Transformer on CPU and evaluate it.

``python -m ode_transformer.train.demo [--max_steps N] [--output_dir DIR] [ode_transformer.train.run flags ...]``

1. builds the English-German LibreOffice-help corpus (``.cache/libreoffice-help``);
2. trains a joint BPE (8k) on its training split;
3. trains an RK2-gated encoder / Euler decoder model (d 192, 3-3 layers, 2K-token batches; bf16 autocast where
   the CPU computes bf16 natively, fp32 elsewhere: ``--precision auto``, :mod:`ode_transformer.precision`) with the recipe
   ``train/recipes/libreoffice_demo.yaml`` for exactly its ``max_steps`` (900) or ``--max_steps`` updates (a step budget, not a time budget: the same seed and steps give the same
   model on every machine of a kind, however busy; the progress bar's total is the real end);
4. translates the held-out test split (beam 4, length penalty 0.6, fp32) and scores it with
   sacreBLEU and chrF, next to a copy-the-source baseline (the English source as "translation");
5. writes the model folder (weights, tokenizer, generation config, model card, metrics, loss
   curves) and prints a summary with a few example translations. The summary (``demo_summary.json``) records
   the recipe, seed, arguments, git commit, device and wall time; ``--results FILE`` writes a copy there
   (``results/demo/cpu.json`` is the committed one that the README quotes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import transformers

from ode_transformer.cli import output_problem
from ode_transformer.files import write_atomic
from ode_transformer.precision import choose_precision

from . import metrics
from .arguments import parse_arguments
from .data import libreoffice
from .libreoffice_corpus import build_corpus
from .provenance import REPO, device_info, git_commit
from .run import run

RECIPE = Path(__file__).resolve().parent / "recipes" / "libreoffice_demo.yaml"
EXAMPLES = (
    "Click OK to close the dialog.",
    "Select the cells that you want to format.",
    "Choose Tools - Options - LibreOffice Writer - General.",
    "The chart is inserted into the current document.",
)


def parse_demo_arguments(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """Demo flags; anything else is passed on to ``ode_transformer.train.run`` (e.g. ``--preset tiny``)."""
    parser = argparse.ArgumentParser(
        prog="python -m ode_transformer.train.demo", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--output_dir", default="outputs/libreoffice_demo")
    parser.add_argument(
        "--max_steps", type=int, default=None, help="training updates (default: the recipe's max_steps)"
    )
    parser.add_argument(
        "--max_test_samples", type=int, default=None, help="score only the first N test pairs"
    )
    parser.add_argument("--results", help="also write the summary to this JSON file (e.g. demo-cpu.json)")
    demo_args, passthrough = parser.parse_known_args(argv)
    if demo_args.results == "-":
        parser.error("--results -: the summary is printed already; give a file name")
    if demo_args.results and (problem := output_problem(demo_args.results, {})) is not None:
        parser.error(problem)  # before the quarter of an hour of training, not after it
    return demo_args, passthrough


def copy_baseline(max_test_samples: int | None) -> dict[str, float]:
    """BLEU/chrF of the untranslated English source against the German references."""
    test = libreoffice("test")
    if max_test_samples is not None:
        test = test.select(range(min(max_test_samples, len(test))))
    sources, refs = list(test["source"]), list(test["target"])
    return {
        "bleu": metrics.sacrebleu_score(sources, refs)["score"],
        "chrf": metrics.chrf_score(sources, refs)["score"],
    }


@torch.no_grad()
def translate(model_dir: str, sentences: tuple[str, ...]) -> tuple[list[str], int]:
    """Translate a few sentences with the saved model and its generation config; also its size."""
    from transformers import AutoTokenizer

    from modeling_ode import ODETransformerForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = ODETransformerForConditionalGeneration.from_pretrained(model_dir).eval()
    batch = tokenizer(list(sentences), return_tensors="pt", padding=True)
    output = model.generate(**batch)
    return tokenizer.batch_decode(output, skip_special_tokens=True), model.num_parameters()


def _summary(document: dict, baseline: dict, model_dir: str) -> dict:
    scores = {r["metric"]: r["value"] for r in document["results"]}
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return {
        "bleu": scores["sacrebleu"],
        "chrf": scores["chrf"],
        "copy_baseline_bleu": baseline["bleu"],
        "copy_baseline_chrf": baseline["chrf"],
        "steps": document["training"]["recipe"]["steps"],
        "layers": f"{config['encoder_layers']}-{config['decoder_layers']}",
        "d_model": config["d_model"],
        "bleu_signature": next(r["signature"] for r in document["results"] if r["metric"] == "sacrebleu"),
        "decoding": document["decoding"],
        "train_seconds": round(
            json.loads((Path(model_dir) / "train_results.json").read_text())["train_runtime"], 1
        ),
    }


def _provenance(argv: list[str], run_args, training_args) -> dict:
    """Where and how the demo ran: enough to trace a figure quoted from it and to run it again."""
    device = training_args.device.type
    recipe = RECIPE.relative_to(REPO) if RECIPE.is_relative_to(REPO) else RECIPE.name
    return {
        "command": " ".join(["python -m ode_transformer.train.demo", *argv]),
        "recipe": str(recipe),
        "seed": training_args.seed,
        "git": git_commit(),
        "device": device_info(device, torch.get_num_threads()),
        "precision": choose_precision(training_args.device, run_args.precision).as_dict(),
        "transformers": transformers.__version__,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def main(argv: list[str] | None = None) -> dict:
    start = time.monotonic()
    argv = list(argv) if argv is not None else sys.argv[1:]
    demo_args, passthrough = parse_demo_arguments(argv)
    print("[1/4] LibreOffice-help corpus:", build_corpus())
    overrides = ["--output_dir", demo_args.output_dir, "--disable_tqdm", "false"]
    if demo_args.max_steps is not None:
        overrides += ["--max_steps", str(demo_args.max_steps)]
    if demo_args.max_test_samples is not None:
        overrides += ["--max_test_samples", str(demo_args.max_test_samples)]
    print("[2/4] tokenizer + [3/4] training + test translation (ode_transformer.train.run)")
    settings = parse_arguments([str(RECIPE), *overrides, *passthrough])
    run_args, training_args = settings.run, settings.training
    print("      precision:", choose_precision(training_args.device, run_args.precision).describe())
    document = run(settings)
    print("[4/4] copy-the-source baseline and example translations")
    baseline = copy_baseline(demo_args.max_test_samples)
    summary = _summary(document, baseline, demo_args.output_dir)
    summary["max_steps"] = training_args.max_steps
    translations, summary["parameters"] = translate(demo_args.output_dir, EXAMPLES)
    summary["examples"] = dict(zip(EXAMPLES, translations))
    summary["wall_seconds"] = round(time.monotonic() - start, 1)
    summary["provenance"] = _provenance(argv, run_args, training_args)
    text = json.dumps(summary, indent=2, ensure_ascii=False) + "\n"
    write_atomic(Path(demo_args.output_dir, "demo_summary.json"), text)
    if demo_args.results:
        write_atomic(demo_args.results, text)
    _print_summary(summary, demo_args.output_dir)
    return summary


def _print_summary(summary: dict, output_dir: str) -> None:
    print("\n================ ODE Transformer demo: LibreOffice help, English -> German ================")
    print(
        f"model       : RK2-gated encoder, {summary['layers']} layers, d {summary['d_model']}, "
        f"{summary['parameters'] / 1e6:.1f}M parameters"
    )
    print(
        f"training    : {summary['steps']} of {summary['max_steps']} updates in {summary['train_seconds'] / 60:.1f} min "
        f"({summary['train_seconds'] / max(summary['steps'], 1):.2f} s per update)"
    )
    precision = summary["provenance"]["precision"]
    print(f"precision   : {precision['precision']} ({precision['reason']})")
    decoding = summary["decoding"]
    print(
        f"decoding    : beam {decoding['num_beams']}, length penalty {decoding['length_penalty']}, {decoding['precision']}"
    )
    print(
        f"test BLEU   : {summary['bleu']:.2f}   (copy-the-source baseline {summary['copy_baseline_bleu']:.2f})"
    )
    print(
        f"test chrF   : {summary['chrf']:.2f}   (copy-the-source baseline {summary['copy_baseline_chrf']:.2f})"
    )
    print(f"signature   : {summary['bleu_signature']}")
    print(f"wall time   : {summary['wall_seconds'] / 60:.1f} min")
    for source, hypothesis in summary["examples"].items():
        print(f"  {source}\n    -> {hypothesis}")
    print(
        f"model folder: {output_dir} (README.md card, hub_metrics.json, loss_curves.png, runs/ for TensorBoard)"
    )


if __name__ == "__main__":
    main()
