"""transformers' own common model tests (ModelTesterMixin, ConfigTester) run on the ODE Transformer.

The test modules come from the source distribution of the installed transformers version, fetched from the
package registry at test time (see tests/hf_common.py); without them collection fails with a message that
says how to provide them (or, with ODE_SKIP_HF_COMMON_TESTS=1, the module is skipped).

Six test classes: the encoder-decoder (ODETransformerModel, ODETransformerForConditionalGeneration) and the
decoder-only ODETransformerForCausalLM, each with the paper's default ODE setup (RK2 encoder with the gated
coefficients of Eq. (learnable), learnable dense layer connections, relative positions), again with an
RK4 decoder, so the per-stage self-attention KV cache slots run through the common tests too, and with
PCformer's blocks (EMA predictor and corrector, whose evaluation has a cache slot of its own).
"""

from __future__ import annotations

import os
import unittest
from unittest import mock

import hf_common
import pytest
import torch
from transformers.models.auto import modeling_auto

from modeling_ode import (
    ODETransformerConfig,
    ODETransformerForCausalLM,
    ODETransformerForConditionalGeneration,
    ODETransformerModel,
)

try:
    _modeling_common, _configuration_common = hf_common.import_common_tests()
except hf_common.CommonTestsUnavailable as error:
    if os.environ.get(hf_common.SKIP_ENV) == "1":
        pytest.skip(hf_common.unavailable_message(error), allow_module_level=True)
    pytest.fail(hf_common.unavailable_message(error), pytrace=False)

ModelTesterMixin = _modeling_common.ModelTesterMixin
ids_tensor = _modeling_common.ids_tensor
ConfigTester = _configuration_common.ConfigTester


_AUTO_MAPPING_NAMES = (
    (modeling_auto.MODEL_MAPPING_NAMES, ODETransformerModel.__name__),
    (
        modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        ODETransformerForConditionalGeneration.__name__,
    ),
    (modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, ODETransformerForCausalLM.__name__),
)


