"""ONNX export of an ODE Transformer encoder-decoder, and greedy and beam decoding with onnxruntime.

Three graphs, named as 🤗 Optimum names a seq2seq model's (opset `ONNX_OPSET`, float32; every batch and length
axis dynamic):

    encoder_model.onnx
        in:  input_ids (batch, source_length) int64, attention_mask (batch, source_length) int64 (1 token, 0 pad)
        out: last_hidden_state (batch, source_length, d_model)
    decoder_model.onnx                      the decoder over target tokens, no cache yet (the first step; given a
                                            whole target, with the encoder: the full forward pass's logits)
        in:  input_ids (batch, target_length), encoder_attention_mask (batch, source_length),
             encoder_hidden_states (batch, source_length, d_model)
        out: logits (batch, target_length, vocab_size), present.* (the self- and cross-attention cache)
    decoder_with_past_model.onnx            the next tokens, with the cache of the tokens before
        in:  input_ids (batch, target_length), encoder_attention_mask, past_key_values.*
        out: logits, present.{layer}.{stage}.{key,value} (the self-attention cache, grown by target_length)

The cache is the decoder's `StageCacheLayout`: every stage of an ODE block attends over the keys and values that
stage computed at earlier positions, so the self-attention cache has one (key, value) pair per (layer, stage), and
the cross-attention one per layer (the encoder's keys and values, the same for every stage):

    past_key_values.{layer}.{stage}.key / .value    (batch, heads, past_length, head_dim), stage 0..stages-1
    past_key_values.{layer}.encoder.key / .value    (batch, heads, source_length, head_dim)

and `present.*` the same names after the step. `ONNXSeq2SeqGenerator` runs the graphs with onnxruntime and decodes
greedily or with beam search as `model.generate` does (same length penalty and early stopping), giving its tokens.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ode_transformer.cli import install_command

__all__ = [
    "DECODER",
    "DECODER_WITH_PAST",
    "ENCODER",
    "GRAPHS",
    "ONNX_OPSET",
    "ONNX_QUANTIZE_CHOICES",
    "ONNXSeq2SeqGenerator",
    "cache_names",
    "check_exportable",
    "export_onnx",
    "quantize_graph_int8",
    "require",
]

ONNX_OPSET = 18  # the dynamo exporter's own opset (no version conversion); onnxruntime >= 1.14 runs it
ENCODER, DECODER, DECODER_WITH_PAST = (
    "encoder_model.onnx",
    "decoder_model.onnx",
    "decoder_with_past_model.onnx",
)
GRAPHS = (ENCODER, DECODER, DECODER_WITH_PAST)
EXPORT_PACKAGES = ("onnx", "onnxscript")  # torch.onnx.export needs them (the dynamo exporter both)
RUNTIME_PACKAGES = ("onnxruntime",)
ONNX_QUANTIZE_CHOICES = ("int8",)


def require(packages: Sequence[str], purpose: str) -> None:
    """Refuse by name, before any work, when a package of the `onnx` extra is missing."""
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        raise ModuleNotFoundError(
            f"{purpose} needs the {', '.join(missing)} package{'s' if len(missing) > 1 else ''}: install the "
            f"[onnx] extra ({install_command('onnx')})",
            name=missing[0],
        )


def cache_names(num_layers: int, stages: int, prefix: str, cross_attention: bool = True) -> list[str]:
    """The flat cache's tensor names in graph order: the self-attention slots (layer, stage) in the order of
    `StageCacheLayout.slot`, key then value, then (with `cross_attention`) each layer's cross-attention pair."""
    names = [
        f"{prefix}.{layer}.{stage}.{kv}"
        for layer in range(num_layers)
        for stage in range(stages)
        for kv in ("key", "value")
    ]
    if cross_attention:
        names += [f"{prefix}.{layer}.encoder.{kv}" for layer in range(num_layers) for kv in ("key", "value")]
    return names


# ----------------------------------------------------------------------------------------------------------
# Export
# ----------------------------------------------------------------------------------------------------------


