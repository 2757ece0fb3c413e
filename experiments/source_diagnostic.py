"""Does a seq2seq model read its source? ``python -m experiments.source_diagnostic RUN_DIR [RUN_DIR ...]
--source SOURCES --target TARGETS [--pairs 48] [--max-source-length 200] [--max-target-length 100]``.

For each saved model (a study run's folder, a checkpoint, or any folder `from_pretrained` reads), prints the
mean cross-entropy per target token (nats, no label smoothing, eval mode) of the first `--pairs` references
given their own sources, and given the next pair's source (the sources rotated by one). The gap, rotated minus
matched, is what the source is worth to the model: 0 for a model that ignores it (a language model of the
targets), large for one that translates or copies from it. Sources and targets are tokenised and truncated as
`ode_transformer.train.run` does for training.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ode_transformer.files import read_lines
from ode_transformer.train.trainer import PadCollator
from ode_transformer.translate import load_for_generation


def target_cross_entropy(
    model: torch.nn.Module, collator: PadCollator, sources: list, targets: list
) -> float:
    """Mean cross-entropy per target token of `targets` (token ids) given `sources` (token ids), pair by pair."""
    batch = collator([{"input_ids": s, "labels": t} for s, t in zip(sources, targets, strict=True)])
    labels = batch["labels"]
    with torch.no_grad():  # decoder inputs, not labels: the model's own (label-smoothed) loss is not wanted
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=model.prepare_decoder_input_ids_from_labels(labels=labels),
        ).logits
    return torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=-100).item()


def source_gap(
    run_dir: Path, sources: list[str], targets: list[str], max_source_length: int, max_target_length: int
) -> dict[str, float]:
    """Target cross-entropy with the matched and with the rotated sources, and their difference."""
    if len(sources) < 2 or len(sources) != len(targets):
        raise ValueError(
            f"need at least 2 aligned pairs to rotate the sources, got {len(sources)} sources and {len(targets)} targets"
        )
    model, tokenizer = load_for_generation(str(run_dir))
    if not model.config.is_encoder_decoder:
        raise ValueError(
            f"{run_dir} holds a language model: the source diagnostic needs an encoder-decoder model"
        )
    source_ids = tokenizer(sources, truncation=True, max_length=max_source_length)["input_ids"]
    target_ids = tokenizer(targets, truncation=True, max_length=max_target_length)["input_ids"]
    collator = PadCollator(tokenizer)
    matched = target_cross_entropy(model, collator, source_ids, target_ids)
    rotated = target_cross_entropy(model, collator, source_ids[1:] + source_ids[:1], target_ids)
    return {"matched": matched, "rotated": rotated, "gap": rotated - matched}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.source_diagnostic", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "run_dirs", nargs="+", type=Path, help="saved model folders (a study run's folder, a checkpoint)"
    )
    parser.add_argument(
        "--source", type=Path, required=True, help="source text, one example per line (.gz read too)"
    )
    parser.add_argument("--target", type=Path, required=True, help="references aligned with --source")
    parser.add_argument("--pairs", type=int, default=48, help="the first N pairs")
    parser.add_argument(
        "--max-source-length",
        type=int,
        default=200,
        help="as the model was trained (ode_transformer.train.run's flag)",
    )
    parser.add_argument(
        "--max-target-length",
        type=int,
        default=100,
        help="as the model was trained (ode_transformer.train.run's flag)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # same numbers on every machine of a kind
    sources, targets = read_lines(args.source)[: args.pairs], read_lines(args.target)[: args.pairs]
    results = {}
    for run_dir in args.run_dirs:
        results[str(run_dir)] = row = source_gap(
            run_dir, sources, targets, args.max_source_length, args.max_target_length
        )
        print(
            f"{run_dir}: matched {row['matched']:.3f}  rotated {row['rotated']:.3f}  gap {row['gap']:.3f} nats/token"
        )
    return results


if __name__ == "__main__":
    main()
