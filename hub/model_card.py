"""``ode-model-card`` (``python -m ode_transformer.hub.model_card MODEL_DIR METRICS_JSON``): write ``README.md``,
the model card, into a trained model folder. The card itself, and the schema of the metrics JSON, are
:mod:`ode_transformer.model_card`'s, which training and ``ode-export`` write their cards with too."""

from __future__ import annotations

import argparse

from ode_transformer.cli import program_name
from ode_transformer.model_card import write_model_card


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program_name(__spec__.name),
        description="Write README.md (model card) into a trained model folder.",
    )
    parser.add_argument("model_dir", help="folder with config.json (and the weights)")
    parser.add_argument("metrics_json", help="metrics JSON (schema: ode_transformer/model_card.py)")
    parser.add_argument("--repo-id", default=None, help="USER/NAME the card's usage example loads from")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    print(write_model_card(args.model_dir, args.metrics_json, args.repo_id))


if __name__ == "__main__":
    main()
