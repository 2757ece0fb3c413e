"""PCformer (Li et al., NeurIPS 2024): EMA coefficients and the predictor-corrector block, against hand-written
formulas in float64, with exact parameter counts and exact per-stage KV caches (cached == uncached decoding)."""

import pytest
import torch
from decoding import (
    assert_incremental_decoding_equals_full_forward,
    causal_lm,
    generate_static_dynamic_uncached,
    tiny,
)
from decoding import source_batch as padded_source_batch

from modeling_ode import (
    ODETransformerConfig,
    ODETransformerForCausalLM,
    ODETransformerForConditionalGeneration,
)
from modeling_ode.ode import ODE_METHODS, StageCoefficients, ode_step

D = 8
# The four alpha scopes: (who owns an alpha, its size).
ALPHA_SCOPES = [("stack", "scalar"), ("block", "scalar"), ("stack", "dimension"), ("block", "dimension")]


def pc_config(side: str = "encoder", method: str = "rk2", **overrides) -> ODETransformerConfig:
    """A tiny config whose `side` blocks are PCformer's: an EMA predictor and the corrector."""
    pc = {
        f"{side}_ode_method": method,
        f"{side}_ode_coefficients": "ema",
        f"{side}_layer_connections": "predictor_corrector",
    }
    return tiny(d_model=D, **{**pc, **overrides})


@pytest.fixture
def float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


# --- EMA coefficients ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["rk2", "rk4"])
@pytest.mark.parametrize("alpha_size", ["scalar", "dimension"])
def test_ema_predictor_by_hand(float64, method, alpha_size, device):
    """RK2: y + a(1-a) F1 + a F2, F2 = F(y + F1); RK4: y + a(1-a)^3 F1 + a(1-a)^2 F2 + a(1-a) F3 + a F4 with the
    classical RK4 inputs y + F1/2, y + F2/2, y + F3 (the released code's predictor)."""
    g = torch.Generator().manual_seed(0)
    weight = (torch.randn(D, D, generator=g) / D**0.5).to(device)
    f = lambda x: torch.tanh(x @ weight)  # noqa: E731
    y = torch.randn(3, 4, D, generator=g).to(device)
    coefficients = StageCoefficients("ema", ODE_METHODS[method], D, alpha_size).to(device)
    with torch.no_grad():
        coefficients.alpha.copy_(torch.rand(coefficients.alpha.shape, generator=g))
    a = coefficients.alpha
    assert a.shape == ((D,) if alpha_size == "dimension" else ())
    out = ode_step(y, lambda x, i: f(x), ODE_METHODS[method], coefficients)
    f1 = f(y)
    if method == "rk2":
        expected = y + a * (1 - a) * f1 + a * f(y + f1)
    else:
        f2 = f(y + f1 / 2)
        f3 = f(y + f2 / 2)
        f4 = f(y + f3)
        expected = y + a * (1 - a) ** 3 * f1 + a * (1 - a) ** 2 * f2 + a * (1 - a) * f3 + a * f4
    torch.testing.assert_close(out, expected)


def test_ema_alpha_starts_at_one_half(device):
    """alpha = 0.5 at initialisation (also after `post_init`): RK4 weighs its stages 1/16, 1/8, 1/4, 1/2."""
    config = pc_config(method="rk4", ode_ema_alpha="dimension")
    model = ODETransformerForConditionalGeneration(config).to(device)
    coefficients = model.get_encoder().ode_coefficients[0]
    torch.testing.assert_close(coefficients.alpha, torch.full((D,), 0.5, device=device))
    torch.testing.assert_close(
        coefficients.ema_gamma()[:, 0], torch.tensor([1 / 16, 1 / 8, 1 / 4, 1 / 2], device=device)
    )


# --- the whole block, by hand ---------------------------------------------------------------------------------


def pre_norm_layer(layer, x, mask=None):
    """The pre-norm layer written out: h = x + SAN(LN(x)), h + FFN(LN(h)) (no cross-attention)."""
    h = x + layer.self_attn(layer.self_attn_layer_norm(x), attention_mask=mask)[0]
    return h + layer.ffn(layer.final_layer_norm(h))


