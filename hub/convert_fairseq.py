"""Convert the authors' fairseq checkpoints (libeineu/ODE-Transformer, fairseq 0.6.2 fork) to an HF folder.

    python -m ode_transformer.hub.convert_fairseq CHECKPOINT OUT_DIR [--trust-pickle] [--padding-idx 1] [--overwrite]

The result uses the code-compatible mode of `ODETransformerConfig`: F is the whole pre-norm layer with its
residuals (`ode_function_includes_residual=True`), one gate / coefficient pair for the whole encoder
(`ode_coefficient_scope="stack"`), DLCL history -> `*_layer_connections`, and fairseq's sinusoidal positions,
which start at padding_idx + 1 (`position_offset = padding_idx + 1`). Its encoder and decoder outputs equal
the original computation (tests/test_convert_fairseq.py re-computes the reference equations).

What is read from `args` (an argparse.Namespace, or a dict; attribute names of the fork's `ode_transformer`
architecture; a missing one takes that architecture's default, listed in `_ARG_DEFAULTS`):
  encoder_embed_dim, decoder_embed_dim, encoder_layers, decoder_layers, encoder_attention_heads,
  decoder_attention_heads, encoder_ffn_embed_dim, decoder_ffn_embed_dim, dropout, attention_dropout,
  relu_dropout, max_source_positions, max_target_positions, no_token_positional_embeddings,
  encoder_learned_pos / decoder_learned_pos (must be False), encoder_normalize_before /
  decoder_normalize_before (must be True: pre-norm), max_relative_length (-1: no RPR),
  encoder_history_type / decoder_history_type (None, "dense", "learnable_dense"), share_all_embeddings,
  share_decoder_input_output_embed, enc_calculate_num (1, 2 or 4 RK stages), dec_calculate_num (must be 1),
  rk_type ("standard", "learnable", "initialization"), activation_fn (default relu); label_smoothing is a
  training criterion, not part of the model (ode-train's --label_smoothing_factor).
Tensor shapes are checked against these (e.g. the RPR table gives k, the layer indices give the depth).
Token ids follow fairseq's Dictionary: bos 0, pad 1, eos 2 (decoding starts with eos); `--padding-idx` if not.
"""

from __future__ import annotations

import argparse
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ode_transformer.checkpoints import refuse_replacing_a_run
from ode_transformer.files import lock_output, refuse_occupied, staged_folder

__all__ = [
    "FairseqCheckpointError",
    "config_from_fairseq_args",
    "convert_fairseq_checkpoint",
    "convert_state_dict",
    "load_fairseq_checkpoint",
]

TRUST_PICKLE_HELP = (
    "load the checkpoint with torch.load(weights_only=False). Unpickling can execute arbitrary code, so use it "
    "only for files you trust. Needed when the checkpoint holds Python objects other than tensors, containers "
    "and the fairseq `args` argparse.Namespace (e.g. numpy scalars in the optimizer or extra state), which "
    "torch >= 2.6 refuses to load by default."
)

# Defaults of the fork's `base_architecture` for fields a checkpoint might lack.
_ARG_DEFAULTS: dict[str, Any] = {
    "encoder_embed_dim": 512,
    "encoder_ffn_embed_dim": 2048,
    "encoder_layers": 6,
    "encoder_attention_heads": 8,
    "decoder_layers": 6,
    "decoder_attention_heads": 8,
    "encoder_normalize_before": False,
    "decoder_normalize_before": False,
    "encoder_learned_pos": False,
    "decoder_learned_pos": False,
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "relu_dropout": 0.0,
    "share_all_embeddings": False,
    "share_decoder_input_output_embed": False,
    "no_token_positional_embeddings": False,
    "max_source_positions": 1024,
    "max_target_positions": 1024,
    "max_relative_length": -1,
    "encoder_history_type": "dense",
    "decoder_history_type": "dense",
    "enc_calculate_num": 1,
    "dec_calculate_num": 1,
    "rk_type": "standard",
    "activation_fn": "relu",
}

