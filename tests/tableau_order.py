"""A Butcher tableau's order of accuracy, two ways: from its order conditions, and measured.

* :func:`order_from_conditions`: the largest p such that every rooted tree t with at most p nodes satisfies
  b . Phi(t) = 1 / gamma(t) (Butcher's conditions: Hairer, Norsett and Wanner, Solving ODEs I, Section II.2);
  None for a block whose stages do not all start from y (a weight of y other than 1, PolyNet's), which is no
  Runge-Kutta method and has no such conditions.
* :func:`linear_order`: the order on dy/dt = A y, where only b . a^(k-1) w = 1 / k! counts.
* :func:`measured_slope`: the log-log slope of one step's error against the exact solution, order + 1.
"""

from __future__ import annotations

import math
from functools import cache

import torch

from modeling_ode.ode import ButcherTableau, StageCoefficients, ode_step

MAX_ORDER = 6  # the conditions checked: a method of order 5 is told from one of order 6 or more
Tree = tuple  # a rooted tree: the sorted tuple of its root's subtrees; () is a single node


@cache
def rooted_trees(nodes: int) -> tuple[Tree, ...]:
    """Every rooted tree with `nodes` nodes, each once (1, 1, 2, 4, 9, 20, ... of them)."""
    if nodes == 1:
        return ((),)
    return tuple(sorted(set(_forests(nodes - 1, nodes - 1))))


def _forests(nodes: int, largest: int) -> list[Tree]:
    """The root's subtrees: sorted tuples of trees of `nodes` nodes in all, none above `largest` nodes."""
    if nodes == 0:
        return [()]
    out = []
    for size in range(min(nodes, largest), 0, -1):
        for tree in rooted_trees(size):
            for rest in _forests(nodes - size, size):
                out.append(tuple(sorted((tree, *rest))))
    return out


def _size(tree: Tree) -> int:
    return 1 + sum(_size(child) for child in tree)


def _density(tree: Tree) -> int:
    """gamma(t): the tree's size times its subtrees' densities."""
    return _size(tree) * math.prod(_density(child) for child in tree)


def _stage_weights(tableau: ButcherTableau, tree: Tree) -> list[float]:
    """Phi_i(t), one per stage: the product over the root's subtrees of sum_j a_ij Phi_j(subtree)."""
    out = [1.0] * tableau.num_stages
    for child in tree:
        inner = _stage_weights(tableau, child)
        for i, row in enumerate(tableau.a):
            out[i] *= sum(a_ij * inner[j] for j, a_ij in enumerate(row))
    return out


def order_from_conditions(tableau: ButcherTableau) -> int | None:
    """The order Butcher's conditions give (0: not even consistent, sum b != 1); None where some stage does not
    start from y (no Runge-Kutta method)."""
    if any(w != 1.0 for w in tableau.stage_y_weights):
        return None
    for order in range(1, MAX_ORDER + 1):
        for tree in rooted_trees(order):
            weight = sum(b * phi for b, phi in zip(tableau.b, _stage_weights(tableau, tree)))
            if not math.isclose(weight, 1 / _density(tree), abs_tol=1e-12):
                return order - 1
    return MAX_ORDER


def linear_order(tableau: ButcherTableau) -> int:
    """The order on a linear F(y) = A y: one step is y + sum_k (hA)^k y b . a^(k-1) w, exp(hA) y's k-th term has
    1 / k!."""
    weights = list(tableau.stage_y_weights)
    for order in range(1, MAX_ORDER + 1):
        if not math.isclose(
            sum(b * w for b, w in zip(tableau.b, weights)), 1 / math.factorial(order), abs_tol=1e-12
        ):
            return order - 1
        weights = [sum(a_ij * weights[j] for j, a_ij in enumerate(row)) for row in tableau.a]
    return MAX_ORDER


STEPS = [0.2 / 2**k for k in range(5)]
SIZE = 6


def _slope(errors: list[float]) -> float:
    return (math.log(errors[0]) - math.log(errors[-1])) / (math.log(STEPS[0]) - math.log(STEPS[-1]))


def measured_slope(tableau: ButcherTableau, problem: str, device: str | torch.device = "cpu") -> float:
    """The log-log slope of one step's error over the step sizes STEPS, in float64: order + 1.

    `problem`: ``"linear"``, dy/dt = A y against exp(hA) y; ``"nonlinear"``, dy/dt = 1 + y^2 (each entry) against
    tan(h + arctan y), whose F(0) = 1 is no zero (a block that adds F twice shows it).
    """
    g = torch.Generator().manual_seed(5)
    a = (torch.randn(SIZE, SIZE, generator=g, dtype=torch.float64) / SIZE**0.5).to(device)
    y = (torch.rand(SIZE, generator=g, dtype=torch.float64) - 0.5).to(device)
    coefficients = StageCoefficients("tableau", tableau, SIZE).to(device=device, dtype=torch.float64)
    errors = []
    for h in STEPS:
        if problem == "linear":
            out = ode_step(y, lambda x, i: x @ a.T, tableau, coefficients, step_size=h)
            exact = torch.linalg.matrix_exp(h * a) @ y
        else:
            out = ode_step(y, lambda x, i: 1 + x**2, tableau, coefficients, step_size=h)
            exact = torch.tan(h + torch.atan(y))
        errors.append((out - exact).norm().item())
    return _slope(errors)
