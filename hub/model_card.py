"""``ode-model-card`` (``python -m ode_transformer.hub.model_card MODEL_DIR [METRICS_JSON]``): write ``README.md``,
the model card, into a trained model folder. Without a metrics JSON, the folder's own ``hub_metrics.json`` (what
``ode-train`` writes) is read, and a folder without one (a model trained with one's own ``Seq2SeqTrainer``) gets a
card that says no evaluation results were recorded. The card itself is :mod:`ode_transformer.model_card_writer`'s, and
the schema of the metrics JSON :mod:`ode_transformer.card_metrics`', which training and ``ode-export`` write their
cards with too."""

from __future__ import annotations

import argparse
from pathlib import Path

from ode_transformer.card_metrics import METRICS_FILENAME
from ode_transformer.cli import program_name
from ode_transformer.model_card_writer import write_model_card


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program_name(__spec__.name),
        description="Write README.md (model card) into a trained model folder.",
    )
    parser.add_argument("model_dir", help="folder with config.json (and the weights)")
    parser.add_argument(
        "metrics_json",
        nargs="?",
        default=None,
        help=f"metrics JSON (schema: ode_transformer/card_metrics.py); default: MODEL_DIR/{METRICS_FILENAME} if there "
        "is one, else a card that says no evaluation results were recorded",
    )
    parser.add_argument("--repo-id", default=None, help="USER/NAME the card's usage example loads from")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    print(write_model_card(args.model_dir, metrics_file(args.model_dir, args.metrics_json), args.repo_id))


def metrics_file(model_dir: str, given: str | None) -> str | None:
    """The metrics JSON the card reads: the one given, else the folder's own, else none."""
    if given is not None:
        return given
    own = Path(model_dir) / METRICS_FILENAME
    return str(own) if own.is_file() else None


if __name__ == "__main__":
    main()