def _graph_modules():
    """The wrappers that give each graph plain tensor inputs and outputs (torch is imported here, not at module
    import: the onnxruntime side needs numpy and onnxruntime only)."""
    import torch
    from torch import nn
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    from modeling_ode.modeling_ode_transformer import CACHE_FIELD

    class EncoderGraph(nn.Module):
        def __init__(self, model: nn.Module):
            super().__init__()
            self.encoder = model.get_encoder()

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    class DecoderGraph(nn.Module):
        """One decoder call and the LM head, its cache flat: `decoder_model` (no past: encoder_hidden_states in,
        the whole cache out) or `decoder_with_past_model` (the cache in, the grown self-attention cache out)."""

        def __init__(self, model: nn.Module, with_past: bool):
            super().__init__()
            self.decoder = model.get_decoder()
            self.lm_head = model.get_output_embeddings()
            self.layout = self.decoder.cache_layout
            self.with_past = with_past

        def forward(
            self, input_ids: torch.Tensor, encoder_attention_mask: torch.Tensor, *inputs: torch.Tensor
        ):
            encoder_hidden_states, cache = (
                (None, self._cache(inputs)) if self.with_past else (inputs[0], None)
            )
            out = self.decoder(
                input_ids=input_ids,
                encoder_hidden_states=encoder_hidden_states,
                encoder_attention_mask=encoder_attention_mask,
                past_key_values=cache,
                use_cache=True,
            )
            cache = getattr(out, CACHE_FIELD)
            present = [
                tensor for layer in cache.self_attention_cache.layers for tensor in (layer.keys, layer.values)
            ]
            if not self.with_past:
                layers = cache.cross_attention_cache.layers[: self.layout.num_layers]
                present += [tensor for layer in layers for tensor in (layer.keys, layer.values)]
            return (self.lm_head(out.last_hidden_state), *present)

        def _cache(self, tensors: Sequence[torch.Tensor]) -> EncoderDecoderCache:
            """The flat cache (`cache_names` order) as the decoder's cache: a slot per (layer, stage), then a
            cross-attention layer per layer."""
            pairs = [tuple(tensors[i : i + 2]) for i in range(0, len(tensors), 2)]
            slots = self.layout.num_slots
            return EncoderDecoderCache(DynamicCache(pairs[:slots]), DynamicCache(pairs[slots:]))

    return EncoderGraph, DecoderGraph


@dataclass(frozen=True)
class _GraphSpec:
    """What one graph's export needs: the module, example inputs, names and the dynamic axes of each input."""

    module: Any
    inputs: tuple
    input_names: list[str]
    output_names: list[str]
    axes: dict[str, dict[int, str]]  # input or output name -> {axis: name}
    varargs_from: int | None = None  # the inputs from here on are the module's `*inputs`


def _example_inputs(model) -> tuple:
    """(source ids, source mask, target ids, encoder output, a longer target's cache): every dynamic axis at least
    2 long and each a different length (torch.export specialises sizes 0 and 1, and equal sizes could be taken for
    one axis), the source padded in its second row (a mask of ones would let the masking code skip the mask)."""
    import torch

    batch, source, target, past = 2, 5, 3, 4
    config = model.config
    generator = torch.Generator().manual_seed(0)
    source_ids = torch.randint(4, config.encoder_vocab_size, (batch, source), generator=generator)
    source_mask = torch.ones(batch, source, dtype=torch.long)
    source_mask[1, source - 2 :] = 0
    target_ids = torch.randint(4, config.vocab_size, (batch, target), generator=generator)
    past_ids = torch.randint(4, config.vocab_size, (batch, past), generator=generator)
    _, decoder_graph = _graph_modules()
    with torch.no_grad():
        hidden = model.get_encoder()(input_ids=source_ids, attention_mask=source_mask).last_hidden_state
        _, *cache = decoder_graph(model, with_past=False)(past_ids, source_mask, hidden)
    return source_ids, source_mask, target_ids, hidden, cache


def _cache_axes(names: Sequence[str], self_length: str) -> dict[str, dict[int, str]]:
    """A cache tensor (batch, heads, length, head_dim): self-attention's length is `self_length`, cross-attention's
    the source's."""
    return {name: {0: "batch", 2: "source_length" if ".encoder." in name else self_length} for name in names}


