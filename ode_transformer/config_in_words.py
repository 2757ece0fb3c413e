"""The configuration of an ODE Transformer in words, as its model card states it: the card's title, the ODE blocks
of each side in the words of the catalogue (`modeling_ode/ode.py`, the formula generated from the config), width,
positions, vocabulary and parameter counts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .wording import GATED_RK2_FINDING, counted, gated_rk2_sides

if TYPE_CHECKING:
    from .card_metrics import CardMetrics

__all__ = [
    "DEFAULT_BLOCK_NOTE",
    "card_title",
    "count_parameters",
    "default_task",
    "describe_ode",
    "human_count",
]


def default_task(config) -> str:
    """The task a card names where its metrics name none: translation for an encoder-decoder, else text
    generation."""
    return "translation" if config.is_encoder_decoder else "text-generation"


def _fraction(x: float) -> str:
    from fractions import Fraction

    f = Fraction(x).limit_denominator(12)
    return str(f) if abs(float(f) - x) < 1e-9 else f"{x:g}"


def _method_in_words(method: str | dict, tableau, mode: str, step_size: float) -> str:
    """The method and the block it builds with `mode`'s coefficients: the formula is generated from the config
    (`block_equation`), never the method's own equation, which holds for its tableau weights only."""
    from modeling_ode.ode import block_equation

    equation = f"y_{{t+1}} = {block_equation(tableau, mode, step_size)}"
    if not isinstance(method, str):
        return f"a user Butcher tableau {tableau.to_dict()}, {equation}"
    stages = f"{tableau.num_stages} stage{'s' if tableau.num_stages > 1 else ''}"
    if method == "rk2" and mode == "gated":  # the paper's own block, by the paper's name first
        return (
            "the paper's RK2-block (learnable gamma), Eq. (learnable): a second-order Runge-Kutta block gating the 2 "
            f"stages of improved Euler / Heun (Eq. (rk2)), {equation}"
        )
    return f"{tableau.description} with {stages}, {equation}"


def _coefficients_in_words(
    mode: str, tableau, scope: str, alpha_size: str = "scalar", gate_inputs: str = "stages"
) -> str:
    from modeling_ode.ode import (
        COEFFICIENT_MODES,
        COEFFICIENT_SCOPES,
        EMA_ALPHA_SIZES,
        GATE_INPUTS,
        GATED_MODES,
    )

    text = f"{COEFFICIENT_MODES[mode].description}, {COEFFICIENT_MODES[mode].equation}"
    if mode == "tableau":
        return f"{text} = ({', '.join(_fraction(x) for x in tableau.b)})"
    if mode == "ema":
        return f"{text} ({EMA_ALPHA_SIZES[alpha_size]}, {COEFFICIENT_SCOPES[scope]})"
    if mode in GATED_MODES and gate_inputs != "stages":  # the paper's gate is the mode's own equation
        return f"{text} ({COEFFICIENT_SCOPES[scope]}; {GATE_INPUTS[gate_inputs]})"
    return text if mode == "ones" else f"{text} ({COEFFICIENT_SCOPES[scope]})"


# What the project's own runs show about the block the recipes build by default; the figures, generated from the
# results with their tests, are in the repository's results/verdict.md.
DEFAULT_BLOCK_NOTE = f"**About the gated RK2 block**: {GATED_RK2_FINDING}"


