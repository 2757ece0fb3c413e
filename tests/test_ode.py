"""The ODE numerics against independent, hand-written formulas (paper Section 3 and Table "comparison")."""

import math

import pytest
import torch
from tableau_order import linear_order, measured_slope, order_from_conditions, rooted_trees

from modeling_ode import ODETransformerConfig
from modeling_ode.modeling_ode_transformer import LayerConnections, ODETransformerLayer
from modeling_ode.ode import ODE_METHODS, ButcherTableau, StageCoefficients, ode_step, resolve_tableau

D = 6


@pytest.fixture(autouse=True)
def float64():
    """Exact comparisons: run every test of this file in float64, then restore the default."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture
def nonlinear_f(device):
    """A fixed nonlinear F(y) = tanh(y W + c), and a counter of how often it is called."""
    g = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(D, D, generator=g) / D**0.5, torch.randn(D, generator=g)
    weight, bias = weight.to(device), bias.to(device)
    calls = []

    def f(x, stage=None):
        calls.append(stage)
        return torch.tanh(x @ weight + bias)

    return f, calls


def y0(device):
    return torch.randn(3, 4, D, generator=torch.Generator().manual_seed(1)).to(device)


# Each method written out by hand from its textbook definition, with h the step size.
def by_hand(method, f, y, h):
    if method == "euler":
        return y + h * f(y)
    if method == "rk2":  # Eq. (rk2)
        f1 = h * f(y)
        f2 = h * f(y + f1)
        return y + (f1 + f2) / 2
    if method == "midpoint":
        k1 = f(y)
        return y + h * f(y + h / 2 * k1)
    if method == "ralston":
        k1 = f(y)
        k2 = f(y + 2 * h / 3 * k1)
        return y + h * (k1 / 4 + 3 * k2 / 4)
    if method == "rk3":
        k1 = f(y)
        k2 = f(y + h / 2 * k1)
        k3 = f(y - h * k1 + 2 * h * k2)
        return y + h / 6 * (k1 + 4 * k2 + k3)
    if method == "rk4":  # Eq. (rk4)
        f1 = h * f(y)
        f2 = h * f(y + f1 / 2)
        f3 = h * f(y + f2 / 2)
        f4 = h * f(y + f3)
        return y + (f1 + 2 * f2 + 2 * f3 + f4) / 6
    if method == "rk4_38":
        k1 = f(y)
        k2 = f(y + h * k1 / 3)
        k3 = f(y + h * (-k1 / 3 + k2))
        k4 = f(y + h * (k1 - k2 + k3))
        return y + h * (k1 + 3 * k2 + 3 * k3 + k4) / 8
    if method == "weight_sharing":  # the same layer twice in sequence
        y1 = y + h * f(y)
        return y1 + h * f(y1)
    if method == "polynet":  # Table "comparison": y + F(y) + F(F(y))
        f1 = h * f(y)
        return y + f1 + h * f(f1)
    raise AssertionError(method)


@pytest.mark.parametrize("method", sorted(ODE_METHODS))
@pytest.mark.parametrize("h", [1.0, 0.3])
def test_tableau_block_equals_formula_by_hand(method, h, nonlinear_f, device):
    f, calls = nonlinear_f
    tableau = ODE_METHODS[method]
    coefficients = StageCoefficients("tableau", tableau, D).to(device)
    y = y0(device)
    out = ode_step(y, lambda x, i: f(x, i), tableau, coefficients, step_size=h)
    torch.testing.assert_close(out, by_hand(method, f, y, h), rtol=1e-12, atol=1e-12)
    assert calls[: tableau.num_stages] == list(range(tableau.num_stages))  # one call per stage, in order


def rk2_stages(f, y):
    f1 = f(y)
    return f1, f(y + f1)


def test_ones_coefficients(nonlinear_f, device):
    """Table "scale_function", gamma_i = 1: y + F1 + F(y + F1)."""
    f, _ = nonlinear_f
    y = y0(device)
    f1, f2 = rk2_stages(f, y)
    coefficients = StageCoefficients("ones", ODE_METHODS["rk2"], D).to(device)
    out = ode_step(y, lambda x, i: f(x), ODE_METHODS["rk2"], coefficients)
    torch.testing.assert_close(out, y + f1 + f2)


def test_learnable_coefficients_start_at_one_and_scale_stages(nonlinear_f, device):
    f, _ = nonlinear_f
    y = y0(device)
    coefficients = StageCoefficients("learnable", ODE_METHODS["rk2"], D).to(device)
    assert coefficients.weight.tolist() == [1.0, 1.0]
    with torch.no_grad():
        coefficients.weight.copy_(torch.tensor([0.3, -1.7]))
    f1, f2 = rk2_stages(f, y)
    out = ode_step(y, lambda x, i: f(x), ODE_METHODS["rk2"], coefficients)
    torch.testing.assert_close(out, y + 0.3 * f1 - 1.7 * f2)


def random_gate(coefficients):
    """Standard normal gate weights and bias, drawn on the CPU (seeds 3 and 4) whatever the gate's device."""
    with torch.no_grad():
        for parameter, seed in ((coefficients.gate.weight, 3), (coefficients.gate.bias, 4)):
            cpu = torch.empty(parameter.shape, dtype=parameter.dtype)
            parameter.copy_(cpu.normal_(generator=torch.Generator().manual_seed(seed)))
    return coefficients.gate.weight, coefficients.gate.bias