def predictor_by_hand(method, f, y, a):
    f1 = f(y)
    if method == "rk2":
        return y + a * (1 - a) * f1 + a * f(y + f1)
    f2 = f(y + f1 / 2)
    f3 = f(y + f2 / 2)
    return y + a * (1 - a) ** 3 * f1 + a * (1 - a) ** 2 * f2 + a * (1 - a) * f3 + a * f(y + f3)


def randomize(stack, generator):
    """Random connection weights, alphas and LayerNorms, so a swapped weight or LayerNorm cannot go unnoticed."""
    connections = stack.connections
    with torch.no_grad():
        for weight in (connections.weight, connections.corrector_weight):
            weight.copy_(torch.rand(weight.shape, generator=generator).tril() + 0.1)
        for norm in [*connections.layer_norms, *connections.predictor_norms, stack.layer_norm]:
            norm.weight.copy_(1 + torch.randn(D, generator=generator) / 4)
            norm.bias.copy_(torch.randn(D, generator=generator) / 4)
        for coefficients in stack.ode_coefficients:
            coefficients.alpha.copy_(torch.rand(coefficients.alpha.shape, generator=generator))


def stack_by_hand(stack, method, includes_residual, x, mask=None):
    """h_0 = x; block t: y_t = sum_j W[t, j] h_j, P = predictor(y_t), c = sum_{j<=t} V[t+1, j] h_j +
    V[t+1, t+1] LN'_t(P), h_{t+1} = LN_t(layer(c)); the stack's output is LN(sum_j W[L, j] h_j)."""
    connections = stack.connections
    w, v = connections.weight, connections.corrector_weight
    history = [x]
    for t, layer in enumerate(stack.layers):
        alpha = stack.ode_coefficients[t if len(stack.ode_coefficients) > 1 else 0].alpha

        def f(z, layer=layer):
            return pre_norm_layer(layer, z, mask) - (0 if includes_residual else z)

        y = sum(w[t, j] * history[j] for j in range(t + 1))
        prediction = predictor_by_hand(method, f, y, alpha)
        c = sum(v[t + 1, j] * history[j] for j in range(t + 1))
        c = c + v[t + 1, t + 1] * connections.predictor_norms[t](prediction)
        history.append(connections.layer_norms[t](pre_norm_layer(layer, c, mask)))
    return stack.layer_norm(sum(w[-1, j] * history[j] for j in range(len(history))))


@pytest.mark.parametrize("scope,alpha_size", ALPHA_SCOPES)
@pytest.mark.parametrize("method,includes_residual", [("rk2", False), ("rk4", True)])
def test_encoder_block_by_hand(float64, scope, alpha_size, method, includes_residual, device):
    """The encoder of a PC model is the hand-written predictor, corrector and history, for each alpha scope and
    both readings of F (the paper's G(LN(y)), the released code's whole layer)."""
    torch.manual_seed(0)
    config = pc_config(
        method=method,
        max_relative_position=0,
        ode_coefficient_scope=scope,
        ode_ema_alpha=alpha_size,
        ode_function_includes_residual=includes_residual,
    )
    encoder = ODETransformerForConditionalGeneration(config).eval().to(device).get_encoder()
    alphas = [c.alpha.shape for c in encoder.ode_coefficients]
    assert alphas == [(D,) if alpha_size == "dimension" else ()] * (2 if scope == "block" else 1)
    randomize(encoder, torch.Generator().manual_seed(1))
    ids = torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(2)).to(device)
    with torch.no_grad():
        expected = stack_by_hand(encoder, method, includes_residual, encoder.embed(encoder.embed_tokens(ids)))
        torch.testing.assert_close(encoder(ids).last_hidden_state, expected)


@pytest.mark.parametrize("method,includes_residual", [("rk2", True), ("rk4", False)])
def test_causal_lm_block_by_hand(float64, method, includes_residual, device):
    """The causal LM's decoder blocks: the same formulas, with causal self-attention."""
    torch.manual_seed(0)
    config = pc_config(
        "decoder",
        method,
        is_encoder_decoder=False,
        max_relative_position=0,
        ode_ema_alpha="dimension",
        ode_function_includes_residual=includes_residual,
    )
    decoder = ODETransformerForCausalLM(config).eval().to(device).get_decoder()
    randomize(decoder, torch.Generator().manual_seed(1))
    ids = torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(2)).to(device)
    causal = torch.full((6, 6), float("-inf"), device=device).triu(1)[None, None]
    with torch.no_grad():
        x = decoder.embed(decoder.embed_tokens(ids))
        expected = stack_by_hand(decoder, method, includes_residual, x, causal)
        torch.testing.assert_close(decoder(ids, use_cache=False).last_hidden_state, expected)


