"""The numerics of the ODE Transformer, in one place.

An ODE block (Li et al., ACL 2022, Section 3) integrates dy/dt = F(y) over one step with an explicit
Runge-Kutta method. Eq. (rk-yt1)-(rk-fi) of the paper:

    F_i     = h * F(w_i * y_t + sum_{j<i} a_ij F_j)        (w_i = 1 for every Runge-Kutta method)
    y_{t+1} = y_t + sum_i gamma_i F_i

A method is *data*: a :class:`ButcherTableau` (a, b, c, plus the stage weights w of y, which lets PolyNet's
y + F(y) + F(F(y)) be written in the same form). How the stage results are combined (gamma) is a separate,
swappable :class:`StageCoefficients` module: the tableau's own b weights, ones, learnable scalars, or a
gate computed from the stages (the paper's best, Eq. (learnable)). :func:`ode_step` applies both to any
function F, and is used by the encoder, the decoder and the causal LM alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "ButcherTableau",
    "ODE_METHODS",
    "COEFFICIENT_MODES",
    "GATED_MODES",
    "StageCoefficients",
    "ode_step",
    "resolve_tableau",
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
    """

    a: tuple[tuple[float, ...], ...]
    b: tuple[float, ...]
    c: tuple[float, ...]
    y_weights: tuple[float, ...] | None = None
    order: int | None = None

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


ODE_METHODS: dict[str, ButcherTableau] = {
    # The residual block: y + F(y).
    "euler": ButcherTableau(a=((),), b=(1.0,), c=(0.0,), order=1),
    # Improved Euler / Heun, Eq. (rk2): y + (F(y) + F(y + F(y))) / 2.
    "rk2": ButcherTableau(a=((), (1.0,)), b=(0.5, 0.5), c=(0.0, 1.0), order=2),
    "midpoint": ButcherTableau(a=((), (0.5,)), b=(0.0, 1.0), c=(0.0, 0.5), order=2),
    "ralston": ButcherTableau(a=((), (2 / 3,)), b=(0.25, 0.75), c=(0.0, 2 / 3), order=2),
    # Kutta's third-order method.
    "rk3": ButcherTableau(a=((), (0.5,), (-1.0, 2.0)), b=(1 / 6, 2 / 3, 1 / 6), c=(0.0, 0.5, 1.0), order=3),
    # The classical RK4, Eq. (rk4).
    "rk4": ButcherTableau(
        a=((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)),
        b=(1 / 6, 1 / 3, 1 / 3, 1 / 6),
        c=(0.0, 0.5, 0.5, 1.0),
        order=4,
    ),
    "rk4_38": ButcherTableau(
        a=((), (1 / 3,), (-1 / 3, 1.0), (1.0, -1.0, 1.0)),
        b=(1 / 8, 3 / 8, 3 / 8, 1 / 8),
        c=(0.0, 1 / 3, 2 / 3, 1.0),
        order=4,
    ),
    # Table "scale_function", row "weight sharing": the same layer applied twice in sequence,
    # y1 = y + F(y), y2 = y1 + F(y1) = y + F1 + F(y + F1).
    "weight_sharing": ButcherTableau(a=((), (1.0,)), b=(1.0, 1.0), c=(0.0, 1.0)),
    # Table "comparison", PolyNet: y + F(y) + F(F(y)); the second stage sees F1 alone, not y + F1.
    "polynet": ButcherTableau(a=((), (1.0,)), b=(1.0, 1.0), c=(0.0, 1.0), y_weights=(1.0, 0.0)),
}

# How stage results are combined (Table "scale_function"):
#   tableau           gamma = b (RK2: 1/2, 1/2; RK4: 1/6, 2/6, 2/6, 1/6)
#   ones              gamma_i = 1                                       ("RK2-block (gamma_i = 1)")
#   learnable         one scalar per stage, initialised to 1            ("learnable gamma_i = 1: scalar")
#   gated             g = sigmoid([F1, F2] W + b); gamma = (g, 1 - g)    (Eq. (learnable), the paper's best)
#   gated_independent gamma_i = sigmoid([F1..Fs] W_i + b_i)             ("sigmoid, sigmoid")
#   gated_tanh        gamma_i = tanh([F1..Fs] W_i + b_i)                ("tanh, tanh")
COEFFICIENT_MODES = ("tableau", "ones", "learnable", "gated", "gated_independent", "gated_tanh")
GATED_MODES = ("gated", "gated_independent", "gated_tanh")


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


