"""Blocks at initialisation: ``python -m experiments.init_diagnostic [--sentences 128] [--d-model 256]``.

For a 1-layer PTB language model (word-level vocabulary, dropout off, seed 0), prints for each block and
layer connection the loss of one batch, the norm of the gradient on F's parameters (the layer's weights)
and on the embeddings, and the mean per-token norm of the first and last stage. Tells whether an RK block
starts from a different place than the residual block (it does not, for the paper's F).
"""

from __future__ import annotations

import argparse

import torch

from modeling_ode import ODETransformerConfig, ODETransformerForCausalLM
from ode_transformer.tokenizer import train_tokenizer
from ode_transformer.train.data import ptb
from ode_transformer.train.trainer import PadCollator

BLOCKS = {
    "residual": {"decoder_ode_method": "euler", "decoder_ode_coefficients": "tableau"},
    "rk2_gated": {"decoder_ode_method": "rk2", "decoder_ode_coefficients": "gated"},
    "rk2_gated_codeF": {
        "decoder_ode_method": "rk2",
        "decoder_ode_coefficients": "gated",
        "ode_function_includes_residual": True,
    },
    "rk4": {"decoder_ode_method": "rk4", "decoder_ode_coefficients": "tableau"},
}
NO_DROPOUT = {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}


def batch(sentences: int) -> tuple[int, dict[str, torch.Tensor]]:
    """The first PTB training sentences as ``<s> words </s>`` and a word-level vocabulary of the whole split."""
    texts = list(ptb("train")["text"])
    tokenizer = train_tokenizer(texts, 20_000, kind="word", causal=True)
    ids = [[*row, tokenizer.eos_token_id] for row in tokenizer(texts[:sentences])["input_ids"]]
    return len(tokenizer), PadCollator(tokenizer)([{"input_ids": row, "labels": row} for row in ids])


def measure(vocab_size: int, inputs: dict, d_model: int, connections: str, block: dict) -> dict[str, float]:
    torch.manual_seed(0)
    config = ODETransformerConfig.from_preset(
        "base",
        is_encoder_decoder=False,
        vocab_size=vocab_size,
        d_model=d_model,
        decoder_ffn_dim=4 * d_model,
        decoder_attention_heads=4,
        decoder_layers=1,
        decoder_layer_connections=connections,
        **NO_DROPOUT,
        **block,
    )
    model = ODETransformerForCausalLM(config).train()
    out = model(**inputs, output_ode_stages=True)
    out.loss.backward()
    layer = [p.grad for name, p in model.named_parameters() if ".layers." in name and p.grad is not None]
    stages = out.ode_stages[0].norm(dim=-1)[:, inputs["attention_mask"].bool()]
    return {
        "loss": out.loss.item(),
        "grad_F": torch.cat([g.flatten() for g in layer]).norm().item(),
        "grad_embeddings": model.get_input_embeddings().weight.grad.norm().item(),
        "first_stage_norm": stages[0].mean().item(),
        "last_stage_norm": stages[-1].mean().item(),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.init_diagnostic", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--sentences", type=int, default=128)
    parser.add_argument("--d-model", type=int, default=256)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # same numbers on every machine of a kind
    vocab_size, inputs = batch(args.sentences)
    rows = []
    for connections in ("learnable_dense", "residual"):
        for name, block in BLOCKS.items():
            row = {
                "connections": connections,
                "block": name,
                **measure(vocab_size, inputs, args.d_model, connections, block),
            }
            print("  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{v:16s}" for k, v in row.items()))
            rows.append(row)
    return rows


if __name__ == "__main__":
    main()
