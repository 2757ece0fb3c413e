"""Trained blocks: ``python -m experiments.block_diagnostic RUN_DIR [RUN_DIR ...] [--sentences 64] [--json F]``.

For each saved model (a study run's folder, or any folder `from_pretrained` reads) and each ODE block of its
encoder (of its decoder for a language model), prints the mean per-token norm of every stage F_i and the mean of
every coefficient gamma_i, with the model in eval mode, on the first test sentences of the studies' corpora:
Multi30k English sources for an encoder-decoder (the `multi30k` and `ablations` models), PTB test sentences as
``<s> words </s>`` (as `ode_transformer.train.run` trains them) for a language model. For the paper's gate (Eq. (learnable),
`gated`, a softmax over stages) it also prints the share of tokens on which one stage carries more than 0.99 of
the weight: a block whose gate does that on every token has collapsed to a single stage (g = 1: the residual
block y + F(y) that still pays for F2; g = 0: y + F(y + F(y))).

For every gate it also prints what drives its logits z = [F1, F2] W + b (why a gate saturates): the mean and percentiles of
|z| over the real tokens, the norms of what the gate reads (the stages, or LN(F_i) with `ode_gate_inputs`), the
norm of each stage's part W_i of W and the mean |F_i W_i| it contributes, the bias, and the shares of tokens with
g < 0.01 and g > 0.99 (g = gamma_1). Large |z| from large |F_i| with a small W points at the stages' scale; from a
large W at the gate's own growth.

``--json FILE`` also writes the rows, keyed by the run folder's name, into FILE (keeping the other runs it
holds): the statistics a study document quotes, committed beside the study's results since the models are not.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch

from experiments.records import merge_json
from modeling_ode.ode import GATED_MODES, StageCoefficients
from ode_transformer.train.data import multi30k, ptb
from ode_transformer.translate import load_for_generation

COLLAPSED = 0.99  # a stage with more than this share of the weight carries the block alone
LOGIT_PERCENTILES = (50, 90, 99)


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
    coefficients = block_coefficients(stack)
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
            row.update(gate_statistics(coefficients[block], stages[:, tokens], per_token[0]))
        else:  # (s,) or, for EMA with one alpha per dimension, (s, d)
            row["gamma"] = gamma.float().reshape(gamma.shape[0], -1).mean(dim=1).tolist()
        rows.append(row)
    return rows


def block_coefficients(stack: torch.nn.Module) -> list[StageCoefficients]:
    """The coefficient module of every ODE block of `stack`, in the order the blocks record their stages (layer by
    layer); with `ode_coefficient_scope="stack"` the one module, once per block."""
    return [module for layer in range(len(stack.layers)) for module in stack._layer_coefficients(layer)]


def gate_statistics(
    coefficients: StageCoefficients, stages: torch.Tensor, g: torch.Tensor
) -> dict[str, object]:
    """What drives a gate's logits z = [x_1..x_s] W + b, x_i the gate's reading of stage F_i (F_i itself, or
    LN(F_i)), on the real tokens: `stages` (s, tokens, d) as recorded, `g` (tokens,) the first stage's weight."""
    with torch.no_grad():
        inputs = coefficients.gate_input([stage.float() for stage in stages])
        weight, bias = coefficients.gate.weight.float(), coefficients.gate.bias.float()
        parts = weight.split(stages.shape[-1], dim=1)  # W_i: the columns that read stage i, (logits, d) each
        logits = torch.cat(inputs, dim=-1) @ weight.T + bias  # (tokens, logits)
        size = logits.abs().flatten()
        return {
            "logit_abs_mean": size.mean().item(),
            "logit_abs_percentiles": dict(
                zip(
                    (f"p{p}" for p in LOGIT_PERCENTILES),
                    torch.quantile(size, torch.tensor(LOGIT_PERCENTILES) / 100).tolist(),
                )
            ),
            "gate_input_norms": [x.norm(dim=-1).mean().item() for x in inputs],
            "gate_weight_norms": [part.norm().item() for part in parts],
            "logit_parts": [(x @ part.T).abs().mean().item() for x, part in zip(inputs, parts)],
            "gate_bias": bias.tolist(),
            "g_below": (g < 1 - COLLAPSED).float().mean().item(),
            "g_above": (g > COLLAPSED).float().mean().item(),
        }


def diagnose(run_dir: Path, sentences: int, data_root: Path | None = None) -> list[dict[str, object]]:
    """Loads a saved model and its tokenizer from `run_dir` and returns `block_statistics` on the test sentences."""
    model, tokenizer = load_for_generation(str(run_dir))
    batch = diagnostic_sentences(tokenizer, model.config.is_encoder_decoder, sentences, data_root)
    positions = model.config.max_position_embeddings
    return block_statistics(model, batch["input_ids"][:, :positions], batch["attention_mask"][:, :positions])


def _numbers(values: Sequence[float]) -> str:
    return " / ".join(f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}" for v in values)


def _gate_line(row: dict[str, object]) -> str:
    percentiles = row["logit_abs_percentiles"]
    return (
        f"|z| mean {row['logit_abs_mean']:.2f}, {'/'.join(percentiles)} {_numbers(list(percentiles.values()))}; "
        f"|x_i| {_numbers(row['gate_input_norms'])}  |W_i| {_numbers(row['gate_weight_norms'])}  "
        f"|x_i W_i| {_numbers(row['logit_parts'])}  b {_numbers(row['gate_bias'])}; "
        f"g < 0.01 on {row['g_below']:.1%}, g > 0.99 on {row['g_above']:.1%} of tokens"
    )


def main(argv: list[str] | None = None) -> dict[str, list[dict[str, object]]]:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.block_diagnostic", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, help="saved model folders (a study run's folder)")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument(
        "--data-root", type=Path, help="corpora folder (default: $ODE_DATA_DIR or ../shared/data)"
    )
    parser.add_argument(
        "--json", type=Path, help="also write the rows into this JSON file, keyed by run name"
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
            if "logit_abs_mean" in row:
                print(f"    gate: {_gate_line(row)}")
    if args.json:
        names = [Path(run_dir).resolve().name for run_dir in results]
        if len(set(names)) < len(names):
            parser.error("--json keys runs by their folder's name: give folders with different names")
        write_rows(args.json, dict(zip(names, results.values())))
    return results


def write_rows(path: Path, rows_by_run: dict[str, list[dict[str, object]]]) -> None:
    """Merge ``rows_by_run`` into the JSON file at ``path`` (created if missing), runs sorted by name: under a lock
    and atomically (:func:`experiments.records.merge_json`), since parallel runs of a batch write one file."""
    merge_json(path, rows_by_run)


if __name__ == "__main__":
    main()