# --- parameters: F is shared ----------------------------------------------------------------------------------


def num_parameters(**overrides) -> int:
    config = ODETransformerConfig.from_preset("base", vocab_size=34040, **overrides)
    with torch.device("meta"):
        return ODETransformerForConditionalGeneration(config).num_parameters()


@pytest.mark.parametrize("method", ["rk2", "rk4"])
@pytest.mark.parametrize("scope,alpha_size", ALPHA_SCOPES)
def test_only_alpha_and_the_history_weights_are_added(method, scope, alpha_size):
    """Against the same RK model with learnable dense connections (DLCL), PC adds the corrector's weights V
    ((L + 1)^2 = 49), the predictor LayerNorms (L x 2d = 6144) and the alphas (1, L, d or L d): F is shared."""
    dlcl = num_parameters(encoder_ode_method=method, encoder_ode_coefficients="tableau")
    pc = num_parameters(
        encoder_ode_method=method,
        encoder_ode_coefficients="ema",
        encoder_layer_connections="predictor_corrector",
        ode_coefficient_scope=scope,
        ode_ema_alpha=alpha_size,
    )
    d, layers = 512, 6
    alphas = (layers if scope == "block" else 1) * (d if alpha_size == "dimension" else 1)
    assert pc - dlcl == (layers + 1) ** 2 + layers * 2 * d + alphas
    preset = ODETransformerConfig.from_preset(f"pcformer_{method}", vocab_size=34040)
    with torch.device("meta"):
        assert ODETransformerForConditionalGeneration(preset).num_parameters() == dlcl + 49 + 6144 + 1


# --- the decoder: one exact KV-cache slot per stage, corrector included ------------------------------------------

DECODER_CASES = [
    {"decoder_ode_method": "rk2", "ode_function_includes_residual": True},
    {"decoder_ode_method": "rk4", "ode_ema_alpha": "dimension", "ode_coefficient_scope": "stack"},
    {
        "decoder_ode_method": "rk2",
        "decoder_ode_function": "ffn",
    },  # self-attention outside F: 2 slots per layer
]


def pc_seq2seq(**overrides):
    torch.manual_seed(0)
    config = pc_config("decoder", **overrides)
    return ODETransformerForConditionalGeneration(config).eval()


def source_batch(device):
    return padded_source_batch(padded_from=(None, 6, None), device=device)


def test_the_corrector_has_its_own_cache_slot_and_every_slot_is_written(device):
    """RK4 + corrector, 2 layers: 10 slots, the corrector's last in each layer; after a cached forward every slot
    holds every position (the released HF variant's predictor stages read the cache but never write it)."""
    model = pc_seq2seq(decoder_ode_method="rk4").to(device)
    layout = model.get_decoder().cache_layout
    assert (layout.num_slots, layout.slot(1, 4)) == (10, 9)
    assert [layer.corrector_stage for layer in model.get_decoder().layers] == [4, 4]
    ids, mask = source_batch(device)
    cache = model(
        input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :5], use_cache=True
    ).past_key_values
    assert [layer.keys.shape[2] for layer in cache.self_attention_cache.layers] == [5] * 10


@pytest.mark.parametrize("overrides", DECODER_CASES)
def test_incremental_decoding_equals_the_full_forward(overrides, device):
    assert_incremental_decoding_equals_full_forward(pc_seq2seq(**overrides).to(device), *source_batch(device))


@pytest.mark.parametrize("overrides", DECODER_CASES)
@pytest.mark.parametrize("decoding", [{}, {"num_beams": 3, "length_penalty": 0.6}])
def test_static_dynamic_and_uncached_generation_agree(overrides, decoding, device):
    kwargs = {"max_new_tokens": 8, "min_new_tokens": 8, **decoding}
    model = pc_seq2seq(**overrides).to(device)
    assert generate_static_dynamic_uncached(model, *source_batch(device), **kwargs).shape == (3, 9)