_HISTORY = {
    None: "residual",
    "": "residual",
    "none": "residual",
    "dense": "dense",
    "learnable_dense": "learnable_dense",
}
_DROPPED = re.compile(r"(^|\.)(version|embed_positions\._float_tensor|embed_positions\.weights)$")


class FairseqCheckpointError(ValueError):
    """The file is not a checkpoint of the authors' ODE Transformer that this converter understands."""


# ----------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------


def _file_head(path: Path) -> bytes:
    with path.open("rb") as file:
        return file.read(8)


def _looks_like_torch_file(head: bytes) -> bool:
    """Whether a file starting with ``head`` can be a torch.save file: a zip archive (torch >= 1.6) or a pickle
    of protocol 2 or later (the legacy format, e.g. of fairseq 0.6.2's torch)."""
    return head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"


def _not_a_checkpoint(path: Path, problem: str, error: BaseException | None = None) -> FairseqCheckpointError:
    """The error for a file torch.load cannot read at all (text, empty, truncated): --trust-pickle cannot help,
    so it is not advised."""
    detail = (
        f" (torch.load: {next(iter(str(error).splitlines()), '') or type(error).__name__})" if error else ""
    )
    return FairseqCheckpointError(
        f"{path} is not a fairseq/torch checkpoint: {problem}{detail}. Pass the checkpoint*.pt file fairseq "
        "saved (e.g. checkpoint_best.pt)."
    )


def _check_checkpoint_file(path: Path) -> None:
    """Refuse by name what is no checkpoint file (missing, a folder, empty, text) before torch.load unpickles
    it: its own errors there are a raw UnpicklingError, or advice to trust the file."""
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.pt"))[:3]
        hint = f" (it holds {', '.join(found)})" if found else ""
        example = path / (found[0] if found else "checkpoint_best.pt")
        raise FairseqCheckpointError(
            f"checkpoint {path} is a folder{hint}; pass a fairseq checkpoint file (.pt), e.g. {example}."
        )
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist; pass a fairseq checkpoint file (.pt).")
    head = _file_head(path)
    if not head:
        raise _not_a_checkpoint(path, "the file is empty")
    if not _looks_like_torch_file(head):
        raise _not_a_checkpoint(
            path, f"it starts with {head!r}, not as torch.save writes (a zip or a pickle)"
        )


def load_fairseq_checkpoint(path: str | Path, trust_pickle: bool = False) -> dict[str, Any]:
    """torch.load the checkpoint: safely (weights_only=True, with argparse.Namespace allow-listed) unless
    `trust_pickle`; a checkpoint that needs full unpickling raises an error naming `--trust-pickle`, a file that
    is no torch checkpoint (a folder, text, truncated) one saying so, as the flag would not help."""
    path = Path(path)
    _check_checkpoint_file(path)
    if trust_pickle:
        try:
            return torch.load(path, map_location="cpu", weights_only=False)
        except (pickle.UnpicklingError, EOFError, RuntimeError) as error:
            raise _not_a_checkpoint(path, "it is truncated or damaged", error) from error
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises UnpicklingError (or RuntimeError on older versions)
        detail = next(iter(str(error).splitlines()), "")
        if "weights only load failed" not in detail.lower():  # EOFError, a damaged zip, ...
            raise _not_a_checkpoint(path, "it is truncated or damaged", error) from error
        raise FairseqCheckpointError(
            f"{path} cannot be loaded safely (torch.load weights_only=True): {detail}\n"
            "It holds pickled Python objects beyond tensors and the fairseq args Namespace. If you trust the file, "
            "re-run with --trust-pickle (convert_fairseq_checkpoint(..., trust_pickle=True)); unpickling can "
            "execute arbitrary code."
        ) from error


def _arg(args: Any, name: str) -> Any:
    if isinstance(args, Mapping):
        return args.get(name, _ARG_DEFAULTS.get(name))
    return getattr(args, name, _ARG_DEFAULTS.get(name))


