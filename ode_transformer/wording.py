"""Words shared by the training summary, the training log and the model card."""

from __future__ import annotations


def counted(number: int, noun: str) -> str:
    """``1 layer``, ``3 layers``: a count with its noun in the right number."""
    return f"{number} {noun}" + ("" if number == 1 else "s")


# What this project's runs show about the recipes' default block, said where a user meets the block: in ode-train's
# log when a run builds it, and on the model card.
GATED_RK2_FINDING = (
    "it is the paper's choice and every recipe's default; this project's tests of it against the residual block so "
    "far point both ways, and the batch sized to settle it (tier (b) of the verdict plan) has not run. In every "
    "gate diagnostic of the project's runs so far the gate was saturated "
    "on all tokens of every block (g near 0 or 1), so each block acted as a residual step that still computes F2, "
    "or as y + F(y + F(y)). The figures, each with its p-value and interval, are in the project's verdict.md, which "
    "the ode-transformer package ships."
)


def gated_rk2_sides(config) -> list[str]:
    """The sides ("encoder", "decoder") of `config` whose blocks are the paper's gated RK2, y + g F1 + (1 - g) F2 with
    the gate reading both stages (Eq. learnable)."""
    sides = ("encoder", "decoder") if config.is_encoder_decoder else ("decoder",)
    return [
        side
        for side in sides
        if (
            getattr(config, f"{side}_ode_method"),
            getattr(config, f"{side}_ode_coefficients"),
            config.ode_gate_inputs,
        )
        == ("rk2", "gated", "stages")
    ]