def test_gated_rk2_is_eq_learnable(nonlinear_f, device):
    """Eq. (learnable): g = sigmoid([F1, F2] W + b), y + g F1 + (1 - g) F2, one scalar per token."""
    f, _ = nonlinear_f
    y = y0(device)
    coefficients = StageCoefficients("gated", ODE_METHODS["rk2"], D).to(device)
    assert sum(p.numel() for p in coefficients.parameters()) == 2 * D + 1
    w, b = random_gate(coefficients)
    f1, f2 = rk2_stages(f, y)
    g = torch.sigmoid(torch.cat([f1, f2], -1) @ w[0] + b[0])[..., None]
    out = ode_step(y, lambda x, i: f(x), ODE_METHODS["rk2"], coefficients)
    torch.testing.assert_close(out, y + g * f1 + (1 - g) * f2)


@pytest.mark.parametrize("mode,squash", [("gated_independent", torch.sigmoid), ("gated_tanh", torch.tanh)])
def test_independent_gates(mode, squash, nonlinear_f, device):
    """Table "scale_function" rows (sigmoid, sigmoid) and (tanh, tanh)."""
    f, _ = nonlinear_f
    y = y0(device)
    coefficients = StageCoefficients(mode, ODE_METHODS["rk2"], D).to(device)
    w, b = random_gate(coefficients)
    f1, f2 = rk2_stages(f, y)
    z = torch.cat([f1, f2], -1)
    g1, g2 = squash(z @ w[0] + b[0])[..., None], squash(z @ w[1] + b[1])[..., None]
    out = ode_step(y, lambda x, i: f(x), ODE_METHODS["rk2"], coefficients)
    torch.testing.assert_close(out, y + g1 * f1 + g2 * f2)


def test_gate_generalises_to_rk4_as_softmax_with_a_reference_logit(nonlinear_f, device):
    f, _ = nonlinear_f
    y = y0(device)
    tableau = ODE_METHODS["rk4"]
    coefficients = StageCoefficients("gated", tableau, D).to(device)
    w, b = random_gate(coefficients)
    recorded = []
    coefficients.recorder.register_forward_hook(lambda module, args, output: recorded.append(output))
    out = ode_step(y, lambda x, i: f(x), tableau, coefficients)
    stages, gamma = recorded[0]
    logits = torch.cat([stages[0], stages[1], stages[2], stages[3]], -1) @ w.T + b
    weights = torch.softmax(torch.cat([logits, torch.zeros_like(logits[..., :1])], -1), -1)
    expected = y + sum(weights[..., i : i + 1] * stages[i] for i in range(4))
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(gamma.sum(0), torch.ones_like(gamma[0]))


