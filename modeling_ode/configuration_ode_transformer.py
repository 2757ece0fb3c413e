"""ODETransformer model configuration."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Iterable
from functools import cache
from typing import Any, Literal, get_args, get_origin

from transformers.utils import logging

try:  # transformers 5, whose configs are dataclasses
    from transformers import PreTrainedConfig

    DATACLASS_CONFIGS = True
except ImportError:  # transformers 4.x (what Optimum pins), for the remote code of an exported folder
    from transformers import PretrainedConfig as PreTrainedConfig

    DATACLASS_CONFIGS = False

from .ode import (
    GATED_MODES,
    LAYER_CONNECTIONS,
    ODE_FUNCTIONS,
    ButcherTableau,
    CoefficientInitName,
    CoefficientModeName,
    CoefficientScopeName,
    EmaAlphaSizeName,
    GateInitName,
    GateInputName,
    LayerConnectionName,
    ODEFunctionName,
    ODEMethodName,
    gate_start_logits,
    paper_coefficients,
    resolve_tableau,
)

logger = logging.get_logger(__name__)

__all__ = [
    "ODETransformerConfig",
    "ODE_FUNCTIONS",
    "LAYER_CONNECTIONS",
    "PAPER_LABEL_SMOOTHING",
    "PRESETS",
]

# The paper's configurations (Appendix "Experimental Setups"): RPR (k = 8) and dense layer connections in
# every setup; the big model uses residual dropout 0.3 (En-De).
_BASE: dict[str, Any] = {
    "d_model": 512,
    "encoder_ffn_dim": 2048,
    "decoder_ffn_dim": 2048,
    "encoder_attention_heads": 8,
    "decoder_attention_heads": 8,
    "encoder_layers": 6,
    "decoder_layers": 6,
}
_PCFORMER: dict[str, Any] = {
    "encoder_ode_coefficients": "ema",
    "encoder_layer_connections": "predictor_corrector",
    "ode_coefficient_scope": "stack",
    "ode_ema_alpha": "scalar",
    "ode_function_includes_residual": True,
}
# The paper's training loss: cross entropy with label smoothing 0.1. The model returns plain cross entropy (as BART
# and Marian do); the smoothing is the Trainer's `label_smoothing_factor`, which ode_transformer.train.run sets to this.
PAPER_LABEL_SMOOTHING = 0.1
PRESETS: dict[str, dict[str, Any]] = {
    "base": dict(_BASE),
    "deep": {
        "d_model": 512,
        "encoder_ffn_dim": 2048,
        "decoder_ffn_dim": 2048,
        "encoder_attention_heads": 8,
        "decoder_attention_heads": 8,
        "encoder_layers": 24,
        "decoder_layers": 6,
    },
    "big": {
        "d_model": 1024,
        "encoder_ffn_dim": 4096,
        "decoder_ffn_dim": 4096,
        "encoder_attention_heads": 16,
        "decoder_attention_heads": 16,
        "encoder_layers": 6,
        "decoder_layers": 6,
        "dropout": 0.3,
    },
    "big_deep": {
        "d_model": 1024,
        "encoder_ffn_dim": 4096,
        "decoder_ffn_dim": 4096,
        "encoder_attention_heads": 16,
        "decoder_attention_heads": 16,
        "encoder_layers": 12,
        "decoder_layers": 6,
        "dropout": 0.3,
    },
    # PCformer (Li et al., NeurIPS 2024) in the released code's NMT setting: the base model whose encoder blocks
    # are an RK2 or RK4 predictor with EMA coefficients (one scalar alpha for the stack, F = the whole layer)
    # and the corrector; a residual decoder with learnable dense connections.
    "pcformer_rk2": {**_BASE, **_PCFORMER, "encoder_ode_method": "rk2"},
    "pcformer_rk4": {**_BASE, **_PCFORMER, "encoder_ode_method": "rk4"},
    # For tests and quick experiments.
    "tiny": {
        "vocab_size": 99,
        "d_model": 16,
        "encoder_ffn_dim": 32,
        "decoder_ffn_dim": 32,
        "encoder_attention_heads": 2,
        "decoder_attention_heads": 2,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "max_relative_position": 4,
    },
}


ActivationName = Literal["relu", "gelu", "gelu_new", "silu", "swish", "tanh"]


def _check_choice(field: str, value: Any, allowed: Iterable[str], default: str) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(
            f"`{field}`={value!r} is not supported; allowed values: {', '.join(allowed)}; "
            f"e.g. `{field}={default!r}`."
        )


def _check_positive(field: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"`{field}` must be a positive integer, got {value!r}.")


def _check_non_negative(field: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"`{field}` must be an integer >= 0, got {value!r}.")


def _check_positive_number(field: str, value: Any) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"`{field}` must be a number > 0, got {value!r}.")


def _check_probability(field: str, value: Any) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < 1.0:
        raise ValueError(f"`{field}` must be a number in [0, 1), got {value!r}; e.g. `{field}=0.1`.")


def _check_token_id(field: str, value: Any, vocab_size: int) -> None:
    ids = value if isinstance(value, list) else [value]
    if any(i is not None and not 0 <= i < vocab_size for i in ids):
        raise ValueError(
            f"`{field}`={value!r} is not a token of the vocabulary (ids 0..{vocab_size - 1}); use the tokenizer's "
            f"id or raise `vocab_size`."
        )


def _config_class(cls: type) -> type:
    """transformers 5: the config as a strict dataclass (``@strict``, its fields type-checked on assignment).
    transformers 4.x, whose configs are no dataclasses: a dataclass without a generated ``__init__``, which
    :func:`_init_without_dataclass_configs` builds as 4.x builds a config, with the same checks; enough for Optimum's
    ``ORTModelForSeq2SeqLM`` to read an exported folder's config.json with ``trust_remote_code=True``."""
    if DATACLASS_CONFIGS:
        from huggingface_hub.dataclasses import strict

        return strict(cls)
    cls = dataclasses.dataclass(init=False, repr=False, eq=False)(cls)
    cls.__init__ = _init_without_dataclass_configs
    return cls