@pytest.mark.parametrize("method,decoding", [("rk2", {}), ("rk4", {"num_beams": 3})])
def test_causal_lm_static_dynamic_and_uncached_generation_agree(method, decoding, device):
    model = causal_lm(pc_config("decoder", method, is_encoder_decoder=False)).to(device)
    prompt, prompt_mask = source_batch(device)
    full = model(prompt, attention_mask=prompt_mask, use_cache=False).logits
    past = model(prompt[:, :5], attention_mask=prompt_mask[:, :5]).past_key_values
    rest = model(prompt[:, 5:], attention_mask=prompt_mask, past_key_values=past).logits
    torch.testing.assert_close(rest, full[:, 5:], rtol=1e-5, atol=1e-5)
    generate_static_dynamic_uncached(
        model, prompt, prompt_mask, max_new_tokens=6, min_new_tokens=6, **decoding
    )


# --- training and configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients(reentrant, device):
    """The corrector input's tensor goes to the layer positionally, so even reentrant checkpointing keeps every
    gradient (the connections' V and predictor LayerNorms included)."""
    ids, mask = source_batch(device)
    labels = torch.randint(4, 99, (3, 6), generator=torch.Generator().manual_seed(3)).to(device)
    grads = []
    for checkpointing in (False, True):
        model = pc_seq2seq(decoder_ode_method="rk2", encoder_layer_connections="predictor_corrector")
        model = model.train().to(device)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    assert {"model.encoder.connections.corrector_weight", "model.decoder.ode_coefficients.0.alpha"} <= set(
        grads[0]
    )
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-6)


def test_bad_alpha_size_is_refused_by_name():
    with pytest.raises(
        ValueError, match="`ode_ema_alpha`='vector' is not supported; allowed values: scalar, dimension"
    ):
        pc_config(ode_ema_alpha="vector")


def test_presets_are_the_released_nmt_setting():
    for method in ("rk2", "rk4"):
        config = ODETransformerConfig.from_preset(f"pcformer_{method}")
        assert (config.encoder_ode_method, config.encoder_ode_coefficients) == (method, "ema")
        assert config.encoder_layer_connections == "predictor_corrector"
        assert (config.ode_coefficient_scope, config.ode_ema_alpha) == ("stack", "scalar")
        assert config.ode_function_includes_residual and config.decoder_ode_method == "euler"
        assert (config.d_model, config.encoder_layers, config.decoder_layers) == (512, 6, 6)


@pytest.mark.parametrize("study_name,side", [("ptb", "decoder"), ("multi30k", "encoder")])
def test_study_rows_differ_from_the_rk_rows_only_in_pcformer_fields(study_name, side):
    """PC-RK2/PC-RK4 rows, in both readings of F: the RK rows' data, budget and seeds, PCformer's own fields."""
    from experiments.studies import STUDIES

    study = STUDIES[study_name]
    pc_fields = {f"{side}_ode_coefficients", f"{side}_layer_connections", "ode_coefficient_scope"}
    for method in ("rk2", "rk4"):
        for reading in ("", "_codeF"):
            pc = study.flags(f"pc_{method}{reading}", study.depths[0], 0, "cpu")
            rk = study.flags(f"{method}{reading}", study.depths[0], 0, "cpu")
            assert {k for k in pc.keys() | rk.keys() if pc.get(k) != rk.get(k)} == pc_fields
            assert (pc[f"{side}_ode_coefficients"], pc[f"{side}_layer_connections"]) == (
                "ema",
                "predictor_corrector",
            )
            ODETransformerConfig(**{k: v for k, v in pc.items() if k in pc_fields | {f"{side}_ode_method"}})


def test_the_model_card_says_what_the_blocks_are():
    from ode_transformer.config_in_words import describe_ode

    encoder = describe_ode(ODETransformerConfig.from_preset("pcformer_rk2", ode_ema_alpha="dimension"))[0]
    assert "exponential moving average" in encoder and "one alpha per hidden dimension" in encoder
    assert "PCformer's corrector" in encoder