@pytest.mark.parametrize("method", list(ODE_METHODS))
def test_the_declared_order_is_the_one_the_order_conditions_give(method):
    """Every catalogue entry's `order` is what Butcher's conditions give its tableau; a block that is not even
    consistent (weight sharing adds F twice) or no Runge-Kutta method (PolyNet) declares none."""
    tableau = ODE_METHODS[method]
    assert tableau.order == (order_from_conditions(tableau) or None)


@pytest.mark.parametrize("method", list(ODE_METHODS))
@pytest.mark.parametrize("problem", ["linear", "nonlinear"])
def test_local_error_falls_with_the_methods_order(method, problem, device):
    """One step's error is O(h^(p+1)): the measured log-log slope is p + 1, p the order the tableau's conditions
    give (on dy/dt = A y, those of a linear F; a block with no order errs by O(h))."""
    tableau = ODE_METHODS[method]
    order = linear_order(tableau) if problem == "linear" else order_from_conditions(tableau) or 0
    assert measured_slope(tableau, problem, device) == pytest.approx(order + 1, abs=0.15)


def test_the_order_conditions_tell_each_order_apart():
    """The conditions' count of trees, and tableaux that fail them where they should: Euler's b scaled (not
    consistent), RK3's last stage moved (order 2), RK4 with one a_ij changed (order 3 or less)."""
    assert [len(rooted_trees(n)) for n in range(1, 7)] == [1, 1, 2, 4, 9, 20]
    scaled = ButcherTableau(a=((),), b=(2.0,), c=(0.0,))
    rk3 = ODE_METHODS["rk3"]
    moved = ButcherTableau(a=(rk3.a[0], rk3.a[1], (0.0, 1.0)), b=rk3.b, c=rk3.c)
    rk4 = ODE_METHODS["rk4"]
    changed = ButcherTableau(a=(*rk4.a[:3], (0.0, 0.5, 0.5)), b=rk4.b, c=rk4.c)
    assert [order_from_conditions(t) for t in (scaled, moved, changed)] == [0, 2, 3]


def test_user_tableau_and_invalid_tableaus():
    heun = resolve_tableau({"a": [[], [1.0]], "b": [0.5, 0.5]})
    rk2 = ODE_METHODS["rk2"]
    assert (heun.a, heun.b, heun.c) == (rk2.a, rk2.b, rk2.c)  # c derived from the rows of a
    with pytest.raises(ValueError, match="explicit"):
        ButcherTableau(a=((0.5,), (1.0,)), b=(0.5, 0.5), c=(0.5, 1.0)).check()
    with pytest.raises(ValueError, match="sum to c"):
        resolve_tableau({"a": [[], [0.5]], "b": [0.5, 0.5], "c": [0.0, 1.0]})
    with pytest.raises(ValueError, match="keys"):
        resolve_tableau({"alpha": [[]]})


# --- layer connections (Table "comparison") ---------------------------------------------------------------


def run_connections(kind, blocks, x, **setup):
    connections = LayerConnections(kind, len(blocks), D, eps=1e-5).to(x.device)
    for name, value in setup.items():
        with torch.no_grad():
            getattr(connections, name).copy_(value)
    history = [x]
    for index, block in enumerate(blocks):
        block_input = connections.layer_input(history, index)
        connections.push(history, index, block_input, block(block_input))
    return connections, connections.output(history)


def make_blocks(n, device):
    g = torch.Generator().manual_seed(7)
    weights = [(torch.randn(D, D, generator=g) / D**0.5).to(device) for _ in range(n)]
    return [lambda y, w=w: y + torch.tanh(y @ w) for w in weights], [
        lambda y, w=w: torch.tanh(y @ w) for w in weights
    ]