def _graph_specs(model) -> dict[str, _GraphSpec]:
    encoder_graph, decoder_graph = _graph_modules()
    layout = model.get_decoder().cache_layout
    source_ids, source_mask, target_ids, hidden, cache = _example_inputs(model)
    layers, stages = layout.num_layers, layout.stages
    source = {0: "batch", 1: "source_length"}
    target = {0: "batch", 1: "target_length"}
    decoder_inputs = {"input_ids": target, "encoder_attention_mask": source, "logits": target}
    past = cache_names(layers, stages, "past_key_values")
    present = cache_names(layers, stages, "present")
    self_present = cache_names(layers, stages, "present", cross_attention=False)
    return {
        ENCODER: _GraphSpec(
            encoder_graph(model),
            (source_ids, source_mask),
            ["input_ids", "attention_mask"],
            ["last_hidden_state"],
            {"input_ids": source, "attention_mask": source, "last_hidden_state": source},
        ),
        DECODER: _GraphSpec(
            decoder_graph(model, with_past=False),
            (target_ids, source_mask, hidden),
            ["input_ids", "encoder_attention_mask", "encoder_hidden_states"],
            ["logits", *present],
            {**decoder_inputs, "encoder_hidden_states": source, **_cache_axes(present, "target_length")},
            varargs_from=2,
        ),
        DECODER_WITH_PAST: _GraphSpec(
            decoder_graph(model, with_past=True),
            (target_ids, source_mask, *cache),
            ["input_ids", "encoder_attention_mask", *past],
            ["logits", *self_present],
            {
                **decoder_inputs,
                **_cache_axes(past, "past_length"),
                **_cache_axes(self_present, "past_length + target_length"),
            },
            varargs_from=2,
        ),
    }


def _dynamic_shapes(spec: _GraphSpec) -> tuple:
    """torch.export's `dynamic_shapes` of the inputs: one `Dim` per axis name, shared by every input that has it,
    grouped as the module's signature groups them (its `*inputs` in a tuple of their own)."""
    from torch.export import Dim

    dims: dict[str, Any] = {}
    shapes = [
        {axis: dims.setdefault(label, Dim(label, min=1)) for axis, label in spec.axes[name].items()}
        for name in spec.input_names
    ]
    if spec.varargs_from is None:
        return tuple(shapes)
    return (*shapes[: spec.varargs_from], tuple(shapes[spec.varargs_from :]))


def check_exportable(model) -> None:
    """Refuse, by name, a model these graphs do not describe (a causal LM)."""
    if not getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(
            "ONNX export covers the encoder-decoder (ODETransformerForConditionalGeneration); this model is a "
            "causal LM (`is_encoder_decoder=False`)."
        )


def export_onnx(
    model,
    out_dir: str | Path,
    dynamo: bool = True,
    opset: int = ONNX_OPSET,
    graphs: Sequence[str] = GRAPHS,
    quantize: str | None = None,
) -> dict[str, float]:
    """Write the ONNX graphs of an `ODETransformerForConditionalGeneration` into `out_dir` (created).

    Args:
        model: the encoder-decoder (its attention implementation, sdpa or eager, is the one exported; weights in
            another dtype are exported from a float32 copy).
        out_dir: the folder of the graphs.
        dynamo: `torch.onnx.export(..., dynamo=True)` (torch.export, torch's default) or the TorchScript exporter.
        opset: the ONNX opset.
        graphs: which of `GRAPHS` to write.
        quantize: "int8" writes the graphs with int8 weights (:func:`quantize_graph_int8`; needs onnxruntime).
    Returns: the seconds each graph's export took, by file name.
    """
    import torch

    require(EXPORT_PACKAGES + (RUNTIME_PACKAGES if quantize else ()), "ONNX export")
    if quantize not in (None, *ONNX_QUANTIZE_CHOICES):
        raise ValueError(
            f"quantize {quantize!r}: choose one of {list(ONNX_QUANTIZE_CHOICES)}, or None (float32)"
        )
    check_exportable(model)
    if model.dtype != torch.float32:  # bf16 or fp16 weights: the graphs are float32, exported from a copy
        model = copy.deepcopy(model).float()
    unknown = sorted(set(graphs) - set(GRAPHS))
    if unknown:
        raise ValueError(f"unknown graphs {unknown}; choose from {list(GRAPHS)}.")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    seconds = {}
    try:
        specs = _graph_specs(model)
        for name in graphs:
            spec = specs[name]
            start = time.perf_counter()
            _export_graph(spec, out_dir / name, dynamo, opset)
            if quantize:
                quantize_graph_int8(out_dir / name, model)
            seconds[name] = time.perf_counter() - start
    finally:
        model.train(was_training)
    return seconds


