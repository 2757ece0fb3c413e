"""Trained blocks: ``python -m experiments.block_diagnostic RUN_DIR [RUN_DIR ...] [--sentences 64]``.

For each saved model (a study run's folder, or any folder `from_pretrained` reads) and each ODE block, prints
the mean per-token norm of every stage F_i and the mean of every coefficient gamma_i on the first test sentences
of the run's corpus (Multi30k sources for a translation model, PTB sentences for a language model), with the
model in eval mode. For the paper's gate (Eq. (learnable), `gated`) it also prints the share of tokens on which
one stage carries more than 99% of the weight: a block whose gate does that on every token has collapsed to a
single stage (g = 1: the residual block y + F(y) that still pays for F2; g = 0: y + F(y + F(y))).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

import modeling_ode  # noqa: F401  (registers the model with the Auto* classes)
from train.data import multi30k, ptb

COLLAPSED = 0.99  # a stage with more than this share of the weight carries the block alone


def test_sentences(is_encoder_decoder: bool, count: int, data_root: Path | None = None) -> list[str]:
    """What the studies' models read: Multi30k English sources, or PTB test sentences for a language model."""
    if is_encoder_decoder:
        return list(multi30k("test", root=data_root)["source"][:count])
    return list(ptb("test", root=data_root)["text"][:count])


def block_statistics(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> list[dict[str, object]]:
    """One row per ODE block (encoder blocks first): stage norms, mean gamma per stage and, for per-token
    gates, the share of tokens on which one stage carries more than `COLLAPSED` of the weight."""
    config = model.config
    with torch.no_grad():
        if config.is_encoder_decoder:
            out = model.get_encoder()(
                input_ids=input_ids, attention_mask=attention_mask, output_ode_stages=True
            )
            sides = [("encoder", out.ode_stages, out.ode_coefficients)]
        else:
            out = model(input_ids=input_ids, attention_mask=attention_mask, output_ode_stages=True)
            sides = [("decoder", out.ode_stages, out.ode_coefficients)]
    tokens = attention_mask.bool()
    rows = []
    for side, stages_per_block, gammas in sides:
        mode = getattr(config, f"{side}_ode_coefficients")
        for block, (stages, gamma) in enumerate(zip(stages_per_block, gammas)):
            row: dict[str, object] = {
                "side": side,
                "block": block,
                "coefficients": mode,
                "stage_norms": stages.float().norm(dim=-1)[:, tokens].mean(dim=1).tolist(),
            }
            if gamma.dim() > 1 and gamma.shape[1:3] == tokens.shape:  # a gate: (s, batch, length, 1)
                per_token = gamma[..., 0][:, tokens].float()  # (s, tokens)
                row["gamma"] = per_token.mean(dim=1).tolist()
                if mode == "gated":
                    row["collapsed_share"] = (per_token.max(dim=0).values > COLLAPSED).float().mean().item()
            else:
                row["gamma"] = gamma.float().reshape(gamma.shape[0], -1).mean(dim=1).tolist()
            rows.append(row)
    return rows


def diagnose(run_dir: Path, sentences: int, data_root: Path | None = None) -> list[dict[str, object]]:
    """Loads a saved model and its tokenizer from `run_dir` and returns `block_statistics` on the test sentences."""
    config = AutoConfig.from_pretrained(run_dir)
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    model = auto.from_pretrained(run_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir)
    texts = test_sentences(config.is_encoder_decoder, sentences, data_root)
    batch = tokenizer(
        texts, return_tensors="pt", padding=True, truncation=True, max_length=config.max_position_embeddings
    )
    return block_statistics(model, batch["input_ids"], batch["attention_mask"])


def _numbers(values: Sequence[float]) -> str:
    return " / ".join(f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}" for v in values)


def main(argv: list[str] | None = None) -> dict[str, list[dict[str, object]]]:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.block_diagnostic", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, help="saved model folders (a study run's folder)")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument(
        "--data-root",
        type=Path,
        default=None,
        help="corpora folder (default: $ODE_DATA_DIR or ../shared/data)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = {}
    for run_dir in args.run_dirs:
        results[str(run_dir)] = rows = diagnose(run_dir, args.sentences, args.data_root)
        print(run_dir)
        for row in rows:
            collapsed = (
                f"  one stage on {row['collapsed_share']:.1%} of tokens" if "collapsed_share" in row else ""
            )
            print(
                f"  {row['side']} block {row['block']} ({row['coefficients']}): |F_i| {_numbers(row['stage_norms'])}"
                f"  gamma {_numbers(row['gamma'])}{collapsed}"
            )
    return results


if __name__ == "__main__":
    main()