def test_leapfrog(device):
    blocks, fs = make_blocks(3, device)
    x = y0(device)
    _, out = run_connections("leapfrog", blocks, x)
    y1 = x + fs[0](x)  # Euler start
    y2 = x + 2 * fs[1](y1)
    y3 = y1 + 2 * fs[2](y2)
    torch.testing.assert_close(out, y3)


def test_multistep(device):
    blocks, fs = make_blocks(3, device)
    x = y0(device)
    k = torch.rand(3, D, generator=torch.Generator().manual_seed(8)).to(device) - 1
    _, out = run_connections("multistep", blocks, x, k=k)
    y1 = x + fs[0](x)
    y2 = k[1] * y1 + (1 - k[1]) * x + fs[1](y1)
    y3 = k[2] * y2 + (1 - k[2]) * y1 + fs[2](y2)
    torch.testing.assert_close(out, y3)


@pytest.mark.parametrize("kind", ["dense", "learnable_dense"])
def test_dense_layer_connections(kind, device):
    blocks, _ = make_blocks(3, device)
    x = y0(device)
    connections, out = run_connections(kind, blocks, x)
    weight = connections.weight
    means = torch.full((3,), 1 / 3, device=device)
    torch.testing.assert_close(weight[2, :3], means)  # rows start as plain means
    assert weight[1, 2] == 0  # lower triangular
    states = [x]
    for i, block in enumerate(blocks):
        block_input = sum(weight[i, j] * states[j] for j in range(i + 1))
        states.append(connections.layer_norms[i](block(block_input)))
    torch.testing.assert_close(out, sum(weight[3, j] * states[j] for j in range(4)))
    assert isinstance(connections.weight, torch.nn.Parameter) == (kind == "learnable_dense")


# --- F of a Transformer layer ------------------------------------------------------------------------------


def tiny_layer(**overrides):
    torch.manual_seed(0)
    config = ODETransformerConfig.from_preset(
        "tiny",
        d_model=8,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_relative_position=0,
        encoder_ode_coefficients="tableau",
        **overrides,
    )
    return ODETransformerLayer(config, "encoder", 0, has_cross_attention=False).eval()


def san(layer, x):
    return layer.self_attn(layer.self_attn_layer_norm(x))[0]


def ffn(layer, x):
    return layer.ffn(layer.final_layer_norm(x))


def apply_layer(layer, y):
    coefficients = [
        StageCoefficients("tableau", layer.tableau, 8).to(y.device) for _ in range(layer.num_ode_blocks)
    ]
    return layer(y, coefficients=coefficients)


def layer_input(device):
    return torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(9)).to(device)


def test_layer_function_is_san_plus_ffn(device):
    """F(y) = G(LN(y)) with G = SAN then FFN (the paper's default F, without the residual)."""
    layer = tiny_layer(encoder_ode_method="rk2", encoder_ode_function="layer").to(device)
    y = layer_input(device)

    def f(x):
        h = san(layer, x)
        return h + ffn(layer, x + h)

    f1 = f(y)
    f2 = f(y + f1)
    torch.testing.assert_close(apply_layer(layer, y), y + (f1 + f2) / 2)


def test_function_including_residual_is_the_authors_code(device):
    """ode_function_includes_residual: F = L(x), the whole pre-norm layer, residuals included."""
    layer = tiny_layer(encoder_ode_method="rk2", ode_function_includes_residual=True).to(device)
    y = layer_input(device)

    def big_l(x):
        h = x + san(layer, x)
        return h + ffn(layer, h)

    f1 = big_l(y)
    f2 = big_l(y + f1)
    torch.testing.assert_close(apply_layer(layer, y), y + (f1 + f2) / 2)


def test_euler_layer_is_the_plain_pre_norm_layer_in_both_readings(device):
    for includes_residual in (False, True):
        layer = tiny_layer(encoder_ode_method="euler", ode_function_includes_residual=includes_residual)
        layer = layer.to(device)
        y = layer_input(device)
        h = y + san(layer, y)
        torch.testing.assert_close(apply_layer(layer, y), h + ffn(layer, h))