def quantize_graph_int8(path: Path, model) -> None:
    """Rewrite the graph at `path` with dynamic int8 products, as `modeling_ode.quantization` does in PyTorch:
    onnxruntime's `quantize_dynamic` with int8 weights per output channel, the activations quantised per call to 7
    bits (`reduce_range`: without AVX-512 VNNI the int8 kernels sum pairs in 16 bits, which full-range inputs
    saturate). Only products with a weight are quantised (`MatMulConstBOnly`: attention's Q K^T and its weighted
    sum stay float), and the ODE gates' products stay float (found by their weights, whatever the exporter named
    the nodes)."""
    import logging

    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from modeling_ode.ode import StageGate

    gates = [m.weight.detach().float().numpy() for m in model.modules() if isinstance(m, StageGate)]
    graph = onnx.load(str(path)).graph
    weights = {init.name: init for init in graph.initializer}

    def is_gate(name: str) -> bool:
        if name not in weights or len(weights[name].dims) != 2:
            return False
        array = numpy_helper.to_array(weights[name])
        return any(array.shape == w.shape[::-1] and np.array_equal(array, w.T) for w in gates)

    gate_nodes = [
        n.name for n in graph.node if n.op_type in ("MatMul", "Gemm") and any(map(is_gate, n.input))
    ]
    quantized = path.with_name(f".{path.stem}.int8{path.suffix}")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to pre-process the graph (shape inference) is for static shapes
    try:
        quantize_dynamic(
            path, quantized, weight_type=QuantType.QInt8, per_channel=True, reduce_range=True,
            op_types_to_quantize=["MatMul", "Gemm"], nodes_to_exclude=gate_nodes,
            extra_options={"MatMulConstBOnly": True},
        )  # fmt: skip
    finally:
        root.setLevel(level)
    quantized.replace(path)


def _export_graph(spec: _GraphSpec, path: Path, dynamo: bool, opset: int) -> None:
    import torch

    names = {"input_names": spec.input_names, "output_names": spec.output_names, "opset_version": opset}
    if dynamo:
        dynamic_shapes = _dynamic_shapes(spec)
        program = torch.onnx.export(
            spec.module, spec.inputs, dynamo=True, dynamic_shapes=dynamic_shapes, **names
        )
        program.save(str(path), external_data=False)
    else:
        torch.onnx.export(spec.module, spec.inputs, str(path), dynamo=False, dynamic_axes=spec.axes, **names)


# ----------------------------------------------------------------------------------------------------------
# Decoding with onnxruntime
# ----------------------------------------------------------------------------------------------------------

# The generation fields the decoder follows, with transformers' defaults.
_GENERATION_DEFAULTS: dict[str, Any] = {
    "num_beams": 1,
    "length_penalty": 1.0,
    "early_stopping": False,
    "max_length": 20,
    "max_new_tokens": None,
    "forced_eos_token_id": None,
}
# Fields that would make `generate` process the scores in ways this decoder does not; refused unless at their
# defaults, so that its tokens are `generate`'s.
_UNSUPPORTED_GENERATION = {
    "do_sample": False,
    "num_return_sequences": 1,
    "num_beam_groups": 1,
    "min_length": 0,
    "min_new_tokens": None,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "bad_words_ids": None,
    "force_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "sequence_bias": None,
    "exponential_decay_length_penalty": None,
    "renormalize_logits": False,
}
_TOKEN_FIELDS = ("decoder_start_token_id", "eos_token_id", "pad_token_id")


def _read_json(folders: Sequence[Path], name: str) -> dict[str, Any]:
    for folder in folders:
        if (folder / name).is_file():
            return json.loads((folder / name).read_text(encoding="utf-8"))
    return {}


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """The indices of the k largest scores of each row, largest first (torch.topk)."""
    part = np.argpartition(-scores, k - 1, axis=-1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, axis=-1), axis=-1, kind="stable")
    return np.take_along_axis(part, order, axis=-1)