def _init_without_dataclass_configs(self, **kwargs: Any) -> None:
    """transformers 4.x: every field from ``kwargs`` or its default, set by ``PretrainedConfig.__init__`` (which keeps
    any keyword as an attribute), then checked as transformers 5's ``__post_init__`` checks them."""
    _drop_label_smoothing(kwargs)
    fields = {field.name: kwargs.pop(field.name, field.default) for field in dataclasses.fields(type(self))}
    PreTrainedConfig.__init__(self, **fields, **kwargs)
    self._prepare_fields()


def _drop_label_smoothing(kwargs: dict) -> None:
    """`label_smoothing`: a field of configs saved by earlier versions, dropped with a warning."""
    if (smoothing := kwargs.pop("label_smoothing", None)) is not None:
        logger.warning(
            f"config field `label_smoothing`={smoothing} is no longer used: the model returns plain cross "
            "entropy, as BART and Marian do. Label smoothing is the Trainer's: "
            f"`Seq2SeqTrainingArguments(label_smoothing_factor={smoothing})` (ode-train sets the paper's 0.1)."
        )


@_config_class
class ODETransformerConfig(PreTrainedConfig):
    r"""Configuration of an ODE Transformer (Li et al., ACL 2022): a pre-norm Transformer whose blocks are
    Runge-Kutta ODE solvers. The defaults are the paper's base model (6-6, 512/2048, 8 heads) with an RK2
    encoder with the gated coefficients of Eq. (learnable), a residual (Euler) decoder, relative positions
    (k = 8) and learnable dense layer connections, as in the paper's training setup.

    Transformer fields use the usual Hugging Face names (`d_model`, `encoder_layers`, ...). ODE fields, whose
    choices (names, equations, descriptions) are catalogued once, in `modeling_ode/ode.py`; a field that chooses
    from a table is typed with the table's `Literal` (`CoefficientModeName`, ...) and validated against it:

    - `encoder_ode_method` / `decoder_ode_method`: a named method of `ODE_METHODS` or a user Butcher tableau
      `{"a": [[], [1.0]], "b": [0.5, 0.5]}`.
    - `encoder_ode_coefficients` / `decoder_ode_coefficients`: how the stage results are combined, one of
      `COEFFICIENT_MODES` (Table "scale_function"). Not given (None), the paper's block for the side's method
      (`PAPER_COEFFICIENTS`): `gated` for `rk2` (Eq. (learnable)), `tableau` for `rk4` (Eq. (rk4)) and every other
      method; the field then holds that mode, and a saved config.json writes it.
    - `encoder_ode_function` / `decoder_ode_function`: what F is, one of `ODE_FUNCTIONS` (Figure "components").
    - `ode_step_size`: h.
    - `ode_function_includes_residual`: False (the paper): F(y) = G(LN(y)), the layer without its residual.
      True (the authors' code): F is the whole pre-norm layer, residuals included. Euler blocks are the plain
      residual layer in both readings.
    - `ode_coefficient_scope`: who owns the learnable coefficients or gate, one of `COEFFICIENT_SCOPES`.
    - `ode_ema_alpha`: the size of each alpha of `ema` coefficients, one of `EMA_ALPHA_SIZES` (with the scope: one
      scalar per stack or per block, or one per dimension).
    - `ode_gate_inputs`: what the gate of the gated coefficient modes reads, one of `GATE_INPUTS`: the raw stages
      (Eq. (learnable), the default) or the stages layer-normalised (beyond the paper); on every gated side.
    - `ode_gate_init`: how a gate starts, one of `GATE_INITS`: xavier-uniform like every linear layer (the
      default), or W = 0 with the bias that gives the method's tableau weights (RK2: g = 1/2; beyond the paper),
      or within `EULER_GATE_EPSILON` of the residual block y + F1 (`euler`; beyond the paper).
    - `ode_coefficients_init`: how `learnable` coefficients start, one of `COEFFICIENT_INITS`: ones (the paper),
      the method's b, or Euler's (1, 0, ..., 0), which makes every block the residual block y + F1 exactly (for a
      residual model converted to RK blocks, `ODETransformerForConditionalGeneration.from_residual`).
    - `ode_checkpoint_stages`: in training, recompute stages 2..s of every ODE block in the backward pass
      (`torch.utils.checkpoint`) instead of storing their activations: peak memory close to the residual
      model's, for one extra forward of those stages.
    - `encoder_layer_connections` / `decoder_layer_connections`: how blocks are stacked, one of
      `LAYER_CONNECTIONS` (Table "comparison"); `predictor_corrector` makes every block PCformer's predictor and
      corrector (one more evaluation of the layer, with its own KV-cache slot in the decoder).

    Positions: `use_absolute_positions` (sinusoidal, fairseq layout) and Shaw et al. relative positions in
    self-attention with clipping distance `max_relative_position` (0 disables), on keys and, with
    `relative_position_values`, values too.

    `ODETransformerConfig.from_preset("base", vocab_size=34040)` builds the paper's configurations
    (`base`, `deep`, `big`, `big_deep`, and `tiny` for tests) and PCformer's (`pcformer_rk2`, `pcformer_rk4`).
    """

    model_type = "ode_transformer"
    keys_to_ignore_at_inference = ["past_key_values"]
    attribute_map = {
        "num_attention_heads": "encoder_attention_heads",
        "hidden_size": "d_model",
        "num_hidden_layers": "decoder_layers",
    }

    vocab_size: int = 34040
    source_vocab_size: int | None = None
    share_encoder_decoder_embeddings: bool = True
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    activation_function: ActivationName = "relu"
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.1
    activation_dropout: float | int = 0.1
    layer_norm_eps: float = 1e-5
    init_std: float | None = None
    max_position_embeddings: int = 1024
    use_absolute_positions: bool = True
    position_offset: int = 0
    max_relative_position: int = 8
    relative_position_values: bool = False
    scale_embedding: bool = True

    encoder_ode_method: ODEMethodName | dict = "rk2"
    decoder_ode_method: ODEMethodName | dict = "euler"
    # None: the paper's block for the side's method (`paper_coefficients`), written into the config at construction
    encoder_ode_coefficients: CoefficientModeName | None = None
    decoder_ode_coefficients: CoefficientModeName | None = None
    encoder_ode_function: ODEFunctionName = "layer"
    decoder_ode_function: ODEFunctionName = "layer"
    ode_step_size: float | int = 1.0
    ode_function_includes_residual: bool = False
    ode_coefficient_scope: CoefficientScopeName = "block"
    ode_ema_alpha: EmaAlphaSizeName = "scalar"
    ode_gate_inputs: GateInputName = "stages"
    ode_gate_init: GateInitName = "xavier"
    ode_coefficients_init: CoefficientInitName = "ones"
    ode_checkpoint_stages: bool = False
    encoder_layer_connections: LayerConnectionName = "learnable_dense"
    decoder_layer_connections: LayerConnectionName = "learnable_dense"

    use_cache: bool = True
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 2
    forced_eos_token_id: int | list[int] | None = None
    is_encoder_decoder: bool = True
    tie_word_embeddings: bool = True
    # set by `ode-export`: the digest of the folder's weights, which `from_pretrained` compares with the one
    # `model.safetensors` records; `save_pretrained` does not write it (weights saved anew are not the export's)
    weights_digest: str | None = None

    def __post_init__(self, **kwargs):
        _drop_label_smoothing(kwargs)
        self._prepare_fields()
        super().__post_init__(**kwargs)

    def _prepare_fields(self) -> None:
        """A method given as a ButcherTableau written as its dict, one embedding table where the sizes agree, the
        paper's coefficients where none are given, and every field checked."""
        if isinstance(self.encoder_ode_method, ButcherTableau):
            self.encoder_ode_method = self.encoder_ode_method.to_dict()
        if isinstance(self.decoder_ode_method, ButcherTableau):
            self.decoder_ode_method = self.decoder_ode_method.to_dict()
        if self.share_encoder_decoder_embeddings and self.source_vocab_size == self.vocab_size:
            # one table, of vocab_size rows, which resize_token_embeddings changes
            self.source_vocab_size = None
        self._resolve_coefficients()
        self._check_fields()

    def validate_ode_transformer(self) -> None:
        """`@strict` class validator: the checks of construction, run again by `validate()`, which models call
        when they are built and `save_pretrained` calls before it writes (fields may change after construction)."""
        self._resolve_coefficients()
        self._check_fields()

    def _resolve_coefficients(self) -> None:
        """Coefficients not given become the paper's block for the side's method (RK2: `gated`, Eq. (learnable);
        RK4 and every other method: `tableau`), written into the field: `save_pretrained` writes the concrete
        mode, so a saved config keeps its block whatever a later version's default is. (Every version has written
        both coefficient fields; a config.json without them, written by hand, gets the paper's block.)"""
        for side in ("encoder", "decoder"):
            if getattr(self, f"{side}_ode_coefficients") is None:
                setattr(
                    self, f"{side}_ode_coefficients", paper_coefficients(getattr(self, f"{side}_ode_method"))
                )

    def _check_fields(self) -> None:
        """Every field checked at construction; a ValueError names the field, the value and what is allowed."""
        self._check_sizes()
        for field, (allowed, default) in _choice_fields().items():
            if default is None:  # the coefficients: the example is the paper's block for the side's method
                default = paper_coefficients(getattr(self, field.replace("_coefficients", "_method")))
            _check_choice(field, getattr(self, field), allowed, default)
        for side in ("encoder", "decoder"):
            self._check_ode_side(side)
        self._check_gate_inputs()
        for field in ("dropout", "attention_dropout", "activation_dropout"):
            _check_probability(field, getattr(self, field))
        for field in (
            "pad_token_id",
            "bos_token_id",
            "eos_token_id",
            "decoder_start_token_id",
            "forced_eos_token_id",
        ):
            _check_token_id(field, getattr(self, field), self.vocab_size)
        self._check_positions()
        for field in ("ode_step_size", "layer_norm_eps"):
            _check_positive_number(field, getattr(self, field))

    def _check_sizes(self) -> None:
        for field in (
            "vocab_size",
            "d_model",
            "encoder_layers",
            "decoder_layers",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "max_position_embeddings",
        ):
            _check_positive(field, getattr(self, field))
        if self.source_vocab_size is not None:
            _check_positive("source_vocab_size", self.source_vocab_size)
            if self.share_encoder_decoder_embeddings and self.source_vocab_size != self.vocab_size:
                raise ValueError(
                    f"`source_vocab_size`={self.source_vocab_size} differs from `vocab_size`={self.vocab_size} "
                    "but `share_encoder_decoder_embeddings=True`; set `share_encoder_decoder_embeddings=False` "
                    "for a separate source vocabulary."
                )
        for side in ("encoder", "decoder"):
            heads = getattr(self, f"{side}_attention_heads")
            if self.d_model % heads:
                raise ValueError(
                    f"`{side}_attention_heads`={heads} does not divide `d_model`={self.d_model}; choose a head "
                    "count that divides the hidden size."
                )

    def _check_positions(self) -> None:
        _check_non_negative("max_relative_position", self.max_relative_position)  # 0: no relative positions
        _check_non_negative("position_offset", self.position_offset)
        if self.relative_position_values and self.max_relative_position == 0:
            raise ValueError("`relative_position_values=True` needs `max_relative_position` > 0.")
        if self.use_absolute_positions and self.d_model % 2:
            raise ValueError(f"sinusoidal positions need an even `d_model`, got {self.d_model}.")

    def _check_ode_side(self, side: str) -> None:
        """The side's method and the gate it needs; its other choices are `Literal` fields (`_choice_fields`)."""
        tableau = resolve_tableau(getattr(self, f"{side}_ode_method"), f"{side}_ode_method")
        coefficients = getattr(self, f"{side}_ode_coefficients")
        if coefficients in GATED_MODES and tableau.num_stages < 2:
            raise ValueError(
                f"`{side}_ode_coefficients`={coefficients!r} gates between stages, but "
                f"`{side}_ode_method`={getattr(self, f'{side}_ode_method')!r} has a single stage; use a "
                "multi-stage method (e.g. 'rk2') or coefficients 'tableau'."
            )

    def _check_gate_inputs(self) -> None:
        """A gate input or start other than the default needs a gate, and a coefficient start learnable
        coefficients: refused where it would change nothing."""
        sides = ("encoder", "decoder") if self.is_encoder_decoder else ("decoder",)
        gated = [side for side in sides if getattr(self, f"{side}_ode_coefficients") in GATED_MODES]
        learnable = [side for side in sides if getattr(self, f"{side}_ode_coefficients") == "learnable"]
        for field, default, effect, owners, needed in (
            ("ode_gate_inputs", "stages", "changes what a gate reads", gated, "gated"),
            ("ode_gate_init", "xavier", "sets how a gate starts", gated, "gated"),
            (
                "ode_coefficients_init",
                "ones",
                "sets how learnable coefficients start",
                learnable,
                "learnable",
            ),
        ):
            value = getattr(self, field)
            if value != default and not owners:
                what = "a gate" if needed == "gated" else "learnable coefficients"
                raise ValueError(
                    f"`{field}`={value!r} {effect}, but no ODE block of this model has {what}; use {needed} "
                    f"coefficients (e.g. `{sides[0]}_ode_coefficients='{needed}'`) or `{field}='{default}'`."
                )
        if self.ode_gate_init != "xavier":
            for side in gated:  # the start's weights must be a gate output (softmax: all positive)
                gate_start_logits(
                    getattr(self, f"{side}_ode_coefficients"), self.ode_gate_init, self.tableau(side)
                )
        for field in ("ode_gate_init", "ode_coefficients_init"):
            if getattr(self, field) == "euler" and self.ode_function_includes_residual:
                raise ValueError(
                    f"`{field}`='euler' starts blocks as y + F1, the residual block only in the paper's reading of F: "
                    "with `ode_function_includes_residual=True` F1 = y + G(y) already holds y, so y + F1 = 2y + G(y); "
                    "use `ode_function_includes_residual=False`."
                )

    def tableau(self, side: str) -> ButcherTableau:
        """The ButcherTableau of the `encoder` or `decoder` ODE blocks."""
        return resolve_tableau(getattr(self, f"{side}_ode_method"), f"{side}_ode_method")

    @property
    def encoder_vocab_size(self) -> int:
        return self.vocab_size if self.source_vocab_size is None else self.source_vocab_size

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> ODETransformerConfig:
        """The paper's configurations: `base` (6-6), `deep` (24-6), `big` (6-6), `big_deep` (12-6), `tiny`; PCformer's
        NMT setting on the base model: `pcformer_rk2`, `pcformer_rk4`."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; available presets: {', '.join(PRESETS)}.")
        # transformers keeps any unknown keyword as a config attribute; a misspelt field would go unused
        fields = {field.name for field in dataclasses.fields(cls)} | set(cls.attribute_map)
        for key in sorted(set(overrides) - fields):
            if close := difflib.get_close_matches(key, fields, n=1, cutoff=0.85):
                raise ValueError(f"`{key}` is not a configuration field; did you mean `{close[0]}`?")
        return cls(**{**PRESETS[name], **overrides})


@cache
def _choice_fields() -> dict[str, tuple[tuple[str, ...], str]]:
    """The fields declared `Literal[...]` (or `Literal[...] | None`, None being resolved at construction): name ->
    (allowed values, default). The annotations are the one list of choices (the catalogue's Literal types of
    `ode.py`); `@strict` does not type-check them (this module's annotations are postponed, so it sees strings),
    `validate_ode_transformer` does, with errors that name the fix."""
    hints = inspect.get_annotations(ODETransformerConfig, eval_str=True)  # this class's own fields
    choices = {}
    for field in dataclasses.fields(ODETransformerConfig):
        hint = hints.get(field.name)
        if get_origin(hint) is not Literal:
            literals = [arg for arg in get_args(hint) if get_origin(arg) is Literal]
            if len(literals) != 1 or set(get_args(hint)) != {literals[0], type(None)}:
                continue
            hint = literals[0]
        choices[field.name] = (get_args(hint), field.default)
    return choices
