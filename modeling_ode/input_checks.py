"""The model's inputs checked before they reach it: ids outside the vocabulary, an attention mask of the wrong
shape and labels that do not match the inputs are refused by name, where inside the model they would fail with an
anonymous IndexError or broadcast error (or silently shift the positions). The modeling file imports this module, so
an exported folder ships it as remote code."""

import torch

__all__ = ["check_attention_mask", "check_labels", "check_token_ids"]


def check_token_ids(
    name: str, ids: torch.Tensor | None, vocab_size: int, ignore_index: int | None = None
) -> None:
    """Refuse ids outside the vocabulary before the embedding lookup fails with an anonymous IndexError (or a
    device-side assert on GPU). Eager mode only: the check reads a value back from the device, which a compiled
    graph cannot do without breaking."""
    if ids is None or torch.compiler.is_compiling():
        return
    valid = (ids >= 0) & (ids < vocab_size)
    if ignore_index is not None:
        valid |= ids == ignore_index
    if not bool(valid.all()):
        bad = ids[~valid]
        allowed = f"0..{vocab_size - 1}" + (f" or {ignore_index}" if ignore_index is not None else "")
        raise ValueError(
            f"`{name}` holds ids outside the vocabulary ({allowed}): {sorted(set(bad.tolist()))[:5]}; encode the text "
            "with the model's own tokenizer, or resize the embeddings (`resize_token_embeddings`) after adding tokens."
        )


def check_attention_mask(name: str, mask: torch.Tensor | None, batch: int, least: int, most: int) -> None:
    """A 2-D (batch, tokens) 1/0 mask with a column for every key: the input's tokens (a cached decoder's: its
    past ones too, and at most its cache's size). Refused by its shape here, before a broadcast inside attention
    fails anonymously or a short mask silently shifts the positions."""
    if mask is None or (mask.dim() == 2 and mask.shape[0] == batch and least <= mask.shape[1] <= most):
        return
    columns = str(least) if least == most else f"{least} to {most}"
    raise ValueError(
        f"`{name}` has shape {tuple(mask.shape)}, the input needs ({batch}, {columns}): a row per sequence and a "
        "column per token, 1 for a real token and 0 for padding (the tokenizer's `attention_mask` has this shape)."
    )


def check_labels(
    input_ids: torch.Tensor | None, labels: torch.Tensor | None, vocab_size: int, same_shape: bool
) -> None:
    """Labels: ids in the vocabulary or -100 (ignored), one row per input row (the causal LM: input_ids' shape)."""
    check_token_ids("labels", labels, vocab_size, ignore_index=-100)
    if input_ids is None or labels is None:
        return
    if labels.shape[0] != input_ids.shape[0] or (same_shape and labels.shape != input_ids.shape):
        what = "shape" if same_shape else "batch size"
        raise ValueError(
            f"`labels` {tuple(labels.shape)} and `input_ids` {tuple(input_ids.shape)} differ in {what}; give one "
            "label row per input row (pad with -100)."
        )
