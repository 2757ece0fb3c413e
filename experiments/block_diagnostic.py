"""Trained blocks: ``python -m experiments.block_diagnostic RUN_DIR [RUN_DIR ...] [--sentences 64]``.

For each saved model (a study run's folder, or any folder `from_pretrained` reads) and each ODE block of its
encoder (of its decoder for a language model), prints the mean per-token norm of every stage F_i and the mean of
every coefficient gamma_i, with the model in eval mode, on the first test sentences of the studies' corpora:
Multi30k English sources for an encoder-decoder (the `multi30k` and `ablations` models), PTB test sentences as
``<s> words </s>`` (as `train.run` trains them) for a language model. For the paper's gate (Eq. (learnable),
`gated`, a softmax over stages) it also prints the share of tokens on which one stage carries more than 99% of
the weight: a block whose gate does that on every token has collapsed to a single stage (g = 1: the residual
block y + F(y) that still pays for F2; g = 0: y + F(y + F(y))).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch

from modeling_ode.ode import GATED_MODES
from train.data import multi30k, ptb
from train.translate import load_for_generation

COLLAPSED = 0.99  # a stage with more than this share of the weight carries the block alone


def diagnostic_sentences(
    tokenizer, is_encoder_decoder: bool, count: int, data_root: Path | None = None
) -> dict:
    """The padded batch the diagnostic reads (see the module docstring), truncated to the model's positions."""
    if is_encoder_decoder:
        return tokenizer(
            list(multi30k("test", root=data_root)["source"][:count]), return_tensors="pt", padding=True
        )
    rows = tokenizer(list(ptb("test", root=data_root)["text"][:count]), add_special_tokens=False)["input_ids"]
    ids = [[tokenizer.bos_token_id, *row, tokenizer.eos_token_id] for row in rows]
    return tokenizer.pad({"input_ids": ids}, return_tensors="pt")


def block_statistics(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> list[dict[str, object]]:
    """One row per ODE block of the encoder (the decoder of a language model): mean stage norms and mean gamma
    per stage over the real tokens and, for the `gated` gate, the share of tokens on which one stage carries
    more than `COLLAPSED` of the weight."""
    config = model.config
    side = "encoder" if config.is_encoder_decoder else "decoder"
    stack = model.get_encoder() if config.is_encoder_decoder else model.get_decoder()
    mode = getattr(config, f"{side}_ode_coefficients")
    with torch.no_grad():
        out = stack(input_ids=input_ids, attention_mask=attention_mask, output_ode_stages=True)
    tokens = attention_mask.bool()
    rows = []
    for block, (stages, gamma) in enumerate(zip(out.ode_stages, out.ode_coefficients)):
        row: dict[str, object] = {
            "side": side,
            "block": block,
            "coefficients": mode,
            "stage_norms": stages.float().norm(dim=-1)[:, tokens].mean(dim=1).tolist(),
        }
        if mode in GATED_MODES:  # gamma per token: (s, batch, length, 1)
            per_token = gamma[..., 0][:, tokens].float()  # (s, tokens)
            row["gamma"] = per_token.mean(dim=1).tolist()
            if mode == "gated":  # the weights sum to 1: one of them near 1 leaves the others near 0
                row["collapsed_share"] = (per_token.max(dim=0).values > COLLAPSED).float().mean().item()
        else:  # (s,) or, for EMA with one alpha per dimension, (s, d)
            row["gamma"] = gamma.float().reshape(gamma.shape[0], -1).mean(dim=1).tolist()
        rows.append(row)
    return rows


def diagnose(run_dir: Path, sentences: int, data_root: Path | None = None) -> list[dict[str, object]]:
    """Loads a saved model and its tokenizer from `run_dir` and returns `block_statistics` on the test sentences."""
    model, tokenizer = load_for_generation(str(run_dir))
    batch = diagnostic_sentences(tokenizer, model.config.is_encoder_decoder, sentences, data_root)
    positions = model.config.max_position_embeddings
    return block_statistics(model, batch["input_ids"][:, :positions], batch["attention_mask"][:, :positions])


def _numbers(values: Sequence[float]) -> str:
    return " / ".join(f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}" for v in values)


def main(argv: list[str] | None = None) -> dict[str, list[dict[str, object]]]:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.block_diagnostic", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, help="saved model folders (a study run's folder)")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument(
        "--data-root", type=Path, help="corpora folder (default: $ODE_DATA_DIR or ../shared/data)"
    )
    args = parser.parse_args(argv)
    results = {}
    for run_dir in args.run_dirs:
        results[str(run_dir)] = rows = diagnose(run_dir, args.sentences, args.data_root)
        print(run_dir)
        for row in rows:
            collapsed = (
                f"  one stage on {row['collapsed_share']:.1%} of tokens" if "collapsed_share" in row else ""
            )
            numbers = f"|F_i| {_numbers(row['stage_norms'])}  gamma {_numbers(row['gamma'])}"
            print(f"  {row['side']} block {row['block']} ({row['coefficients']}): {numbers}{collapsed}")
    return results


if __name__ == "__main__":
    main()