class ODETransformerModelTester:
    """Tiny configurations and inputs, in the shape of transformers' BartModelTester."""

    def __init__(
        self,
        parent,
        batch_size=13,
        seq_length=7,
        is_training=True,
        vocab_size=99,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        hidden_act="relu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=64,
        max_relative_position=4,
        eos_token_id=2,
        pad_token_id=1,
        bos_token_id=0,
        decoder_start_token_id=2,
        is_encoder_decoder=True,
        **ode_overrides,
    ):
        self.parent = parent
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.encoder_seq_length = seq_length
        self.decoder_seq_length = seq_length
        self.is_training = is_training
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.max_relative_position = max_relative_position
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        self.decoder_start_token_id = decoder_start_token_id
        self.is_encoder_decoder = is_encoder_decoder
        self.ode_overrides = ode_overrides

    def get_config(self) -> ODETransformerConfig:
        # The paper's ODE defaults (RK2 gated encoder, learnable dense connections, relative positions) come from
        # the config's own defaults; `ode_overrides` changes them per test class.
        return ODETransformerConfig(
            vocab_size=self.vocab_size,
            d_model=self.hidden_size,
            encoder_layers=self.num_hidden_layers,
            decoder_layers=self.num_hidden_layers,
            encoder_attention_heads=self.num_attention_heads,
            decoder_attention_heads=self.num_attention_heads,
            encoder_ffn_dim=self.intermediate_size,
            decoder_ffn_dim=self.intermediate_size,
            activation_function=self.hidden_act,
            dropout=self.hidden_dropout_prob,
            attention_dropout=self.attention_probs_dropout_prob,
            activation_dropout=self.hidden_dropout_prob,
            max_position_embeddings=self.max_position_embeddings,
            max_relative_position=self.max_relative_position,
            eos_token_id=self.eos_token_id,
            bos_token_id=self.bos_token_id,
            pad_token_id=self.pad_token_id,
            decoder_start_token_id=self.decoder_start_token_id,
            is_encoder_decoder=self.is_encoder_decoder,
            # The paper trains with label smoothing 0.1 (the config default); the common loss tests compare the
            # reported loss with plain cross entropy against the labels.
            **self.ode_overrides,
        )

    def prepare_config_and_inputs(self):
        # Tokens >= 3 (no pad/bos/eos inside), an EOS at the end; padding is added by the attention mask tests.
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
        input_ids[:, -1] = self.eos_token_id
        attention_mask = torch.ones_like(input_ids)
        config = self.get_config()
        if not self.is_encoder_decoder:
            return config, {"input_ids": input_ids, "attention_mask": attention_mask}
        decoder_input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
        inputs_dict = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": torch.ones_like(decoder_input_ids),
        }
        return config, inputs_dict

    def prepare_config_and_inputs_for_common(self):
        return self.prepare_config_and_inputs()

    def create_and_check_decoder_model_past_large_inputs(self, config, inputs_dict):
        """BART's check: three new tokens decoded on top of the cache (every ODE stage reads and extends its own
        self-attention slot) give the last three states of the uncached pass."""
        if config.is_encoder_decoder:
            model = ODETransformerModel(config).eval()
            input_ids = inputs_dict["decoder_input_ids"]
            attention_mask = inputs_dict["decoder_attention_mask"]
            with torch.no_grad():
                encoder_hidden_states = model.get_encoder()(
                    inputs_dict["input_ids"], attention_mask=inputs_dict["attention_mask"]
                ).last_hidden_state
            cross = {
                "encoder_hidden_states": encoder_hidden_states,
                "encoder_attention_mask": inputs_dict["attention_mask"],
            }
        else:
            model = ODETransformerForCausalLM(config).eval()
            input_ids, attention_mask, cross = inputs_dict["input_ids"], inputs_dict["attention_mask"], {}
        decoder = model.get_decoder()

        with torch.no_grad():
            past_key_values = decoder(input_ids, attention_mask=attention_mask, use_cache=True, **cross)[
                "past_key_values"
            ]
            next_tokens = ids_tensor((self.batch_size, 3), config.vocab_size)
            next_attention_mask = torch.cat([attention_mask, ids_tensor((self.batch_size, 3), 2)], dim=-1)
            next_input_ids = torch.cat([input_ids, next_tokens], dim=-1)
            output_from_no_past = decoder(next_input_ids, attention_mask=next_attention_mask, **cross)[
                "last_hidden_state"
            ]
            output_from_past = decoder(
                next_tokens, attention_mask=next_attention_mask, past_key_values=past_key_values, **cross
            )["last_hidden_state"]

        self.parent.assertEqual(output_from_past.shape[1], next_tokens.shape[1])
        torch.testing.assert_close(output_from_past, output_from_no_past[:, -3:], atol=1e-4, rtol=1e-4)