@pytest.mark.parametrize("function", ["attention", "ffn", "sublayers"])
def test_components(function, device):
    """Figure "components": an ODE block over SAN only, FFN only, or each sublayer its own block."""
    layer = tiny_layer(encoder_ode_method="rk2", encoder_ode_function=function).to(device)
    y = layer_input(device)

    def rk2(g, x):
        f1 = g(layer, x)
        return x + (f1 + g(layer, x + f1)) / 2

    h = rk2(san, y) if function in ("attention", "sublayers") else y + san(layer, y)
    expected = rk2(ffn, h) if function in ("ffn", "sublayers") else h + ffn(layer, h)
    torch.testing.assert_close(apply_layer(layer, y), expected)


def test_sublayer_sharing_is_san_twice_then_ffn_twice(device):
    """The authors' code's weight sharing (the `ablations` study's row): each sublayer applied twice in sequence
    with the same weights, each application with its own residual."""
    layer = tiny_layer(encoder_ode_method="weight_sharing", encoder_ode_function="sublayers").to(device)
    y = layer_input(device)
    h = y + san(layer, y)
    h = h + san(layer, h)
    h = h + ffn(layer, h)
    torch.testing.assert_close(apply_layer(layer, y), h + ffn(layer, h))


@pytest.mark.parametrize("includes_residual", [False, True])
def test_gate_reading_layer_normalised_stages_is_its_formula(includes_residual, device):
    """`ode_gate_inputs="layer_norm"`: g = sigmoid([LN(F1), LN(F2)] W + b) with LN(x) = (x - mean) / sqrt(var + eps)
    (no gain, no bias; eps the config's), and the block y + g F1 + (1 - g) F2 with the raw stages. The encoder's
    first block and its own gate module, against the formula written out in float64, for both readings of F."""
    from modeling_ode import ODETransformerModel

    torch.manual_seed(0)
    config = ODETransformerConfig.from_preset(
        "tiny", d_model=8, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, max_relative_position=0,
        encoder_ode_method="rk2", encoder_ode_coefficients="gated", ode_gate_inputs="layer_norm",
        ode_function_includes_residual=includes_residual, layer_norm_eps=1e-3,
    )  # fmt: skip
    encoder = ODETransformerModel(config).encoder.eval().to(device)
    layer, coefficients = encoder.layers[0], encoder._layer_coefficients(0)
    w, b = random_gate(coefficients[0])
    assert sum(p.numel() for p in coefficients[0].parameters()) == 2 * 8 + 1  # the gate of Eq. (learnable)
    y = 5 * layer_input(device)  # stages of norm well above 1: the normalisation matters

    def f(x):
        h = san(layer, x)
        out = h + ffn(layer, x + h)
        return x + out if includes_residual else out

    def layer_norm(x):
        mean = x.sum(-1, keepdim=True) / x.shape[-1]
        variance = ((x - mean) ** 2).sum(-1, keepdim=True) / x.shape[-1]
        return (x - mean) / torch.sqrt(variance + 1e-3)

    f1 = f(y)
    f2 = f(y + f1)
    logit = torch.cat([layer_norm(f1), layer_norm(f2)], -1) @ w[0] + b[0]
    g = (1 / (1 + torch.exp(-logit)))[..., None]
    with torch.no_grad():
        out = layer(y, coefficients=coefficients)
    torch.testing.assert_close(out, y + g * f1 + (1 - g) * f2, rtol=0, atol=1e-12)


def test_a_gate_reading_layer_normalised_stages_ignores_their_scale(nonlinear_f, device):
    """The point of the remedy: the paper's logit [F1, F2] W + b grows with the stages' norms, the normalised
    reading's does not (scaling every stage by c > 0 leaves g unchanged, exactly so with eps = 0)."""
    f, _ = nonlinear_f
    stages = rk2_stages(f, y0(device))
    gates = {}
    for inputs in ("stages", "layer_norm"):
        coefficients = StageCoefficients(
            "gated", ODE_METHODS["rk2"], D, gate_inputs=inputs, layer_norm_eps=0.0
        ).to(device)
        random_gate(coefficients)
        gates[inputs] = [coefficients.learned_gamma([c * s for s in stages]) for c in (1.0, 30.0)]
    torch.testing.assert_close(*gates["layer_norm"])
    assert not torch.allclose(*gates["stages"])


