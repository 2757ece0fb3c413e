"""A saved tiny random model with a real (tiny) byte-level BPE tokenizer, the kind of folder ode_transformer.train.run writes."""

from __future__ import annotations

from pathlib import Path

import torch

from modeling_ode import (
    ODETransformerConfig,
    ODETransformerForCausalLM,
    ODETransformerForConditionalGeneration,
    fit_tokenizer_to_model,
)
from ode_transformer.tokenizer import train_tokenizer

TEXTS = ["the dog runs in the park", "a cat sleeps on the warm mat", "zwei Hunde spielen im Schnee"] * 40
# What the tests translate with a tiny folder: lengths that differ, a word the tokenizer never saw, an empty line.
SOURCES = [
    "the dog",
    "a cat sleeps on the warm mat in the park",
    "zwei Hunde",
    "",
    "the dog runs in the park",
    "the cat runs",
]


def save_tiny_folder(folder: Path, causal: bool = False, weight_scale: float = 1.0, **overrides):
    """Save model and tokenizer in ``folder``; seq2seq models decode with beam 2 and 8 new tokens at most.
    ``weight_scale`` 3 makes the random model confident enough to write varied, non-empty outputs.
    Returns the model (eval mode) and the tokenizer."""
    tokenizer = train_tokenizer(TEXTS, vocab_size=320, save_to=folder, causal=causal)
    ids = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
    overrides = {"max_position_embeddings": 128, **overrides}  # a short trained length, which tests exceed
    torch.manual_seed(0)
    if causal:
        config = ODETransformerConfig.from_preset(
            "tiny", is_encoder_decoder=False, vocab_size=len(tokenizer), **ids, **overrides
        )
        model = ODETransformerForCausalLM(config)
    else:
        config = ODETransformerConfig.from_preset(
            "tiny", vocab_size=len(tokenizer), decoder_start_token_id=2, **ids, **overrides
        )
        model = ODETransformerForConditionalGeneration(config)
        # max_length as ode_transformer.train.run saves it (BART's convention: the start token + 8 tokens)
        model.generation_config.update(num_beams=2, length_penalty=0.6, early_stopping=True, max_length=9)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(weight_scale)
    model.save_pretrained(folder)
    fit_tokenizer_to_model(tokenizer, config).save_pretrained(folder)  # as ode_transformer.train.run saves it
    return model.eval(), tokenizer