def _split_checkpoint(checkpoint: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    if not isinstance(checkpoint, Mapping):
        raise FairseqCheckpointError(
            f"not a fairseq checkpoint: expected a dict with 'args' and 'model', got {type(checkpoint).__name__}."
        )
    args = checkpoint.get("args")
    if args is None and isinstance(checkpoint.get("cfg"), Mapping):  # newer fairseq: cfg.model
        args = checkpoint["cfg"].get("model")
    missing = [k for k, v in (("args", args), ("model", checkpoint.get("model"))) if v is None]
    if missing:
        raise FairseqCheckpointError(
            f"not a fairseq checkpoint: top-level key(s) {missing} missing; a fairseq checkpoint holds 'args' "
            f"(or 'cfg') and 'model' (the state dict), this one holds {sorted(map(str, checkpoint))[:10]}."
        )
    state = checkpoint["model"]
    if not isinstance(state, Mapping) or not all(torch.is_tensor(v) for v in state.values()):
        raise FairseqCheckpointError("not a fairseq checkpoint: 'model' must be a state dict of tensors.")
    return args, dict(state)


# ----------------------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------------------


def _layer_count(state: Mapping[str, torch.Tensor], prefix: str) -> int:
    indices = {int(m.group(1)) for k in state if (m := re.match(rf"{prefix}\.layers\.(\d+)\.", k))}
    return max(indices) + 1 if indices else 0


def config_from_fairseq_args(args: Any, state: Mapping[str, torch.Tensor], padding_idx: int = 1):
    """An `ODETransformerConfig` (code-compatible mode) for a fairseq `args` and its state dict."""
    from modeling_ode import ODETransformerConfig

    def unsupported(message: str):
        raise FairseqCheckpointError(f"unsupported checkpoint: {message}")

    if "encoder.embed_tokens.weight" not in state or "decoder.embed_tokens.weight" not in state:
        missing = [
            k for k in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight") if k not in state
        ]
        raise FairseqCheckpointError(
            f"not an ODE Transformer encoder-decoder checkpoint: missing keys {missing}."
        )
    d = int(_arg(args, "encoder_embed_dim"))
    if int(_arg(args, "decoder_embed_dim") or d) != d:
        unsupported("encoder_embed_dim and decoder_embed_dim differ.")
    for side in ("encoder", "decoder"):
        if not _arg(args, f"{side}_normalize_before"):
            unsupported(f"{side}_normalize_before=False (post-norm); only pre-norm models are supported.")
        if _arg(args, f"{side}_learned_pos"):
            unsupported(f"{side}_learned_pos=True; only sinusoidal positions are supported.")
        declared, found = int(_arg(args, f"{side}_layers")), _layer_count(state, side)
        if declared != found:
            raise FairseqCheckpointError(
                f"args.{side}_layers={declared} but the state dict has {found} {side} layers."
            )
    if str(_arg(args, "activation_fn")) != "relu":
        unsupported(f"activation_fn={_arg(args, 'activation_fn')!r}; the fork's layers use relu.")

    steps, rk_type = int(_arg(args, "enc_calculate_num")), str(_arg(args, "rk_type"))
    if steps == 1:
        method, coefficients = "euler", "tableau"
    elif steps == 2:
        method = "rk2"
        coefficients = {"standard": "tableau", "initialization": "learnable", "learnable": "gated"}.get(
            rk_type
        )
        if coefficients is None:
            unsupported(f"rk_type={rk_type!r}; expected standard, initialization or learnable.")
    elif steps == 4:
        method, coefficients = "rk4", "tableau"
    else:
        unsupported(
            f"enc_calculate_num={steps}; the fork's RK3 path has an index bug, only 1, 2 and 4 convert."
        )
    has_gate, has_alpha = "encoder.gate_linear.weight" in state, "encoder.alpha" in state
    if (coefficients == "gated") != has_gate or (coefficients == "learnable") != has_alpha:
        raise FairseqCheckpointError(
            f"args say enc_calculate_num={steps}, rk_type={rk_type!r} but the state dict "
            f"{'has' if has_gate else 'lacks'} encoder.gate_linear and {'has' if has_alpha else 'lacks'} encoder.alpha."
        )
    if int(_arg(args, "dec_calculate_num") or 1) != 1:
        unsupported("dec_calculate_num != 1; the translation decoder is a plain pre-norm stack.")

    history = {}
    for side in ("encoder", "decoder"):
        kind = _arg(args, f"{side}_history_type")
        if kind not in _HISTORY:
            unsupported(f"{side}_history_type={kind!r}; supported: None, 'dense', 'learnable_dense'.")
        history[side] = _HISTORY[kind]

    k = int(_arg(args, "max_relative_length"))
    table = state.get("encoder.layers.0.self_attn.relative_position_keys")
    if k > 0 and table is not None and table.shape[0] != 2 * k + 1:
        raise FairseqCheckpointError(
            f"args.max_relative_length={k} but relative_position_keys has {table.shape[0]} rows (expected {2 * k + 1})."
        )
    share_all = bool(_arg(args, "share_all_embeddings"))
    tie_output = share_all or bool(_arg(args, "share_decoder_input_output_embed"))
    vocab = state["decoder.embed_tokens.weight"].shape[0]
    source_vocab = state["encoder.embed_tokens.weight"].shape[0]
    return ODETransformerConfig(
        vocab_size=vocab,
        source_vocab_size=None if share_all else source_vocab,
        share_encoder_decoder_embeddings=share_all,
        tie_word_embeddings=tie_output,
        d_model=d,
        encoder_layers=int(_arg(args, "encoder_layers")),
        decoder_layers=int(_arg(args, "decoder_layers")),
        encoder_attention_heads=int(_arg(args, "encoder_attention_heads")),
        decoder_attention_heads=int(_arg(args, "decoder_attention_heads")),
        encoder_ffn_dim=int(_arg(args, "encoder_ffn_embed_dim")),
        decoder_ffn_dim=int(_arg(args, "decoder_ffn_embed_dim") or _arg(args, "encoder_ffn_embed_dim")),
        activation_function="relu",
        dropout=float(_arg(args, "dropout")),
        attention_dropout=float(_arg(args, "attention_dropout")),
        activation_dropout=float(_arg(args, "relu_dropout")),
        layer_norm_eps=1e-5,
        max_position_embeddings=max(
            int(_arg(args, "max_source_positions")), int(_arg(args, "max_target_positions"))
        ),
        use_absolute_positions=not _arg(args, "no_token_positional_embeddings"),
        position_offset=padding_idx + 1,
        max_relative_position=max(k, 0),
        relative_position_values="encoder.layers.0.self_attn.relative_position_values" in state,
        scale_embedding=True,
        encoder_ode_method=method,
        encoder_ode_coefficients=coefficients,
        encoder_ode_function="layer",
        decoder_ode_method="euler",
        decoder_ode_coefficients="tableau",
        decoder_ode_function="layer",
        ode_function_includes_residual=True,
        ode_coefficient_scope="stack",
        encoder_layer_connections=history["encoder"],
        decoder_layer_connections=history["decoder"],
        pad_token_id=padding_idx,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )


# ----------------------------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------------------------


def _rename(key: str) -> str:
    """fairseq key -> our key (without the `model.` prefix of the generation model); the fused `in_proj` keys are
    split by `convert_state_dict`."""
    rules = [
        (
            r"^(encoder|decoder)\.layers\.(\d+)\.self_attn\.relative_position_keys$",
            r"\1.layers.\2.self_attn.relative_keys",
        ),
        (
            r"^(encoder|decoder)\.layers\.(\d+)\.self_attn\.relative_position_values$",
            r"\1.layers.\2.self_attn.relative_values",
        ),
        (r"^(encoder|decoder)\.layers\.(\d+)\.(fc1|fc2)\.(weight|bias)$", r"\1.layers.\2.ffn.\3.\4"),
        (
            r"^encoder\.layers\.(\d+)\.layer_norms\.0\.(weight|bias)$",
            r"encoder.layers.\1.self_attn_layer_norm.\2",
        ),
        (
            r"^encoder\.layers\.(\d+)\.layer_norms\.1\.(weight|bias)$",
            r"encoder.layers.\1.final_layer_norm.\2",
        ),
        # old decoder checkpoints: layer_norms.{0,1,2} (fairseq's own upgrade_state_dict_named renames them)
        (
            r"^decoder\.layers\.(\d+)\.layer_norms\.0\.(weight|bias)$",
            r"decoder.layers.\1.self_attn_layer_norm.\2",
        ),
        (
            r"^decoder\.layers\.(\d+)\.layer_norms\.1\.(weight|bias)$",
            r"decoder.layers.\1.encoder_attn_layer_norm.\2",
        ),
        (
            r"^decoder\.layers\.(\d+)\.layer_norms\.2\.(weight|bias)$",
            r"decoder.layers.\1.final_layer_norm.\2",
        ),
        (r"^(encoder|decoder)\.history\.weight$", r"\1.connections.weight"),
        (
            r"^(encoder|decoder)\.history\.layer_norms\.(\d+)\.(weight|bias)$",
            r"\1.connections.layer_norms.\2.\3",
        ),
        (r"^encoder\.gate_linear\.(weight|bias)$", r"encoder.ode_coefficients.0.gate.\1"),
        (r"^encoder\.alpha$", r"encoder.ode_coefficients.0.weight"),
    ]
    for pattern, replacement in rules:
        if re.match(pattern, key):
            return re.sub(pattern, replacement, key)
    return key  # same name in both (out_proj, layer norms of the decoder, final layer_norm, embeddings)


def convert_state_dict(state: Mapping[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """fairseq state dict -> the state dict of `ODETransformerForConditionalGeneration(config)`; every key of the
    target must be produced and every fairseq key consumed, else a FairseqCheckpointError names them."""
    from modeling_ode import ODETransformerForConditionalGeneration

    with torch.device("meta"):
        target = ODETransformerForConditionalGeneration(config).state_dict()
    out: dict[str, torch.Tensor] = {}
    unused = []
    for key, tensor in state.items():
        if _DROPPED.search(key):
            continue
        if key == "encoder.embed_tokens.weight":
            out["model.encoder.embed_tokens.weight"] = tensor
            continue
        if key == "decoder.embed_tokens.weight":
            out["model.shared.weight"] = out["model.decoder.embed_tokens.weight"] = tensor
            if config.tie_word_embeddings:
                out["lm_head.weight"] = tensor
            continue
        if key == "decoder.embed_out":
            out["lm_head.weight"] = tensor
            continue
        # fairseq's in_proj stacks q, k and v (self- and cross-attention alike): our separate projections
        match = re.match(
            r"^(encoder|decoder)\.layers\.(\d+)\.(self_attn|encoder_attn)\.in_proj_(weight|bias)$", key
        )
        if match:
            side, layer, attention, kind = match.groups()
            # (a tensor of another size leaves a part missing or misshapen: refused below, by name)
            for part, rows in zip(("q_proj", "k_proj", "v_proj"), tensor.chunk(3), strict=False):
                out[f"model.{side}.layers.{layer}.{attention}.{part}.{kind}"] = rows
            continue
        name = "model." + _rename(key)
        if name in target:
            out[name] = tensor
        else:
            unused.append(key)
    missing = sorted(k for k in target if k not in out)
    if missing or unused:
        parts = []
        if missing:
            parts.append(f"missing weights for {len(missing)} parameter(s) of the converted model: {missing}")
        if unused:
            parts.append(f"{len(unused)} checkpoint key(s) this converter does not know: {sorted(unused)}")
        raise FairseqCheckpointError("checkpoint does not match its args: " + "; ".join(parts) + ".")
    for name, tensor in out.items():
        if tuple(tensor.shape) != tuple(target[name].shape):
            raise FairseqCheckpointError(
                f"shape mismatch for {name}: checkpoint {tuple(tensor.shape)}, model {tuple(target[name].shape)}."
            )
    return {k: v.detach().clone().float() for k, v in out.items()}


def _refuse_output(out_dir: Path, overwrite: bool, checkpoint: object) -> None:
    """Refuse a file, or a non-empty folder unless ``overwrite`` (as ode_transformer.hub.export does): files left from an earlier
    model (a tokenizer.json, a card) would sit next to the new weights and describe another model. A folder that
    holds the checkpoint or a training run is refused whatever ``overwrite`` says."""
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} is a file; OUT_DIR must be a folder (new or empty).")
    source = [checkpoint] if isinstance(checkpoint, (str, Path)) else []
    refuse_replacing_a_run(out_dir, source, "OUT_DIR", overwrite, suffix="converted")
    refuse_occupied(out_dir, overwrite, "--overwrite", "OUT_DIR")


def convert_fairseq_checkpoint(
    checkpoint: str | Path | Mapping[str, Any],
    out_dir: str | Path | None = None,
    trust_pickle: bool = False,
    padding_idx: int = 1,
    overwrite: bool = False,
):
    """Convert a fairseq checkpoint (path or loaded dict) to an `ODETransformerForConditionalGeneration`;
    saved with `save_pretrained` to `out_dir` when given: a non-empty `out_dir` is refused (before the checkpoint
    is read) unless `overwrite`, which deletes what it holds once the conversion succeeded. Returns the model
    (eval mode)."""
    from modeling_ode import ODETransformerForConditionalGeneration

    given = checkpoint  # a path is an input that OUT_DIR must not hold
    if out_dir is not None:
        _refuse_output(Path(out_dir), overwrite, given)
    if isinstance(checkpoint, (str, Path)):
        checkpoint = load_fairseq_checkpoint(checkpoint, trust_pickle=trust_pickle)
    args, state = _split_checkpoint(checkpoint)
    config = config_from_fairseq_args(args, state, padding_idx=padding_idx)
    weights = convert_state_dict(state, config)
    model = ODETransformerForConditionalGeneration(config)
    result = model.load_state_dict(weights, strict=False)
    if result.missing_keys or result.unexpected_keys:  # only tied duplicates may differ
        raise FairseqCheckpointError(f"loading failed: {result}")
    model.eval()
    if out_dir is not None:
        with lock_output(out_dir, "OUT_DIR"):
            _refuse_output(Path(out_dir), overwrite, given)  # again, now that no other writer can fill it
            with staged_folder(out_dir) as staged:  # whole or not at all
                model.save_pretrained(staged, safe_serialization=True)
    return model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}",
        description="Convert an ODE Transformer fairseq checkpoint (libeineu/ODE-Transformer) to an HF folder.",
    )
    parser.add_argument("checkpoint", help="fairseq checkpoint*.pt")
    parser.add_argument("out_dir", help="folder to write (save_pretrained layout)")
    parser.add_argument("--trust-pickle", action="store_true", help=TRUST_PICKLE_HELP)
    parser.add_argument("--padding-idx", type=int, default=1, help="the dictionary's pad index (fairseq: 1)")
    parser.add_argument("--overwrite", action="store_true", help="delete what OUT_DIR holds first")
    args = parser.parse_args(argv)
    try:
        convert_fairseq_checkpoint(
            args.checkpoint, args.out_dir, args.trust_pickle, args.padding_idx, args.overwrite
        )
    except (FairseqCheckpointError, FileNotFoundError, FileExistsError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")  # one line, as argparse's usage errors
    print(args.out_dir)


if __name__ == "__main__":
    main()