class StageCoefficients(nn.Module):
    """Computes the coefficients gamma_i that combine the stage results F_i of an ODE block.

    The gate (`gated`) generalises Eq. (learnable) to s stages as a softmax over s logits of which the last
    is fixed to 0: gamma = softmax([F_1..F_s] W + b, 0). With s = 2 this is exactly sigmoid / 1 - sigmoid
    with W of shape (2d, 1), i.e. 2d + 1 parameters per gate.
    """

    def __init__(self, mode: str, tableau: ButcherTableau, hidden_size: int):
        super().__init__()
        self.mode = mode
        self.tableau = tableau
        num_stages = tableau.num_stages
        # Constant gamma stays a tuple of Python floats: ode_step then fuses each term into one add.
        self.constant = {"tableau": tableau.b, "ones": (1.0,) * num_stages}.get(mode)
        if mode == "learnable":
            self.weight = nn.Parameter(torch.ones(num_stages))
        elif mode in GATED_MODES:
            num_logits = num_stages - 1 if mode == "gated" else num_stages
            self.gate = nn.Linear(num_stages * hidden_size, num_logits)

    def forward(self, stages: Sequence[torch.Tensor]) -> tuple[float, ...] | torch.Tensor:
        """gamma: the constant floats, the learnable weights (s,), or a gate's output (s, ..., 1)."""
        if self.constant is not None:
            return self.constant
        if self.mode == "learnable":
            return self.weight
        logits = self.gate(torch.cat(list(stages), dim=-1))
        if self.mode == "gated":
            gamma = torch.softmax(torch.cat([logits, torch.zeros_like(logits[..., :1])], dim=-1), dim=-1)
        elif self.mode == "gated_independent":
            gamma = torch.sigmoid(logits)
        else:
            gamma = torch.tanh(logits)
        return gamma.movedim(-1, 0).unsqueeze(-1)


def ode_step(
    y: torch.Tensor,
    function: Callable[[torch.Tensor, int], torch.Tensor],
    tableau: ButcherTableau,
    coefficients: StageCoefficients,
    step_size: float = 1.0,
    trace: list | None = None,
) -> torch.Tensor:
    """One ODE block: y + sum_i gamma_i F_i with F_i = h * F(w_i y + sum_j a_ij F_j), Eq. (rk-yt1)-(rk-fi).

    Args:
        y: the block input y_t.
        function: F(x, stage_index); the stage index lets F keep a separate KV cache per stage.
        tableau: the method.
        coefficients: the module producing gamma from the stage results.
        step_size: h.
        trace: if a list is given, (stages stacked to (s, ...), gamma) is appended to it for analysis.
    """
    stages: list[torch.Tensor] = []
    for i, (row, y_weight) in enumerate(zip(tableau.a, tableau.stage_y_weights)):
        x = y if y_weight == 1.0 else y * y_weight
        for a_ij, stage in zip(row, stages):
            if a_ij != 0.0:
                x = x.add(stage, alpha=a_ij)
        value = function(x, i)
        stages.append(value if step_size == 1.0 else step_size * value)
    gamma = coefficients(stages)
    if trace is not None:
        trace.append((torch.stack(stages), gamma if torch.is_tensor(gamma) else y.new_tensor(gamma)))
    out = y
    for gamma_i, stage in zip(gamma, stages):
        if torch.is_tensor(gamma_i):
            out = torch.addcmul(out, gamma_i, stage)
        elif gamma_i != 0.0:  # e.g. the midpoint method's b = (0, 1)
            out = out.add(stage, alpha=gamma_i)
    return out
