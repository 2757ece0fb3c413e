"""Training utilities for the ODE Transformer (data, tokenizer, batching, ...)."""