def describe_ode(config) -> list[str]:
    """The ODE configuration of `config` as a list of Markdown bullet lines, in the words of the catalogue
    (`modeling_ode/ode.py`)."""
    from modeling_ode.ode import LAYER_CONNECTIONS, ODE_FUNCTIONS

    lines = []
    sides = ("encoder", "decoder") if config.is_encoder_decoder else ("decoder",)
    for side in sides:
        method = getattr(config, f"{side}_ode_method")
        tableau = config.tableau(side)
        mode = getattr(config, f"{side}_ode_coefficients") if tableau.num_stages > 1 else "tableau"
        name = _method_in_words(method, tableau, mode, float(config.ode_step_size))
        layers = getattr(config, f"{side}_layers")
        label = side.capitalize() if config.is_encoder_decoder else "Decoder (causal LM)"
        text = f"**{label}**: {counted(layers, 'layer')}; each layer is {name}"
        if tableau.num_stages > 1:
            coefficients = _coefficients_in_words(
                mode,
                tableau,
                config.ode_coefficient_scope,
                config.ode_ema_alpha,
                config.ode_gate_inputs,
            )
            text += f", combining its stages with {coefficients}"
            text += f"; F is {ODE_FUNCTIONS[getattr(config, f'{side}_ode_function')]}"
            text += (
                "; F includes the layer's residual connections (the authors' code: F(y) = L(y))"
                if config.ode_function_includes_residual
                else "; F(y) = G(LN(y)) without the residual (the paper's reading)"
            )
            if float(config.ode_step_size) != 1.0:
                text += f"; step size h = {config.ode_step_size:g}"
        connections = LAYER_CONNECTIONS[getattr(config, f"{side}_layer_connections")]
        text += f"; blocks are stacked with {connections}."
        lines.append(f"- {text}")
        if side in gated_rk2_sides(config):
            lines.append(f"- {DEFAULT_BLOCK_NOTE}")
    width = (
        f"- **Width**: d_model {config.d_model}, feed-forward {config.encoder_ffn_dim}/{config.decoder_ffn_dim} "
        f"(encoder/decoder), {config.encoder_attention_heads}/{config.decoder_attention_heads} attention heads, "
        f"pre-norm, {config.activation_function} activation."
        if config.is_encoder_decoder
        else f"- **Width**: d_model {config.d_model}, feed-forward {config.decoder_ffn_dim}, "
        f"{config.decoder_attention_heads} attention heads, pre-norm, {config.activation_function} activation."
    )
    lines.append(width)
    positions = []
    if config.use_absolute_positions:
        positions.append("sinusoidal absolute positions, computed for any length (no weights, no limit)")
    if config.max_relative_position > 0:
        kind = "keys and values" if config.relative_position_values else "keys"
        positions.append(
            f"relative position representations (Shaw et al. 2018) on {kind}, clipping distance "
            f"k = {config.max_relative_position}"
        )
    lines.append(f"- **Positions**: {'; '.join(positions) or 'none'}.")
    vocab = f"{config.vocab_size} tokens"
    if config.is_encoder_decoder:
        vocab += (
            ", shared by source and target"
            if config.share_encoder_decoder_embeddings
            else f" (target), {config.encoder_vocab_size} (source)"
        )
    if config.tie_word_embeddings:
        vocab += "; output projection tied to the embeddings"
    lines.append(f"- **Vocabulary**: {vocab}.")
    return lines


def count_parameters(config) -> dict[str, int]:
    """Parameter counts of the model ``config`` describes (built on the meta device; tied weights counted once)."""
    import torch

    from modeling_ode import ODETransformerForCausalLM, ODETransformerForConditionalGeneration

    cls = ODETransformerForConditionalGeneration if config.is_encoder_decoder else ODETransformerForCausalLM
    with torch.device("meta"):
        model = cls(config)
    return {"total": model.num_parameters(), "non_embedding": model.num_parameters(exclude_embeddings=True)}


def human_count(n: int) -> str:
    """``n`` as the card rounds a count: 1.2M, 3.4K, or the number itself."""
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K" if n >= 1e3 else str(n)


_LANGUAGES = {
    "en": "English",
    "de": "German",
    "fr": "French",
    "ro": "Romanian",
    "cs": "Czech",
    "ru": "Russian",
}


def _method_name(config, side: str) -> str:
    method = getattr(config, f"{side}_ode_method")
    if not isinstance(method, str):
        return "Runge-Kutta"
    name = "residual" if method == "euler" else method.upper() if method.startswith("rk") else method
    return (
        f"{name}-gated"
        if method != "euler" and "gated" in getattr(config, f"{side}_ode_coefficients")
        else name
    )


def card_title(config, metrics: CardMetrics | None) -> str:
    """``metrics.title``, else e.g. "ODE Transformer (RK2-gated encoder, residual decoder, 3-3 layers,
    d 256): English-German translation, Multi30k Task 1"."""
    if metrics is not None and metrics.title:
        return metrics.title
    if config.is_encoder_decoder:
        shape = (
            f"{_method_name(config, 'encoder')} encoder, {_method_name(config, 'decoder')} decoder, "
            f"{config.encoder_layers}-{config.decoder_layers} layers, d {config.d_model}"
        )
    else:
        shape = f"{_method_name(config, 'decoder')} causal LM, {counted(config.decoder_layers, 'layer')}, d {config.d_model}"
    task = ((metrics and metrics.task) or default_task(config)).replace("-", " ")
    languages = (metrics and metrics.language) or []
    if len(languages) == 2:
        task = "-".join(_LANGUAGES.get(code, code) for code in languages) + f" {task}"
    dataset = metrics.dataset.get("name") if metrics is not None else None
    return f"ODE Transformer ({shape}): {task}" + (f", {dataset}" if dataset else "")