class _ODECommonTests(ModelTesterMixin):
    """What every ODE test class shares: the tester, the config tests and the skips (each with its reason)."""

    tester_kwargs: dict = {}
    test_resize_position_embeddings = False  # sinusoidal positions, no learned table to resize
    # The mixin dates a model by the "# Copyright <year>" line of its config file and runs this init test only
    # for models from 2023 on; our files carry no such line, so opt in explicitly.
    test_can_init_all_missing_weights_before_2023 = True

    @classmethod
    def setUpClass(cls):
        # Tiny models: intra-op threads only add synchronisation, and under `pytest -n 2` on two cores they
        # oversubscribe the CPU (several times slower). One thread per test process; restored afterwards.
        super().setUpClass()
        cls._torch_threads = torch.get_num_threads()
        torch.set_num_threads(1)

    @classmethod
    def tearDownClass(cls):
        torch.set_num_threads(cls._torch_threads)
        super().tearDownClass()

    def setUp(self):
        # The common tests pick labels and skip heads by looking a class name up in transformers' static auto
        # mappings (`MODEL_MAPPING_NAMES`, ...); `AutoModel.register` does not touch those, so list our classes
        # there for the duration of each test.
        for mapping, class_name in _AUTO_MAPPING_NAMES:
            patcher = mock.patch.dict(mapping, {ODETransformerConfig.model_type: class_name})
            patcher.start()
            self.addCleanup(patcher.stop)
        self.model_tester = ODETransformerModelTester(
            self, is_encoder_decoder=self.is_encoder_decoder, **self.tester_kwargs
        )
        self.config_tester = ConfigTester(
            self,
            config_class=ODETransformerConfig,
            d_model=16,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            encoder_layers=2,
            decoder_layers=2,
            vocab_size=99,
            **self.tester_kwargs,
        )

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_decoder_model_past_with_large_inputs(self):
        config, inputs_dict = self.model_tester.prepare_config_and_inputs_for_common()
        self.model_tester.create_and_check_decoder_model_past_large_inputs(config, inputs_dict)

    def test_reverse_loading_mapping(self):
        """transformers' version checks that `save_pretrained` writes a checkpoint back in the layout its conversion
        mapping loads from. Ours loads the fused q/k/v layout of older folders (tests/test_compat.py) but saves the
        model's own separate projections, so that a saved folder's keys are the modules' names: every key saved is
        one of the model's, the projections by their own names, and none fused."""
        import tempfile

        from safetensors.torch import load_file

        config, _ = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config)
            with tempfile.TemporaryDirectory() as folder:
                model.save_pretrained(folder)
                saved = set(load_file(os.path.join(folder, "model.safetensors")))
            assert saved <= set(model.state_dict()), sorted(saved - set(model.state_dict()))[:5]
            assert any(key.endswith("self_attn.q_proj.weight") for key in saved)
            assert not any("qkv_proj" in key or "kv_proj" in key for key in saved)

    @unittest.skip(
        reason="GenerationTesterMixin (tests/generation/test_utils.py) is not in the transformers sdist, so this "
        "class cannot inherit it; generation (greedy/beam, cached vs uncached, per-stage caches) is tested by "
        "the project's own generation tests"
    )
    def test_generation_tester_mixin_inheritance(self):
        pass


class ODETransformerModelTest(_ODECommonTests, unittest.TestCase):
    """Encoder-decoder, the paper's defaults: RK2 gated encoder, Euler (residual) decoder."""

    all_model_classes = (ODETransformerModel, ODETransformerForConditionalGeneration)
    is_encoder_decoder = True


class ODETransformerRK4DecoderModelTest(ODETransformerModelTest):
    """Encoder-decoder with an RK4 decoder: four self-attention cache slots per decoder layer."""

    tester_kwargs = {"decoder_ode_method": "rk4"}


class ODETransformerForCausalLMTest(_ODECommonTests, unittest.TestCase):
    """Decoder-only language model (the decoder stack without cross-attention)."""

    all_model_classes = (ODETransformerForCausalLM,)
    is_encoder_decoder = False


class ODETransformerRK4ForCausalLMTest(ODETransformerForCausalLMTest):
    """Decoder-only language model with RK4 blocks (per-stage cache slots)."""

    tester_kwargs = {"decoder_ode_method": "rk4"}


_PCFORMER = {"ode_coefficients": "ema", "layer_connections": "predictor_corrector"}


class ODETransformerPCModelTest(ODETransformerModelTest):
    """Encoder-decoder with PCformer blocks on both sides (EMA predictor and corrector): an RK2 encoder and an RK4
    decoder with one alpha per dimension and F the whole layer, i.e. five self-attention cache slots per decoder
    layer (four stages and the corrector)."""

    tester_kwargs = {
        **{f"{side}_{field}": value for side in ("encoder", "decoder") for field, value in _PCFORMER.items()},
        "decoder_ode_method": "rk4",
        "ode_ema_alpha": "dimension",
        "ode_function_includes_residual": True,
    }


class ODETransformerPCForCausalLMTest(ODETransformerForCausalLMTest):
    """Decoder-only language model with PCformer blocks (RK2-EMA predictor and corrector)."""

    tester_kwargs = {
        "decoder_ode_method": "rk2",
        **{f"decoder_{field}": value for field, value in _PCFORMER.items()},
    }