# --- the catalogue ------------------------------------------------------------------------------------------


def test_catalogue_entries_say_what_they_are():
    """Every named method, coefficient mode, F and connection carries its words; every mode builds."""
    from modeling_ode.ode import COEFFICIENT_MODES, GATED_MODES, LAYER_CONNECTIONS, ODE_FUNCTIONS

    for name, tableau in ODE_METHODS.items():
        assert tableau.equation and tableau.description, name
        tableau.check(name)
    for name, mode in COEFFICIENT_MODES.items():
        assert mode.equation and mode.description, name
        coefficients = StageCoefficients(name, ODE_METHODS["rk2"], D)
        assert hasattr(coefficients, "gate") == (name in GATED_MODES) == mode.gated
    assert all(ODE_FUNCTIONS.values()) and all(LAYER_CONNECTIONS.values())


def test_each_catalogue_table_is_the_literal_type_of_the_config_fields_that_choose_from_it():
    """One list of names: each table's `Literal` type holds exactly its keys, in order, and the config validates
    every field of that type against it (`ode_method` fields also take a user tableau)."""
    from typing import get_args

    from modeling_ode import ode
    from modeling_ode.configuration_ode_transformer import _choice_fields

    tables = {
        ode.ODEMethodName: ode.ODE_METHODS,
        ode.CoefficientModeName: ode.COEFFICIENT_MODES,
        ode.ODEFunctionName: ode.ODE_FUNCTIONS,
        ode.LayerConnectionName: ode.LAYER_CONNECTIONS,
        ode.CoefficientScopeName: ode.COEFFICIENT_SCOPES,
        ode.EmaAlphaSizeName: ode.EMA_ALPHA_SIZES,
        ode.GateInputName: ode.GATE_INPUTS,
        ode.GateInitName: ode.GATE_INITS,
        ode.CoefficientInitName: ode.COEFFICIENT_INITS,
    }
    for literal, table in tables.items():
        assert get_args(literal) == tuple(table)
    choices = {field: allowed for field, (allowed, _) in _choice_fields().items()}
    for side in ("encoder", "decoder"):
        assert choices[f"{side}_ode_coefficients"] == tuple(ode.COEFFICIENT_MODES)
        assert choices[f"{side}_ode_function"] == tuple(ode.ODE_FUNCTIONS)
        assert choices[f"{side}_layer_connections"] == tuple(ode.LAYER_CONNECTIONS)
    assert choices["ode_coefficient_scope"] == tuple(ode.COEFFICIENT_SCOPES)
    assert choices["ode_ema_alpha"] == tuple(ode.EMA_ALPHA_SIZES)
    assert choices["ode_gate_inputs"] == tuple(ode.GATE_INPUTS)
    assert choices["ode_gate_init"] == tuple(ode.GATE_INITS)
    assert choices["ode_coefficients_init"] == tuple(ode.COEFFICIENT_INITS)


def test_a_hook_on_the_recorder_sees_the_stacked_stages_and_constant_gamma(nonlinear_f, device):
    """What `capture_outputs` records for `output_ode_stages=True`; any forward hook on the recorder sees it too."""
    f, _ = nonlinear_f
    coefficients = StageCoefficients("tableau", ODE_METHODS["rk4"], D).to(device)
    calls = []
    coefficients.recorder.register_forward_hook(lambda module, args, output: calls.append(output))
    y = y0(device)
    ode_step(y, lambda x, i: f(x), ODE_METHODS["rk4"], coefficients)
    ((stages, gamma),) = calls
    assert stages.shape == (4, *y.shape)
    torch.testing.assert_close(gamma, torch.tensor([1, 2, 2, 1], device=device) / 6)


