"""The numerics of the ODE Transformer, in one place.

An ODE block (Li et al., ACL 2022, Section 3) integrates dy/dt = F(y) over one step with an explicit
Runge-Kutta method. Eq. (rk-yt1)-(rk-fi) of the paper:

    F_i     = h * F(w_i * y_t + sum_{j<i} a_ij F_j)        (w_i = 1 for every Runge-Kutta method)
    y_{t+1} = y_t + sum_i gamma_i F_i

A method is *data*: a :class:`ButcherTableau` (a, b, c, plus the stage weights w of y, which lets PolyNet's
y + F(y) + F(F(y)) be written in the same form). How the stage results are combined (gamma) is a separate,
swappable :class:`StageCoefficients` module: the tableau's own b weights, ones, learnable scalars, a
gate computed from the stages (the paper's best, Eq. (learnable)), or PCformer's exponential moving average
(Li et al., NeurIPS 2024). :func:`ode_step` applies both to any
function F, and is used by the encoder, the decoder and the causal LM alike.

The catalogue lives here, on the data, once: every named method (`ODE_METHODS`), coefficient mode
(`COEFFICIENT_MODES`), choice of F (`ODE_FUNCTIONS`), layer connection (`LAYER_CONNECTIONS`), coefficient
scope (`COEFFICIENT_SCOPES`), size of an EMA coefficient (`EMA_ALPHA_SIZES`), input of a gate (`GATE_INPUTS`),
start of a gate (`GATE_INITS`) and start of learnable coefficients (`COEFFICIENT_INITS`) carries its equation
and a one-line description. The config validates against these tables, and the model card and the README's config
table are written from (or tested against) them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

__all__ = [
    "CoefficientInitName",
    "CoefficientModeName",
    "CoefficientScopeName",
    "EmaAlphaSizeName",
    "GateInitName",
    "GateInputName",
    "LayerConnectionName",
    "ODEFunctionName",
    "ODEMethodName",
    "COEFFICIENT_INITS",
    "COEFFICIENT_MODES",
    "COEFFICIENT_SCOPES",
    "EMA_ALPHA_SIZES",
    "EULER_GATE_EPSILON",
    "GATED_MODES",
    "GATE_INITS",
    "GATE_INPUTS",
    "LAYER_CONNECTIONS",
    "ODE_FUNCTIONS",
    "ODE_METHODS",
    "PAPER_COEFFICIENTS",
    "ButcherTableau",
    "CoefficientMode",
    "ODEStageRecorder",
    "StageCoefficients",
    "StageGate",
    "block_equation",
    "euler_weights",
    "gate_start_logits",
    "ode_step",
    "paper_coefficients",
    "resolve_tableau",
    "start_weights",
    "tableau_gate_logits",
]


@dataclass(frozen=True)
class ButcherTableau:
    """An explicit Runge-Kutta method.

    Args:
        a: row i holds the weights a_ij (j < i) of the earlier stages in the input of stage i; row 0 is empty.
        b: the weights of the stages in the update (the method's gamma, Eq. (rk-yt1)).
        c: the nodes; c_i = sum_j a_ij for a consistent method.
        y_weights: the weight w_i of y in the input of stage i; 1 for every Runge-Kutta method. PolyNet
            (y + F(y) + F(F(y))) is the one method here with w = (1, 0).
        order: the method's order of accuracy, where it has one (used in docs and tests only).
        equation: the block written out, y_{t+1} in terms of y and the stages F_i (docs only).
        description: what the method is, in words (docs only).
    """

    a: tuple[tuple[float, ...], ...]
    b: tuple[float, ...]
    c: tuple[float, ...]
    y_weights: tuple[float, ...] | None = None
    order: int | None = None
    equation: str = field(default="", compare=False)
    description: str = field(default="", compare=False)

    @property
    def num_stages(self) -> int:
        return len(self.b)

    @property
    def stage_y_weights(self) -> tuple[float, ...]:
        return self.y_weights if self.y_weights is not None else (1.0,) * self.num_stages

    def check(self, field: str = "tableau") -> None:
        """Raise a ValueError naming `field` unless this is a well-formed explicit tableau."""
        s = self.num_stages
        if s < 1:
            raise ValueError(f"`{field}`: a tableau needs at least one stage, got b={self.b}.")
        if len(self.a) != s or len(self.c) != s:
            raise ValueError(
                f"`{field}`: a, b and c must describe the same number of stages, got {len(self.a)} rows in a, "
                f"{s} weights in b and {len(self.c)} nodes in c."
            )
        for i, row in enumerate(self.a):
            if len(row) != i:
                raise ValueError(
                    f"`{field}`: only explicit methods are supported: row {i} of a must hold exactly {i} "
                    f"weight(s) (the earlier stages), got {list(row)}."
                )
            if not math.isclose(sum(row), self.c[i], abs_tol=1e-9):
                raise ValueError(
                    f"`{field}`: row {i} of a sums to {sum(row):g} but c[{i}] = {self.c[i]:g}; the rows of a must "
                    "sum to c."
                )
        if len(self.stage_y_weights) != s:
            raise ValueError(f"`{field}`: y_weights must have {s} entries, got {self.y_weights}.")

    def to_dict(self) -> dict:
        out = {"a": [list(r) for r in self.a], "b": list(self.b), "c": list(self.c)}
        if self.y_weights is not None:
            out["y_weights"] = list(self.y_weights)
        if self.order is not None:
            out["order"] = self.order
        return out

    @classmethod
    def from_dict(cls, data: dict, field: str = "tableau") -> ButcherTableau:
        unknown = set(data) - {"a", "b", "c", "y_weights", "order"}
        if unknown or not {"a", "b"} <= set(data):
            raise ValueError(
                f"`{field}`: a user tableau is a dict with keys 'a' (rows of stage weights), 'b' (update weights) "
                f"and optionally 'c', 'y_weights', 'order'; got keys {sorted(data)}."
            )
        a = tuple(_numbers(row, f"{field}['a'][{i}]") for i, row in enumerate(data["a"]))
        c, y_weights = data.get("c"), data.get("y_weights")
        tableau = cls(
            a=a,
            b=_numbers(data["b"], f"{field}['b']"),
            c=_numbers(c, f"{field}['c']") if c is not None else tuple(sum(row) for row in a),
            y_weights=_numbers(y_weights, f"{field}['y_weights']") if y_weights is not None else None,
            order=data.get("order"),
        )
        tableau.check(field)
        return tableau


def _numbers(values: Sequence, field: str) -> tuple[float, ...]:
    """The entries of one tableau row/vector as floats; anything else (a string, None) is refused by name."""
    for j, x in enumerate(values):
        if not isinstance(x, (int, float)) or isinstance(x, bool):
            raise ValueError(f"`{field}[{j}]`={x!r} is not a number; tableau entries are numbers, e.g. 0.5.")
    return tuple(float(x) for x in values)


# Each table's names are also a `Literal` type, the type of the config fields that choose from it (type checkers
# and IDEs see the choices; the config validates against the type's values). `tests/test_ode.py` checks that each
# type holds exactly its table's names, in the table's order.
ODEMethodName = Literal[
    "euler", "rk2", "midpoint", "ralston", "rk3", "rk4", "rk4_38", "weight_sharing", "polynet"
]
ODE_METHODS: dict[ODEMethodName, ButcherTableau] = {
    "euler": ButcherTableau(
        a=((),),
        b=(1.0,),
        c=(0.0,),
        order=1,
        equation="y + F(y)",
        description="a residual (first-order Euler) block",
    ),
    "rk2": ButcherTableau(
        a=((), (1.0,)),
        b=(0.5, 0.5),
        c=(0.0, 1.0),
        order=2,
        equation="y + (F1 + F2) / 2, F2 = F(y + F1)",
        description="a second-order Runge-Kutta block (improved Euler / Heun, Eq. (rk2))",
    ),
    "midpoint": ButcherTableau(
        a=((), (0.5,)),
        b=(0.0, 1.0),
        c=(0.0, 0.5),
        order=2,
        equation="y + F2, F2 = F(y + F1 / 2)",
        description="a second-order Runge-Kutta block (midpoint method)",
    ),
    "ralston": ButcherTableau(
        a=((), (2 / 3,)),
        b=(0.25, 0.75),
        c=(0.0, 2 / 3),
        order=2,
        equation="y + F1 / 4 + 3 F2 / 4, F2 = F(y + 2 F1 / 3)",
        description="a second-order Runge-Kutta block (Ralston's method)",
    ),
    "rk3": ButcherTableau(
        a=((), (0.5,), (-1.0, 2.0)),
        b=(1 / 6, 2 / 3, 1 / 6),
        c=(0.0, 0.5, 1.0),
        order=3,
        equation="y + (F1 + 4 F2 + F3) / 6, F2 = F(y + F1 / 2), F3 = F(y - F1 + 2 F2)",
        description="a third-order Runge-Kutta block (Kutta's method)",
    ),
    "rk4": ButcherTableau(
        a=((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)),
        b=(1 / 6, 1 / 3, 1 / 3, 1 / 6),
        c=(0.0, 0.5, 0.5, 1.0),
        order=4,
        equation="y + (F1 + 2 F2 + 2 F3 + F4) / 6",
        description="a fourth-order Runge-Kutta block (classical RK4, Eq. (rk4))",
    ),
    "rk4_38": ButcherTableau(
        a=((), (1 / 3,), (-1 / 3, 1.0), (1.0, -1.0, 1.0)),
        b=(1 / 8, 3 / 8, 3 / 8, 1 / 8),
        c=(0.0, 1 / 3, 2 / 3, 1.0),
        order=4,
        equation="y + (F1 + 3 F2 + 3 F3 + F4) / 8",
        description="a fourth-order Runge-Kutta block (3/8 rule)",
    ),
    # Table "scale_function", row "weight sharing". In the paper's reading of F this is also RK2 with gamma = 1
    # (y + F1 + F2); with `ode_function="sublayers"` it is the authors' code's sublayer sharing (SAN twice, then
    # FFN twice). Like PolyNet's, its equation assumes the paper's F (`ode_function_includes_residual=False`).
    "weight_sharing": ButcherTableau(
        a=((), (1.0,)),
        b=(1.0, 1.0),
        c=(0.0, 1.0),
        equation="y1 + F(y1), y1 = y + F(y)",
        description="the same layer applied twice in sequence (weight sharing)",
    ),
    # Table "comparison": the second stage sees F1 alone, not y + F1.
    "polynet": ButcherTableau(
        a=((), (1.0,)),
        b=(1.0, 1.0),
        c=(0.0, 1.0),
        y_weights=(1.0, 0.0),
        equation="y + F(y) + F(F(y))",
        description="a PolyNet block",
    ),
}


@dataclass(frozen=True)
class CoefficientMode:
    """How the stage results of a block are combined (Table "scale_function"): gamma, in words.

    Args:
        equation: gamma written out.
        description: what the mode is, in words.
        gated: gamma is computed from the stages by a gate (needs at least two stages).
    """

    equation: str
    description: str
    gated: bool = False


CoefficientModeName = Literal[
    "tableau", "ones", "learnable", "gated", "gated_independent", "gated_tanh", "ema"
]
COEFFICIENT_MODES: dict[CoefficientModeName, CoefficientMode] = {
    "tableau": CoefficientMode(
        "gamma = b", "the method's own weights b (RK2: 1/2, 1/2; RK4: 1/6, 2/6, 2/6, 1/6)"
    ),
    "ones": CoefficientMode("gamma_i = 1", 'every stage weighted 1 ("RK2-block (gamma_i = 1)")'),
    "learnable": CoefficientMode(
        "gamma_i = w_i", 'learnable scalars initialised to 1 ("learnable gamma_i = 1")'
    ),
    "gated": CoefficientMode(
        "gamma = (g, 1 - g), g = sigmoid([F1, F2] W + b); gamma = softmax([F1..Fs] W + b, 0) for s > 2",
        "a learned gate, one value per token (Eq. (learnable), the paper's best)",
        gated=True,
    ),
    "gated_independent": CoefficientMode(
        "gamma_i = sigmoid([F1..Fs] W_i + b_i)", 'independent sigmoid gates ("sigmoid, sigmoid")', gated=True
    ),
    "gated_tanh": CoefficientMode(
        "gamma_i = tanh([F1..Fs] W_i + b_i)", 'independent tanh gates ("tanh, tanh")', gated=True
    ),
    "ema": CoefficientMode(
        "gamma_i = alpha (1 - alpha)^(s - i); RK2: a(1-a), a; RK4: a(1-a)^3, a(1-a)^2, a(1-a), a",
        "an exponential moving average of the stages with a learnable alpha initialised to 0.5 (PCformer)",
    ),
}
GATED_MODES = tuple(name for name, mode in COEFFICIENT_MODES.items() if mode.gated)
# The paper's block for each method, built when no coefficients are given: its RK2-block is the learnable (gated)
# one, Eq. (learnable); RK4 and every other named method is its fixed tableau (Eq. (rk4): gamma = b), as is a user
# tableau. `encoder_ode_coefficients` / `decoder_ode_coefficients` choose another combination.
PAPER_COEFFICIENTS: dict[ODEMethodName, CoefficientModeName] = {"rk2": "gated"}


def paper_coefficients(method: str | dict | ButcherTableau) -> CoefficientModeName:
    """The coefficients of the paper's block for `method` (`PAPER_COEFFICIENTS`, else `tableau`)."""
    return PAPER_COEFFICIENTS.get(method, "tableau") if isinstance(method, str) else "tableau"


def block_equation(tableau: ButcherTableau, mode: str, step_size: float = 1.0) -> str:
    """The block a method and a coefficient mode build, written out from their data (docs only: the model card):
    y_{t+1} in terms of y and the stages, then each stage, e.g. the paper's RK2-block
    "y + g F1 + (1 - g) F2; F1 = F(y), F2 = F(y + F1)". The coefficients are named as in `COEFFICIENT_MODES`:
    g for the two-stage gate, gamma_i for learned weights and other gates, a for the EMA's alpha."""
    s = tableau.num_stages
    stages = [f"F{i + 1}" for i in range(s)]
    if mode == "tableau":
        update = _fixed_combination(tableau.b, stages)
    elif mode == "ones":
        update = " + ".join(stages)
    elif mode == "gated" and s == 2:
        update = "g F1 + (1 - g) F2"
    elif mode == "ema":
        powers = ["" if k == 0 else " (1 - a)" if k == 1 else f" (1 - a)^{k}" for k in range(s - 1, -1, -1)]
        update = " + ".join(f"a{power} {stage}" for power, stage in zip(powers, stages))
    else:
        update = " + ".join(f"gamma_{i + 1} {stage}" for i, stage in enumerate(stages))
    scale = "" if step_size == 1.0 else f"{step_size:g} "
    definitions = []
    for i, (row, y_weight) in enumerate(zip(tableau.a, tableau.stage_y_weights)):
        argument = _fixed_combination((y_weight, *row), ["y", *stages[:i]], common_denominator=False)
        definitions.append(f"{stages[i]} = {scale}F({argument})")
    return f"y + {update}; {', '.join(definitions)}"


def _fixed_combination(
    weights: Sequence[float], symbols: Sequence[str], common_denominator: bool = True
) -> str:
    """sum_i weights_i symbols_i in words, zero terms left out, e.g. "(F1 + 2 F2 + 2 F3 + F4) / 6" (with a
    `common_denominator` where every weight is a small fraction) or "y + F1 / 2"."""
    from fractions import Fraction

    fractions = [Fraction(w).limit_denominator(1000) for w in weights]
    rational = all(math.isclose(float(f), w, abs_tol=1e-12) for f, w in zip(fractions, weights))
    denominator = math.lcm(*(f.denominator for f in fractions)) if rational and common_denominator else 1
    terms = []
    for weight, fraction, symbol in zip(weights, fractions, symbols):
        if weight == 0:
            continue
        scaled = fraction * denominator
        if not rational:
            magnitude = f"{abs(weight):g} {symbol}"
        else:
            numerator = "" if abs(scaled.numerator) == 1 else f"{abs(scaled.numerator)} "
            magnitude = f"{numerator}{symbol}" + (
                f" / {scaled.denominator}" if scaled.denominator != 1 else ""
            )
        terms.append(("- " if weight < 0 else "+ ") + magnitude)
    if not terms:
        return "0"
    text = " ".join(terms).removeprefix("+ ")
    if text.startswith("- "):
        text = "-" + text[2:]
    if denominator == 1:
        return text
    return f"({text}) / {denominator}" if len(terms) > 1 else f"{text} / {denominator}"


# What F is (Figure "components"). Sublayers that are not part of F stay residual.
ODEFunctionName = Literal["layer", "attention", "ffn", "sublayers"]
ODE_FUNCTIONS: dict[ODEFunctionName, str] = {
    "layer": "the whole layer (self-attention and feed-forward network together, the paper's SAN+FFN)",
    "attention": "the self-attention sublayer (the other sublayers stay residual)",
    "ffn": "the feed-forward sublayer (the other sublayers stay residual)",
    "sublayers": "each sublayer separately (every sublayer is its own ODE block)",
}

# The sublayers of a layer, by their module names (also those of their weights).
SELF_ATTENTION, CROSS_ATTENTION, FFN = "self_attn", "encoder_attn", "ffn"


def ode_groups(ode_function: str, sublayers: tuple[str, ...]) -> list[tuple[tuple[str, ...], bool]]:
    """Split a layer's sublayers into blocks: (sublayer names, is an ODE block). Sublayers outside F stay
    plain residual blocks (Figure "components")."""
    if ode_function == "layer":
        return [(sublayers, True)]
    if ode_function == "sublayers":
        return [((name,), True) for name in sublayers]
    ode_sublayer = SELF_ATTENTION if ode_function == "attention" else FFN
    return [((name,), name == ode_sublayer) for name in sublayers]


# How blocks are stacked (Table "comparison").
LayerConnectionName = Literal[
    "residual", "dense", "learnable_dense", "leapfrog", "multistep", "predictor_corrector"
]
LAYER_CONNECTIONS: dict[LayerConnectionName, str] = {
    "residual": "plain stacking, y_{t+1} = block(y_t)",
    "dense": "dense layer connections with fixed mean weights (DLCL)",
    "learnable_dense": "learnable dense layer connections (DLCL, Wang et al. 2019)",
    "leapfrog": "leapfrog connections y_{t+1} = y_{t-1} + 2F(y_t)",
    "multistep": "linear multistep connections y_{t+1} = k y_t + (1 - k) y_{t-1} + F(y_t) with learnable k",
    "predictor_corrector": (
        "PCformer's corrector (Li et al. 2024): the block is the predictor P; with the DLCL history h (layer-normalised"
        " states), the corrector evaluates the layer once more, h_{t+1} = LN(layer(sum_j V[t+1, j] h_j)) with"
        " LN'(P) as the newest state, and y_{t+1} = sum_j W[t+1, j] h_j"
    ),
}

# Who owns the learnable coefficients or gate.
CoefficientScopeName = Literal["block", "stack"]
COEFFICIENT_SCOPES: dict[CoefficientScopeName, str] = {
    "block": "one per block",
    "stack": "one shared by all blocks of the stack (the authors' code)",
}

# The size of each alpha of `ema` coefficients (who owns it: `COEFFICIENT_SCOPES`).
EmaAlphaSizeName = Literal["scalar", "dimension"]
EMA_ALPHA_SIZES: dict[EmaAlphaSizeName, str] = {
    "scalar": "one alpha (the released PCformer's default)",
    "dimension": "one alpha per hidden dimension (the released PCformer's `alpha_type='vector'`)",
}

# What the gate of the gated modes reads (Eq. (learnable) reads the raw stages). Beyond the paper: in the trained
# models here the paper's gate saturates (g near 0 or 1 on most tokens: docs/model.md); its logit [F1, F2] W + b grows with the
# stages' norms, which nothing bounds (with the code's F a stage carries the whole residual stream). The
# layer-normalised reading is the authors' `rk_norm` (libeineu/shortformer), applied to the gate's input only.
GateInputName = Literal["stages", "layer_norm"]
GATE_INPUTS: dict[GateInputName, str] = {
    "stages": "the gate reads the raw stages, g = sigmoid([F1, F2] W + b) (Eq. (learnable))",
    "layer_norm": (
        "the gate reads layer-normalised stages, g = sigmoid([LN(F1), LN(F2)] W + b) with LN without gain or "
        "bias (the authors' `rk_norm`, beyond the paper); the update y + g F1 + (1 - g) F2 keeps the raw stages"
    ),
}


# How a gate starts. Beyond the paper: its W meets stage norms that grow large in our trained models, so a
# xavier-initialised gate saturates early in training (results/README.md); "tableau" starts every
# gated block as its method's fixed tableau (RK2: g = 1/2), from which the gate learns. "euler" starts it as close to
# the residual block y + F1 as a gate can be (a finite logit never gives a weight of exactly 1 or 0): for a residual
# model converted to RK blocks (`ODETransformerForConditionalGeneration.from_residual`).
GateInitName = Literal["xavier", "tableau", "euler"]
GATE_INITS: dict[GateInitName, str] = {
    "xavier": "W xavier-uniform and b = 0, like every linear layer (fairseq, the authors' code)",
    "tableau": (
        "W = 0 and b chosen so that the gate gives the method's tableau weights gamma_i = b_i on every token "
        "(RK2: g = 1/2), so each gated block starts as its fixed-coefficient block (beyond the paper)"
    ),
    "euler": (
        "W = 0 and b chosen so that the gate gives gamma = (1 - eps, eps / (s - 1), ...) on every token, "
        "eps = EULER_GATE_EPSILON: each gated block starts within eps of the residual block y + F1 (RK2: "
        "b = log((1 - eps) / eps); beyond the paper)"
    ),
}
# How far from (1, 0, ..., 0) an "euler" gate starts. A sigmoid/softmax gate reaches 1 only at an infinite logit, and
# its gradient is g (1 - g) ~ eps: 1e-4 (RK2 bias log(9999) = 9.21) keeps the gradient above Adam's eps of 1e-8 for
# loss gradients down to ~1e-4, while the start is within ~1e-4 relative of the residual model's logits
# (docs/model.md#upcycling-a-residual-model gives the measured differences).
EULER_GATE_EPSILON = 1e-4

# How learnable scalar coefficients (`learnable`) start. The paper's are 1 ("learnable gamma_i = 1"); "euler" is
# Euler's weights (1, 0, ..., 0), so every block starts as the residual block y + F1, exactly (0 * F_i adds nothing):
# a residual model converted to RK blocks computes its own function until training moves gamma.
CoefficientInitName = Literal["ones", "tableau", "euler"]
COEFFICIENT_INITS: dict[CoefficientInitName, str] = {
    "ones": 'gamma_i = 1 ("learnable gamma_i = 1", the paper)',
    "tableau": "gamma = b, the method's own weights (RK2: 1/2, 1/2), which training then moves",
    "euler": (
        "gamma = (1, 0, ..., 0), Euler's weights: each block starts as the residual block y + F1, exactly "
        "(beyond the paper)"
    ),
}


def euler_weights(num_stages: int) -> tuple[float, ...]:
    """Euler's weights on an s-stage method: the one-stage Euler tableau's b on the first stage, 0 on the rest."""
    euler = ODE_METHODS["euler"].b
    return euler + (0.0,) * (num_stages - len(euler))


def start_weights(init: str, tableau: ButcherTableau) -> tuple[float, ...]:
    """The gamma that `learnable` coefficients start from (`COEFFICIENT_INITS`)."""
    starts = {
        "ones": (1.0,) * tableau.num_stages,
        "tableau": tableau.b,
        "euler": euler_weights(tableau.num_stages),
    }
    return starts[init]


def gate_start_logits(mode: str, init: str, tableau: ButcherTableau) -> list[float]:
    """The bias (with W = 0) of a gate that starts as `init` (`GATE_INITS`, not xavier): the tableau's b, or
    Euler's weights moved eps into the gate's range, (1 - eps, eps / (s - 1), ...)."""
    if init == "tableau":
        return tableau_gate_logits(mode, tableau.b)
    rest = tableau.num_stages - 1
    return tableau_gate_logits(mode, (1.0 - EULER_GATE_EPSILON, *(EULER_GATE_EPSILON / rest,) * rest))


def tableau_gate_logits(mode: str, weights: Sequence[float]) -> list[float]:
    """The gate logits (its bias, with W = 0) whose gamma is ``weights``: the inverse of the gate's output
    function. ``gated``: softmax over [z_1..z_{s-1}, 0], so z_i = log(b_i / b_s); ``gated_independent``:
    sigmoid, z_i = log(b_i / (1 - b_i)); ``gated_tanh``: z_i = atanh(b_i)."""
    bounds = {"gated": (0.0, math.inf), "gated_independent": (0.0, 1.0), "gated_tanh": (-1.0, 1.0)}[mode]
    if not all(bounds[0] < b < bounds[1] for b in weights):
        raise ValueError(
            f"no {mode} gate outputs the weights {list(weights)}: each must lie in the open interval {bounds}; "
            "use `ode_gate_init='xavier'` with this method"
        )
    if mode == "gated":
        return [math.log(b / weights[-1]) for b in weights[:-1]]
    if mode == "gated_independent":
        return [math.log(b / (1.0 - b)) for b in weights]
    return [math.atanh(b) for b in weights]


def resolve_tableau(method: str | dict | ButcherTableau, field: str = "ode_method") -> ButcherTableau:
    """A named method, a user tableau as a dict, or a ButcherTableau -> a checked ButcherTableau."""
    if isinstance(method, ButcherTableau):
        method.check(field)
        return method
    if isinstance(method, dict):
        return ButcherTableau.from_dict(method, field)
    if method not in ODE_METHODS:
        raise ValueError(
            f"`{field}`={method!r} is not a known ODE method; use one of {sorted(ODE_METHODS)} or a user "
            "tableau {'a': [[], [1.0]], 'b': [0.5, 0.5], 'c': [0.0, 1.0]}."
        )
    return ODE_METHODS[method]


class ODEStageRecorder(nn.Module):
    """Where an ODE block's stages and coefficients can be recorded: the identity on (stages stacked to
    (s, ...), gamma as a tensor). transformers' `capture_outputs` hooks it for `output_ode_stages=True` (the
    `_can_record_outputs` of the stacks), as it hooks attention modules for `output_attentions=True`; any
    forward hook works. Stacking the stages costs a copy, so nothing is computed while nothing is hooked."""

    def record(self, stages: Sequence[torch.Tensor], gamma: Callable[[], torch.Tensor]) -> None:
        if self._forward_hooks:
            self(torch.stack(list(stages)), gamma())

    def forward(self, stages: torch.Tensor, gamma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return stages, gamma


class StageCoefficients(nn.Module):
    """The coefficients gamma_i of an ODE block and the update they make, y + sum_i gamma_i F_i (Eq. (rk-yt1)).

    Constant gamma (`tableau`, `ones`) stays a tuple of Python floats, so each term is one fused add and zero
    weights are skipped; learned gamma (`learnable`, `ema`, the gates) is a tensor: (s,), (s, d) for `ema` with one
    alpha per dimension (`alpha_size="dimension"`), or (s, ..., 1) for a gate. The
    (`gated`) generalises Eq. (learnable) to s stages as a softmax over s logits of which the last is fixed to
    0: gamma = softmax([F_1..F_s] W + b, 0). With s = 2 this is exactly sigmoid / 1 - sigmoid with W of shape
    (2d, 1), i.e. 2d + 1 parameters per gate. With `gate_inputs="layer_norm"` (`GATE_INPUTS`) a gate reads each
    stage layer-normalised (eps `layer_norm_eps`), the update still the raw stages.
    """

    def __init__(
        self,
        mode: str,
        tableau: ButcherTableau,
        hidden_size: int,
        alpha_size: str = "scalar",
        gate_inputs: str = "stages",
        layer_norm_eps: float = 1e-5,
    ):
        super().__init__()
        self.mode = mode
        self.gate_inputs = gate_inputs
        self.layer_norm_eps = layer_norm_eps
        self.tableau = tableau
        num_stages = tableau.num_stages
        self.constant: tuple[float, ...] | None = {"tableau": tableau.b, "ones": (1.0,) * num_stages}.get(
            mode
        )
        if mode == "learnable":
            self.weight = nn.Parameter(torch.ones(num_stages))
        elif mode == "ema":
            self.alpha = nn.Parameter(torch.full((hidden_size,) if alpha_size == "dimension" else (), 0.5))
        elif mode in GATED_MODES:
            num_logits = num_stages - 1 if mode == "gated" else num_stages
            self.gate = StageGate(num_stages * hidden_size, num_logits, mode, tableau)
        self.recorder = ODEStageRecorder()

    def forward(self, y: torch.Tensor, stages: Sequence[torch.Tensor]) -> torch.Tensor:
        """y + sum_i gamma_i F_i; (stages, gamma) go to the recorder."""
        if self.constant is not None:
            out = y
            for gamma_i, stage in zip(self.constant, stages):
                if gamma_i != 0.0:  # e.g. the midpoint method's b = (0, 1)
                    out = out.add(stage, alpha=gamma_i)
            self.recorder.record(stages, lambda: y.new_tensor(self.constant))
            return out
        gamma = self.learned_gamma(stages)
        out = y
        for gamma_i, stage in zip(gamma, stages):
            out = torch.addcmul(out, gamma_i, stage)
        self.recorder.record(stages, lambda: gamma)
        return out

    def learned_gamma(self, stages: Sequence[torch.Tensor]) -> torch.Tensor:
        """gamma of the learned modes: the learnable weights (s,), the EMA weights (s,) or (s, d), or a gate's
        output (s, ..., 1)."""
        if self.mode == "learnable":
            return self.weight
        if self.mode == "ema":
            return self.ema_gamma()
        logits = self.gate(torch.cat(self.gate_input(stages), dim=-1))
        if self.mode == "gated":
            gamma = torch.softmax(torch.cat([logits, torch.zeros_like(logits[..., :1])], dim=-1), dim=-1)
        elif self.mode == "gated_independent":
            gamma = torch.sigmoid(logits)
        else:
            gamma = torch.tanh(logits)
        return gamma.movedim(gamma.dim() - 1, 0).unsqueeze(-1)

    def gate_input(self, stages: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """What a gate reads: the stages, or each normalised to zero mean and unit variance over the hidden size.
        The LayerNorm has no gain or bias: before the linear gate they would add nothing it cannot express
        (gain_i * LN(F_i) W_i = LN(F_i) (diag(gain_i) W_i); a bias adds a constant to b), so the gate keeps the 2d + 1
        parameters of Eq. (learnable) and the remedy changes the logits' scale only, not the model's capacity."""
        if self.gate_inputs == "stages":
            return list(stages)
        return [
            nn.functional.layer_norm(stage, stage.shape[-1:], eps=self.layer_norm_eps) for stage in stages
        ]

    def ema_gamma(self) -> torch.Tensor:
        """gamma_i = alpha (1 - alpha)^(s - i), i = 1..s: the last stage weighs alpha, each earlier one (1 - alpha)
        times the next (RK4: a(1-a)^3, a(1-a)^2, a(1-a), a); (s,) for a scalar alpha, (s, d) for one per dimension."""
        alpha = self.alpha
        exponents = torch.arange(self.tableau.num_stages - 1, -1, -1, device=alpha.device, dtype=alpha.dtype)
        return alpha * (1 - alpha) ** exponents.view(-1, *([1] * alpha.dim()))


class StageGate(nn.Linear):
    """The linear layer of a gate, [F1..Fs] -> logits; it knows the logits of its starts other than xavier
    (``ode_gate_init``, `GATE_INITS`)."""

    def __init__(self, in_features: int, num_logits: int, mode: str, tableau: ButcherTableau):
        super().__init__(in_features, num_logits)
        self.mode = mode
        self.tableau = tableau

    def start_logits(self, init: str) -> list[float]:
        return gate_start_logits(self.mode, init, self.tableau)


def ode_step(
    y: torch.Tensor,
    function: Callable[[torch.Tensor, int], torch.Tensor],
    tableau: ButcherTableau,
    coefficients: StageCoefficients,
    step_size: float = 1.0,
) -> torch.Tensor:
    """One ODE block: y + sum_i gamma_i F_i with F_i = h * F(w_i y + sum_j a_ij F_j), Eq. (rk-yt1)-(rk-fi).

    Args:
        y: the block input y_t.
        function: F(x, stage_index); the stage index lets F keep a separate KV cache per stage.
        tableau: the method.
        coefficients: the module combining the stage results (and recording them, see ODEStageRecorder).
        step_size: h.
    """
    stages: list[torch.Tensor] = []
    for i, (row, y_weight) in enumerate(zip(tableau.a, tableau.stage_y_weights)):
        x = y if y_weight == 1.0 else y * y_weight
        for a_ij, stage in zip(row, stages):
            if a_ij != 0.0:
                x = x.add(stage, alpha=a_ij)
        value = function(x, i)
        stages.append(value if step_size == 1.0 else step_size * value)
    return coefficients(y, stages)