def _take(array: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """array[b, indices[b, j], ...] for every b, j: gathers beams along axis 1."""
    return np.take_along_axis(array, indices.reshape(indices.shape + (1,) * (array.ndim - 2)), axis=1)


class ONNXSeq2SeqGenerator:
    """Greedy and beam-search decoding of the graphs `export_onnx` writes, with onnxruntime, as `model.generate`
    decodes: its stopping rules, its length penalty (score / generated_length ** length_penalty), `early_stopping`
    (True, False or "never") and `forced_eos_token_id`; the same tokens, up to float rounding between runtimes.

    Args:
        folder: the folder of the graphs, or the folder of `ode-export --onnx` (the graphs in its `onnx/`).
        generation_config: the decoding defaults and token ids (a dict or a `GenerationConfig`); by default the
            `generation_config.json` beside the graphs (or, for an `onnx/` folder, in the folder above), the token
            ids missing there from `config.json`.
        providers: onnxruntime execution providers (default: the CPU).
        session_options: an `onnxruntime.SessionOptions` for the three sessions (e.g. `intra_op_num_threads`).
    """

    def __init__(
        self,
        folder: str | Path,
        generation_config: Any = None,
        providers: Sequence[str] | None = None,
        session_options: Any = None,
    ):
        require(RUNTIME_PACKAGES, "decoding with onnxruntime")
        import onnxruntime

        folder = Path(folder)
        graphs = folder / "onnx" if (folder / "onnx" / ENCODER).is_file() else folder
        missing = [name for name in GRAPHS if not (graphs / name).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{graphs} lacks the ONNX graphs {missing}; write them with `ode-export MODEL OUT --onnx` (into "
                "OUT/onnx) or `hub.onnx_export.export_onnx(model, folder)`."
            )
        providers = list(providers or ["CPUExecutionProvider"])
        self.sessions = {
            name: onnxruntime.InferenceSession(str(graphs / name), session_options, providers=providers)
            for name in GRAPHS
        }
        self.past_names = [i.name for i in self.sessions[DECODER_WITH_PAST].get_inputs()][2:]
        self.num_self = len(self.sessions[DECODER_WITH_PAST].get_outputs()) - 1  # the self-attention tensors
        # an `onnx/` folder is ode-export's: the configs are in the export folder above it
        configs = [graphs, graphs.parent] if graphs.name == "onnx" else [graphs]
        self.generation = self._generation_config(generation_config, configs)

    @staticmethod
    def _generation_config(given: Any, folders: Sequence[Path]) -> dict[str, Any]:
        if given is None:
            given = _read_json(folders, "generation_config.json")
        elif hasattr(given, "to_dict"):
            given = given.to_dict()
        config = {**_GENERATION_DEFAULTS, **{k: v for k, v in given.items() if v is not None}}
        model_config = _read_json(folders, "config.json")
        for name in _TOKEN_FIELDS:
            if config.get(name) is None:
                config[name] = model_config.get(name)
        if config["decoder_start_token_id"] is None:
            raise ValueError(
                "no `decoder_start_token_id` in the generation config or config.json; pass generation_config="
                "model.generation_config (or a dict with it)."
            )
        changed = sorted(
            k for k, default in _UNSUPPORTED_GENERATION.items() if given.get(k) not in (None, default)
        )
        if changed:
            raise ValueError(
                f"the generation config sets {changed}, which this onnxruntime decoder does not implement (it "
                f"follows num_beams, length_penalty, early_stopping, max_length/max_new_tokens and "
                f"forced_eos_token_id); reset them, or decode with the PyTorch model's `generate`."
            )
        return config

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The encoder's last hidden state (batch, source_length, d_model)."""
        return self.sessions[ENCODER].run(None, {"input_ids": input_ids, "attention_mask": attention_mask})[0]

    def generate(
        self,
        input_ids: Any,
        attention_mask: Any = None,
        max_new_tokens: int | None = None,
        num_beams: int | None = None,
        length_penalty: float | None = None,
        early_stopping: bool | str | None = None,
    ) -> np.ndarray:
        """The generated ids (batch, length), the decoder start token first, as `model.generate` returns them;
        arguments left out come from the generation config."""
        config = self.generation
        input_ids = np.asarray(input_ids, dtype=np.int64)
        eos = config["eos_token_id"]
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        pad = config["pad_token_id"] if config["pad_token_id"] is not None else (eos[0] if eos else None)
        if attention_mask is None:  # as generate: padding where the pad token is, unless it is also eos
            attention_mask = (
                input_ids != pad if pad is not None and pad not in eos else np.ones_like(input_ids)
            )
        attention_mask = np.asarray(attention_mask, dtype=np.int64)
        max_new_tokens = max_new_tokens if max_new_tokens is not None else config["max_new_tokens"]
        max_length = 1 + max_new_tokens if max_new_tokens is not None else config["max_length"]
        num_beams = num_beams if num_beams is not None else config["num_beams"]
        search = _Search(
            start=config["decoder_start_token_id"],
            eos=eos,
            pad=pad,
            max_length=max_length,
            forced_eos=config["forced_eos_token_id"],
        )
        hidden = self.encode(input_ids, attention_mask)
        if num_beams == 1:
            return self._greedy(search, hidden, attention_mask)
        return self._beam_search(
            search,
            np.repeat(hidden, num_beams, axis=0),
            np.repeat(attention_mask, num_beams, axis=0),
            num_beams,
            float(length_penalty if length_penalty is not None else config["length_penalty"]),
            early_stopping if early_stopping is not None else config["early_stopping"],
        )

    def _first_step(self, tokens: np.ndarray, hidden: np.ndarray, mask: np.ndarray):
        """decoder_model on the start tokens: (logits, self-attention cache, cross-attention cache)."""
        logits, *present = self.sessions[DECODER].run(
            None, {"input_ids": tokens, "encoder_attention_mask": mask, "encoder_hidden_states": hidden}
        )
        return logits, present[: self.num_self], present[self.num_self :]

    def _next_step(self, tokens: np.ndarray, mask: np.ndarray, cache: list, cross: list):
        """decoder_with_past_model on the newest tokens: (logits, the grown self-attention cache)."""
        feed = {
            "input_ids": tokens,
            "encoder_attention_mask": mask,
            **dict(zip(self.past_names, cache + cross)),
        }
        logits, *cache = self.sessions[DECODER_WITH_PAST].run(None, feed)
        return logits, cache

    def _greedy(self, search: _Search, hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
        batch = hidden.shape[0]
        sequences = np.full((batch, 1), search.start, dtype=np.int64)
        unfinished = np.ones(batch, dtype=bool)
        logits, cache, cross = self._first_step(sequences, hidden, mask)
        while True:
            scores = search.process(logits[:, -1].astype(np.float32), sequences.shape[1])
            tokens = scores.argmax(axis=-1)
            if search.eos:
                tokens = np.where(unfinished, tokens, search.pad)
            sequences = np.concatenate([sequences, tokens[:, None]], axis=1)
            unfinished &= ~search.stops(tokens, sequences.shape[1])
            if not unfinished.any():
                return sequences
            logits, cache = self._next_step(tokens[:, None], mask, cache, cross)

    def _beam_search(
        self,
        search: _Search,
        hidden: np.ndarray,
        mask: np.ndarray,
        num_beams: int,
        length_penalty: float,
        early_stopping: bool | str,
    ) -> np.ndarray:
        """transformers' vectorised beam search (`GenerationMixin._beam_search`), step for step, in numpy."""
        batch, beams, max_length = hidden.shape[0] // num_beams, num_beams, search.max_length
        keep = max(2, 1 + len(search.eos)) * beams  # candidates kept per step: enough to go on if `beams` end
        top_beams = np.arange(keep) < beams
        fill = (search.pad or search.eos[0]) if search.eos else -1  # generate's fill value
        running = np.full((batch, beams, max_length), fill, dtype=np.int64)
        running[:, :, 0] = search.start
        finished_sequences = running.copy()
        running_scores = np.zeros((batch, beams), dtype=np.float32)
        running_scores[:, 1:] = -1e9  # the beams start equal: only the first one's continuations count
        finished_scores = np.full((batch, beams), -1e9, dtype=np.float32)
        is_finished = np.zeros((batch, beams), dtype=bool)
        improvable = np.ones((batch, 1), dtype=bool)
        running_origin = np.full((batch, beams, max_length - 1), -1, dtype=np.int64)
        finished_origin = running_origin.copy()
        penalty = np.float32(-1e9)

        cur_len = 1
        logits, cache, cross = self._first_step(running[:, :, 0].reshape(-1, 1), hidden, mask)
        while True:
            log_probs = search.process(_log_softmax(logits[:, -1].astype(np.float32)), cur_len)
            vocab = log_probs.shape[-1]
            scores = (log_probs.reshape(batch, beams, vocab) + running_scores[:, :, None]).reshape(batch, -1)
            top = _top_k(scores, keep)
            top_scores = np.take_along_axis(scores, top, axis=-1)
            source_beam, tokens = top // vocab, top % vocab
            top_sequences = _take(running, source_beam)
            top_sequences[:, :, cur_len] = tokens
            top_origin = _take(running_origin, source_beam)
            top_origin[:, :, cur_len - 1] = source_beam + np.arange(batch)[:, None] * beams
            hits = search.stops(tokens, cur_len + 1)

            # the best `beams` candidates that did not stop go on
            alive_scores = top_scores + hits.astype(np.float32) * penalty
            alive = _top_k(alive_scores, beams)
            running, running_scores = _take(top_sequences, alive), _take(alive_scores, alive)
            running_origin = _take(top_origin, alive)

            # the candidates among the top `beams` that stopped join the finished ones, scored with the penalty
            just_finished = hits & top_beams[None, :]
            candidate_scores = top_scores / np.float32((cur_len + 1 - 1) ** length_penalty)
            full = is_finished.all(axis=-1, keepdims=True) & (early_stopping is True)
            candidate_scores += full.astype(np.float32) * penalty
            candidate_scores += (~improvable).astype(np.float32) * penalty
            candidate_scores += (~just_finished).astype(np.float32) * penalty
            merged_scores = np.concatenate([finished_scores, candidate_scores], axis=1)
            best = _top_k(merged_scores, beams)
            finished_sequences = _take(np.concatenate([finished_sequences, top_sequences], axis=1), best)
            finished_scores = _take(merged_scores, best)
            finished_origin = _take(np.concatenate([finished_origin, top_origin], axis=1), best)
            is_finished = _take(np.concatenate([is_finished, just_finished], axis=1), best)

            reorder = running_origin[:, :, cur_len - 1].reshape(-1)
            cur_len += 1
            hypothetical = (
                max_length - 1 if early_stopping == "never" and length_penalty > 0.0 else cur_len - 1
            )
            best_running = running_scores[:, :1] / np.float32(hypothetical**length_penalty)
            worst_finished = np.where(
                is_finished, finished_scores.min(axis=1, keepdims=True), np.float32(-1e9)
            )
            improvable &= (best_running > worst_finished).any(axis=-1, keepdims=True)
            if not (
                improvable.any() and not (is_finished.all() and early_stopping is True) and not hits.all()
            ):
                break
            # the beams that go on take their cache along; the cross-attention cache is the same for every beam
            cache = [tensor[reorder] for tensor in cache]
            logits, cache = self._next_step(running[:, :, cur_len - 1].reshape(-1, 1), mask, cache, cross)

        generated = (finished_origin[:, 0] != -1).sum(axis=1).max()
        return finished_sequences[:, 0, : 1 + generated]


@dataclass(frozen=True)
class _Search:
    """The token ids and limits one `generate` call decodes with."""

    start: int
    eos: list[int]
    pad: int | None
    max_length: int
    forced_eos: int | list[int] | None

    def process(self, scores: np.ndarray, length: int) -> np.ndarray:
        """`forced_eos_token_id` (transformers' ForcedEOSTokenLogitsProcessor): only eos at the last position."""
        if self.forced_eos is None or length != self.max_length - 1:
            return scores
        forced = np.full_like(scores, -np.inf)
        forced[:, self.forced_eos] = 0.0
        return forced

    def stops(self, tokens: np.ndarray, length: int) -> np.ndarray:
        """Whether a sequence of `length` ids ending in `tokens` is done (eos, or the maximum length)."""
        return np.isin(tokens, self.eos) | (length >= self.max_length)