@pytest.mark.parametrize("mode", ["gated", "gated_independent", "gated_tanh"])
@pytest.mark.parametrize("method", ["rk2", "rk4", "rk4_38"])
def test_tableau_gate_init_starts_as_the_fixed_tableau(mode, method, nonlinear_f, device):
    """``ode_gate_init='tableau'``: W = 0 and the bias of :func:`tableau_gate_logits` give gamma_i = b_i on every
    token, so the gated block is the method's formula by hand (float64), whatever the stages."""
    from modeling_ode.ode import tableau_gate_logits

    f, _ = nonlinear_f
    tableau = ODE_METHODS[method]
    coefficients = StageCoefficients(mode, tableau, D).to(device)
    with torch.no_grad():
        coefficients.gate.weight.zero_()
        coefficients.gate.bias.copy_(torch.tensor(tableau_gate_logits(mode, tableau.b)))
    y = y0(device)
    out = ode_step(y, lambda x, i: f(x, i), tableau, coefficients)
    torch.testing.assert_close(out, by_hand(method, f, y, 1.0), rtol=1e-12, atol=1e-12)


def test_tableau_gate_logits_by_hand():
    from modeling_ode.ode import tableau_gate_logits

    assert tableau_gate_logits("gated", (0.5, 0.5)) == [0.0]  # RK2: sigmoid(0) = 1/2
    rk4 = tableau_gate_logits("gated", (1 / 6, 1 / 3, 1 / 3, 1 / 6))  # softmax([z, 0]): z_i = log(b_i / b_4)
    assert rk4 == pytest.approx([0.0, math.log(2), math.log(2)], abs=1e-15)
    assert tableau_gate_logits("gated_independent", (0.5, 0.5)) == [0.0, 0.0]
    assert tableau_gate_logits("gated_tanh", (0.5,)) == pytest.approx([0.5 * math.log(3)])  # atanh(1/2)
    with pytest.raises(ValueError, match=r"no gated gate outputs the weights \[0.0, 1.0\]"):
        tableau_gate_logits("gated", (0.0, 1.0))  # the midpoint method: softmax never gives 0


