"""Optimum's seq2seq input feeding, vendored for tests/test_onnx.py.

How 🤗 Optimum's `ORTModelForSeq2SeqLM` feeds a decoder's cache to the graphs and reorders it for beam search, copied
from optimum-onnx 0.1.0 (`optimum/onnxruntime/modeling_seq2seq.py`, Apache-2.0, Copyright 2022 The HuggingFace
Team): `ORTDecoderForSeq2Seq.forward` without IO binding, `ORTModelForSeq2SeqLM.forward` and `_reorder_cache`.
optimum-onnx 0.1.0 pins transformers < 4.58 and fails to import on 5.x, so the tests cannot use the package itself.

What Optimum does, kept as it is:
- the cache inputs are `[name for name in inputs if ".key" in name or ".value" in name]`, fed **by position** from
  the flattened tuple of per-layer tuples;
- the outputs are split into self-attention names (no "encoder" in them) and cross-attention ones, and regrouped as
  `self[i:i+2] + cross[i:i+2]` for i = 0, 2, 4, ...;
- after the first step the cross-attention pair is taken from `past[i][2:4]` of every tuple of four;
- beam search reorders `layer_past[:2]` of every tuple when the first has four tensors.

Changed, only where transformers 5 requires it of any model `generate` drives: the cache arrives as `cache` (5.24's
name) as well as `past_key_values`, and the model class is a `PreTrainedModel` over a bare config.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import GenerationConfig, GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from modeling_ode.compat import CACHE_FIELD

_NUMPY = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32}


class _Session:
    """`ORTSessionMixin`'s input and output handling: names, expected dtypes, numpy in and torch out."""

    def __init__(self, session):
        self.session = session
        self.input_names = [i.name for i in session.get_inputs()]
        self.output_names = [o.name for o in session.get_outputs()]
        self.input_dtypes = {i.name: i.type for i in session.get_inputs()}

    def run(self, model_inputs: dict) -> dict[str, torch.Tensor]:
        onnx_inputs = {}
        for input_name in self.input_names:
            if model_inputs.get(input_name) is None:
                raise ValueError(f"Input {input_name} is required by model but not provided.")
            value = model_inputs[input_name].numpy(force=True)
            onnx_inputs[input_name] = value.astype(_NUMPY[self.input_dtypes[input_name]], copy=False)
        outputs = self.session.run(None, onnx_inputs)
        return {name: torch.from_numpy(value) for name, value in zip(self.output_names, outputs)}


class OptimumDecoder(_Session):
    """`ORTDecoderForSeq2Seq` (the non-IO-binding path of its `forward`)."""

    def __init__(self, session, num_attention_heads: int, embed_size_per_head: int):
        super().__init__(session)
        self.key_value_input_names = [key for key in self.input_names if (".key" in key) or (".value" in key)]
        self.key_value_output_names = [
            key for key in self.output_names if (".key" in key) or (".value" in key)
        ]
        self.self_attention_output_names = [
            key for key in self.key_value_output_names if "encoder" not in key
        ]
        self.cross_attention_output_names = [key for key in self.key_value_output_names if "encoder" in key]
        self.num_attention_heads = num_attention_heads
        self.embed_size_per_head = embed_size_per_head

    def forward(self, input_ids, encoder_hidden_states, encoder_attention_mask, past_key_values=None):
        batch_size = input_ids.shape[0]
        cross_attention_key_values = None
        if past_key_values is not None and len(past_key_values[0]) == 4:
            cross_attention_key_values = tuple(past_key_values[i][2:4] for i in range(len(past_key_values)))
        if len(self.key_value_input_names) > 0 and past_key_values is None:
            shape = (batch_size, self.num_attention_heads, 0, self.embed_size_per_head)
            key_or_value = torch.zeros(shape, dtype=torch.float32)
            past_key_values = tuple(key_or_value for _ in range(len(self.key_value_input_names)))
        elif isinstance(past_key_values, tuple) and isinstance(past_key_values[0], tuple):
            past_key_values = sum(past_key_values, ())
            if cross_attention_key_values is not None:
                cross_attention_key_values = sum(cross_attention_key_values, ())
        model_inputs = {
            "input_ids": input_ids,
            "encoder_hidden_states": encoder_hidden_states,
            "encoder_attention_mask": encoder_attention_mask,
        }
        if past_key_values is not None:
            model_inputs.update(zip(self.key_value_input_names, past_key_values))
        model_outputs = self.run(model_inputs)
        logits = model_outputs.pop("logits")
        self_attention_key_values = tuple(
            model_outputs.pop(name) for name in self.self_attention_output_names
        )
        if cross_attention_key_values is None:
            cross_attention_key_values = tuple(
                model_outputs.pop(name) for name in self.cross_attention_output_names
            )
        past_key_values = tuple(
            self_attention_key_values[i : i + 2] + cross_attention_key_values[i : i + 2]
            for i in range(0, len(self_attention_key_values), 2)
        )
        return logits, past_key_values


class OptimumStyleSeq2SeqLM(PreTrainedModel, GenerationMixin):
    """`ORTModelForSeq2SeqLM` over the three graphs' sessions (`encoder`, `decoder`, `decoder_with_past`)."""

    config_class = PreTrainedConfig
    main_input_name = "input_ids"

    def __init__(self, sessions: dict, generation_config: GenerationConfig, heads: int, head_dim: int):
        super().__init__(PreTrainedConfig(is_encoder_decoder=True))
        self.encoder_session = _Session(sessions["encoder"])
        self.decoder = OptimumDecoder(sessions["decoder"], heads, head_dim)
        self.decoder_with_past = OptimumDecoder(sessions["decoder_with_past"], heads, head_dim)
        self.generation_config = generation_config
        self.encoder = _Encoder(self.encoder_session)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def get_encoder(self, *args, **kwargs):
        return self.encoder

    def forward(
        self, input_ids=None, attention_mask=None, decoder_input_ids=None, encoder_outputs=None, **kwargs
    ):
        past_key_values = kwargs.get("cache", kwargs.get("past_key_values"))
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
        decoder = self.decoder_with_past if past_key_values is not None else self.decoder
        logits, past_key_values = decoder.forward(
            decoder_input_ids, encoder_outputs[0], attention_mask, past_key_values
        )
        return Seq2SeqLMOutput(logits=logits, **{CACHE_FIELD: past_key_values})

    @staticmethod
    def _reorder_cache(past_key_values, beam_idx):
        if len(past_key_values[0]) == 4:
            # Cached cross_attention states don't have to be reordered -> they are always the same
            return tuple(
                tuple(past_state.index_select(0, beam_idx) for past_state in layer_past[:2]) + layer_past[2:]
                for layer_past in past_key_values
            )
        return tuple(
            tuple(past_state.index_select(0, beam_idx) for past_state in layer_past)
            for layer_past in past_key_values
        )

    def _prepare_cache_for_generation(self, *args, **kwargs):
        return


class _Encoder(torch.nn.Module):
    main_input_name = "input_ids"

    def __init__(self, session: _Session):
        super().__init__()
        self.session = session

    def forward(self, input_ids, attention_mask=None, **kwargs):
        outputs = self.session.run({"input_ids": input_ids, "attention_mask": attention_mask})
        return BaseModelOutput(last_hidden_state=outputs["last_hidden_state"])