@pytest.mark.parametrize("includes_residual", [False, True])
def test_a_model_with_tableau_gate_init_is_its_fixed_tableau_model(includes_residual):
    """A whole model built with ``ode_gate_init='tableau'`` gives the logits of the same weights without the gates
    (RK2 tableau coefficients), float64; the default (xavier) does not."""
    from modeling_ode import ODETransformerForConditionalGeneration

    fields = dict(
        encoder_ode_method="rk2", decoder_ode_method="rk2", decoder_ode_coefficients="gated",
        ode_function_includes_residual=includes_residual, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    gated = ODETransformerForConditionalGeneration(
        ODETransformerConfig.from_preset("tiny", ode_gate_init="tableau", **fields)
    ).double()
    fixed_config = ODETransformerConfig.from_preset(
        "tiny", **{**fields, "encoder_ode_coefficients": "tableau", "decoder_ode_coefficients": "tableau"}
    )
    fixed = ODETransformerForConditionalGeneration(fixed_config).double()
    missing, unexpected = fixed.eval().load_state_dict(gated.state_dict(), strict=False)
    assert not missing and unexpected and all(".gate." in key for key in unexpected)
    src, tgt = torch.randint(4, 99, (2, 7)), torch.randint(4, 99, (2, 5))
    with torch.no_grad():
        expected = fixed(input_ids=src, decoder_input_ids=tgt).logits
        actual = gated.eval()(input_ids=src, decoder_input_ids=tgt).logits
        torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
        # the same weights with xavier gates (the default) are another model
        xavier = ODETransformerForConditionalGeneration(ODETransformerConfig.from_preset("tiny", **fields))
        xavier.double().load_state_dict(fixed.state_dict(), strict=False)
        assert not torch.allclose(xavier.eval()(input_ids=src, decoder_input_ids=tgt).logits, expected)


def test_tableau_gate_init_needs_a_gate_and_a_tableau_a_gate_can_output():
    with pytest.raises(
        ValueError, match="`ode_gate_init`='tableau' sets how a gate starts, but no ODE block"
    ):
        ODETransformerConfig.from_preset("tiny", encoder_ode_coefficients="tableau", ode_gate_init="tableau")
    with pytest.raises(ValueError, match="no gated gate outputs the weights"):
        ODETransformerConfig.from_preset(
            "tiny", encoder_ode_method="midpoint", encoder_ode_coefficients="gated", ode_gate_init="tableau"
        )


def test_coefficient_and_gate_starts_by_hand():
    """`ode_coefficients_init` gives learnable gamma (1, ..., 1), b or Euler's (1, 0, ..., 0); `ode_gate_init='euler'`
    the gate bias of gamma = (1 - eps, eps / (s - 1), ...)."""
    from modeling_ode.ode import EULER_GATE_EPSILON as eps
    from modeling_ode.ode import gate_start_logits, start_weights

    rk4 = ODE_METHODS["rk4"]
    assert start_weights("ones", rk4) == (1.0, 1.0, 1.0, 1.0)
    assert start_weights("tableau", rk4) == rk4.b
    assert start_weights("euler", rk4) == (1.0, 0.0, 0.0, 0.0)
    assert gate_start_logits("gated", "euler", ODE_METHODS["rk2"]) == pytest.approx(
        [math.log((1 - eps) / eps)]
    )
    # softmax([z1, z2, z3, 0]): z_i = log(gamma_i / gamma_4)
    assert gate_start_logits("gated", "euler", rk4) == pytest.approx(
        [math.log(3 * (1 - eps) / eps), 0.0, 0.0]
    )
    logit = math.log((eps / 3) / (1 - eps / 3))
    assert gate_start_logits("gated_independent", "euler", rk4) == pytest.approx(
        [math.log((1 - eps) / eps), logit, logit, logit]
    )
    assert gate_start_logits("gated_tanh", "euler", ODE_METHODS["rk2"]) == pytest.approx(
        [math.atanh(1 - eps), math.atanh(eps)]
    )


def test_a_model_built_with_the_euler_starts_begins_as_those_weights():
    from modeling_ode import ODETransformerForConditionalGeneration
    from modeling_ode.ode import EULER_GATE_EPSILON

    config = ODETransformerConfig.from_preset(
        "tiny", encoder_ode_method="rk4", encoder_ode_coefficients="learnable", decoder_ode_method="rk2",
        decoder_ode_coefficients="gated", ode_coefficients_init="euler", ode_gate_init="euler",
    )  # fmt: skip
    model = ODETransformerForConditionalGeneration(config)
    for coefficients in model.model.encoder.ode_coefficients:
        assert coefficients.weight.tolist() == [1.0, 0.0, 0.0, 0.0]
    for coefficients in model.model.decoder.ode_coefficients:
        assert coefficients.gate.weight.abs().max() == 0
        assert torch.sigmoid(coefficients.gate.bias).item() == pytest.approx(1 - EULER_GATE_EPSILON)


def test_coefficient_starts_need_their_coefficients_and_the_papers_reading_of_f():
    with pytest.raises(
        ValueError, match="`ode_coefficients_init`='euler' sets how learnable coefficients start, but"
    ):
        # the tiny preset: a gated encoder and an Euler decoder, no learnable coefficients
        ODETransformerConfig.from_preset("tiny", ode_coefficients_init="euler")
    with pytest.raises(
        ValueError, match=r"y \+ F1 = 2y \+ G\(y\); use `ode_function_includes_residual=False`"
    ):
        ODETransformerConfig.from_preset("tiny", ode_gate_init="euler", ode_function_includes_residual=True)
    with pytest.raises(ValueError, match="`ode_coefficients_init`='euler' starts blocks as y \\+ F1"):
        ODETransformerConfig.from_preset(
            "tiny", encoder_ode_coefficients="learnable", ode_coefficients_init="euler",
            ode_function_includes_residual=True,
        )  # fmt: skip
