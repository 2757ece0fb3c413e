"""ONNX export of an ODE Transformer encoder-decoder: the graphs, and their int8 quantization.

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
        out: logits, present.{layer}.decoder*.{key,value} (the self-attention cache, grown by target_length)

The cache is the decoder's `StageCacheLayout`: every stage of an ODE block attends over the keys and values that
stage computed at earlier positions, so the self-attention cache has one (key, value) pair per (layer, stage), and
the cross-attention one per layer (the encoder's keys and values, the same for every stage). The names are Optimum's,
`{past_key_values|present}.{layer}.{decoder|encoder}.{key|value}`, with one more for the stages after the first:

    past_key_values.{layer}.decoder.key / .value          stage 0 (Optimum's name; an Euler decoder has only it)
    past_key_values.{layer}.decoder_stage{k}.key / .value stage k = 1..stages-1 of an RK decoder
                                                          (batch, heads, past_length, head_dim)
    past_key_values.{layer}.encoder.key / .value          (batch, heads, source_length, head_dim)

and `present.*` the same names after the step: a loop that feeds each `present.X` back as `past_key_values.X`, and
takes the self-attention cache as the names with `.decoder` in them, decodes an RK decoder as it does Optimum's.
In each graph the cache is in Optimum's order (`cache_pairs`), which Optimum's seq2seq model relies on, feeding the
cache by position: per layer, the self-attention pair (stage 0) then the cross-attention pair, key then value; the
later stages of an RK decoder after every layer's pairs (layer by layer, stage by stage).

Each graph is fused by onnxruntime's transformer optimizer (`fuse_graph`) before any quantization, and beside the
three `export_onnx` writes the search graph of `ode_transformer.hub.onnx_search_graph` (`beam_search_model.onnx`:
onnxruntime's BeamSearch op over them).

With `quantize="int8"` the graphs are written as Optimum's quantizer names them, `encoder_model_quantized.onnx`,
`decoder_model_quantized.onnx`, `decoder_with_past_model_quantized.onnx` (`QUANTIZED_GRAPHS`). No merged decoder
(`decoder_model_merged.onnx`) is written: hub/README.md says why. `ode_transformer.onnx_generation` (with the graphs' names) decodes them with onnxruntime through
transformers' own `generate` (`ONNXSeq2SeqGenerator`).
"""

from __future__ import annotations

import contextlib
import copy
import errno
import logging
import shutil
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ode_transformer.onnx_generation import (
    DECODER,
    DECODER_WITH_PAST,
    ENCODER,
    GRAPHS,
    QUANTIZED_GRAPHS,
    QUANTIZED_SUFFIX,
    RUNTIME_PACKAGES,
    CachePair,
    pair_name,
    parse_cache_name,
    quantized_name,
    require,
    self_attention_name,
)

__all__ = [
    "DECODER",
    "DECODER_WITH_PAST",
    "ENCODER",
    "GRAPHS",
    "ONNX_EXPORTERS",
    "ONNX_OPSET",
    "QUANTIZED_GRAPHS",
    "QUANTIZED_SUFFIX",
    "ONNX_QUANTIZE_CHOICES",
    "RUNTIME_PACKAGES",
    "cache_names",
    "cache_pairs",
    "check_exportable",
    "export_onnx",
    "fuse_graph",
    "pair_name",
    "parse_cache_name",
    "quantize_graph_int8",
    "quantized_name",
    "require",
    "self_attention_name",
    "torchscript_exporter_available",
]

ONNX_OPSET = 18  # the dynamo exporter's own opset (no version conversion); onnxruntime >= 1.14 runs it
ONNX_EXPORTERS = ("auto", "dynamo", "torchscript")
"""``ode-export --onnx-exporter``: ``auto`` is the TorchScript exporter where the installed torch still has it
(:func:`torchscript_exporter_available`), else dynamo. Both give the same graphs (tests/test_onnx.py checks each);
TorchScript traces the model once, where torch.export's decompositions make the dynamo exporter several times as
slow (hub/README.md), and torch keeps the TorchScript exporter, deprecated, until a release removes it."""
EXPORT_PACKAGES = ("onnx", "onnxscript")  # torch.onnx.export needs them (the dynamo exporter both)
ONNX_QUANTIZE_CHOICES = ("int8",)


def cache_pairs(num_layers: int, stages: int, cross_attention: bool = True) -> list[CachePair]:
    """The cache's (key, value) pairs in graph order, as Optimum's seq2seq model orders them: layer by layer, the
    self-attention pair (stage 0) then (with `cross_attention`) the cross-attention pair; then the later stages of an
    RK decoder, layer by layer and stage by stage. Optimum feeds the cache by position, pairing the n-th
    self-attention output with the n-th cross-attention one (`layer_past[:2] + cross[2n:2n+2]`), and reorders the
    first two tensors of each such tuple for beam search: with the extra stages after every layer's pairs, its
    tuples are (self, cross) per layer and then one (stage) pair each, which it feeds back in this order and
    reorders whole."""
    pairs: list[CachePair] = []
    for layer in range(num_layers):
        pairs += [(layer, 0), (layer, None)] if cross_attention else [(layer, 0)]
    return pairs + [(layer, stage) for layer in range(num_layers) for stage in range(1, stages)]


def cache_names(num_layers: int, stages: int, prefix: str, cross_attention: bool = True) -> list[str]:
    """The flat cache's tensor names in graph order (:func:`cache_pairs`), key then value."""
    return [
        f"{prefix}.{pair_name(pair)}.{kv}"
        for pair in cache_pairs(num_layers, stages, cross_attention)
        for kv in ("key", "value")
    ]


# ----------------------------------------------------------------------------------------------------------
# Export
# ----------------------------------------------------------------------------------------------------------


def _graph_modules():
    """The wrappers that give each graph plain tensor inputs and outputs."""
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
            layers = self.layout.num_layers, self.layout.stages
            pairs = cache_pairs(*layers, cross_attention=not self.with_past)
            present = [tensor for pair in pairs for tensor in self._tensors(cache, pair)]
            return (self.lm_head(out.last_hidden_state), *present)

        def _tensors(self, cache: EncoderDecoderCache, pair: CachePair) -> tuple[torch.Tensor, torch.Tensor]:
            """The keys and values of a `CachePair`: a self-attention slot, or a layer's cross-attention."""
            layer, stage = pair
            if stage is None:
                found = cache.cross_attention_cache.layers[layer]
            else:
                found = cache.self_attention_cache.layers[self.layout.slot(layer, stage)]
            return found.keys, found.values

        def _cache(self, tensors: Sequence[torch.Tensor]) -> EncoderDecoderCache:
            """The flat cache (`cache_pairs` order) as the decoder's cache: a slot per (layer, stage), in
            `StageCacheLayout.slot` order, then a cross-attention layer per layer."""
            layout = self.layout
            pairs = dict(zip(cache_pairs(layout.num_layers, layout.stages), zip(tensors[::2], tensors[1::2])))
            slots = sorted((p for p in pairs if p[1] is not None), key=lambda p: layout.slot(*p))
            cross = [pairs[(layer, None)] for layer in range(layout.num_layers)]
            return EncoderDecoderCache(DynamicCache([pairs[p] for p in slots]), DynamicCache(cross))

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
    dynamo: bool | None = None,
    opset: int = ONNX_OPSET,
    graphs: Sequence[str] = GRAPHS,
    quantize: str | None = None,
    search: bool = True,
    fuse: bool = True,
) -> dict[str, float]:
    """Write the ONNX graphs of an `ODETransformerForConditionalGeneration` into `out_dir` (created).

    Args:
        model: the encoder-decoder (its attention implementation, sdpa or eager, is the one exported; weights in
            another dtype are exported from a float32 copy).
        out_dir: the folder of the graphs.
        dynamo: `torch.onnx.export(..., dynamo=True)` (torch.export, torch's default) or the TorchScript exporter;
            None: the TorchScript one where the installed torch still has it (``ONNX_EXPORTERS``' ``auto``).
        opset: the ONNX opset.
        graphs: which of `GRAPHS` to write.
        quantize: "int8" writes the graphs with int8 weights (:func:`quantize_graph_int8`; needs onnxruntime),
            named as Optimum's quantizer names them (`quantized_name`: `encoder_model_quantized.onnx`, ...) and
            without the float32 files.
        fuse: rewrite each graph with onnxruntime's transformer optimizer (:func:`fuse_graph`; needs
            onnxruntime), before any quantization.
        search: with all three graphs, also write the search graph of `ode_transformer.hub.onnx_search_graph`
            (`beam_search_model.onnx`, or `beam_search_model_quantized.onnx`): the whole search in onnxruntime.
    Returns: the seconds each graph's export took, by the file name written.
    """
    import torch

    require(EXPORT_PACKAGES + (RUNTIME_PACKAGES if quantize or fuse else ()), "ONNX export")
    if quantize not in (None, *ONNX_QUANTIZE_CHOICES):
        raise ValueError(
            f"quantize {quantize!r}: choose one of {list(ONNX_QUANTIZE_CHOICES)}, or None (float32)"
        )
    check_exportable(model)
    if dynamo is None:
        dynamo = not torchscript_exporter_available()
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
            path = out_dir / name
            _export_graph(spec, path, dynamo, opset)
            if not dynamo:
                _fix_cache_dims(path, model.config)
            if fuse:
                fuse_graph(path, model.config)
            if quantize:
                path = quantize_graph_int8(path, model)
            seconds[path.name] = time.perf_counter() - start
    finally:
        model.train(was_training)
    if search and set(GRAPHS) <= set(graphs):
        from .onnx_search_graph import write_search_graph

        start = time.perf_counter()
        path = write_search_graph(model, out_dir, quantize)
        seconds[path.name] = time.perf_counter() - start
    return seconds


def torchscript_exporter_available() -> bool:
    """Whether the installed torch has the TorchScript exporter (`torch.onnx.export(..., dynamo=False)`): found
    by its module, ``torch.onnx.utils``, which torch keeps for it, without importing it."""
    import importlib.util

    return importlib.util.find_spec("torch.onnx.utils") is not None


def quantize_graph_int8(path: Path, model) -> Path:
    """Replace the graph at `path` by its version with dynamic int8 products, named as Optimum names it
    (`quantized_name`), and return that version's path. The products are quantised as `modeling_ode.quantization`
    does in PyTorch: onnxruntime's `quantize_dynamic` with int8 weights per output channel, the activations
    quantised per call to 7 bits (`reduce_range`: without AVX-512 VNNI the int8 kernels sum pairs in 16 bits,
    which full-range inputs saturate). Only products with a weight are quantised (`MatMulConstBOnly`: attention's
    Q K^T and its weighted sum stay float), and the ODE gates' products stay float (found by their weights,
    whatever the exporter named the nodes)."""
    import logging

    import onnx
    from google.protobuf.message import DecodeError
    from onnx import numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from modeling_ode.ode import StageGate

    gates = [m.weight.detach().float().numpy() for m in model.modules() if isinstance(m, StageGate)]
    proto = onnx.load(str(path))
    graph = proto.graph
    if fold_weight_identities(graph):
        onnx.save(proto, str(path))
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
    # quantize_dynamic writes a shape-inferred copy of the graph beside it and reads it back; its writer does
    # not report a failed write, so a full disk shows only as the copy failing to parse
    free, size = shutil.disk_usage(path.parent).free, path.stat().st_size
    if free < size:
        raise OSError(
            errno.ENOSPC,
            f"the disk is full: {free} bytes free, and onnxruntime writes a shape-inferred copy of {path.name} "
            f"({size} bytes) beside it",
        )
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to pre-process the graph (shape inference) is for static shapes
    try:
        quantize_dynamic(
            path,
            quantized,
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=True,
            op_types_to_quantize=["MatMul", "Gemm"],
            nodes_to_exclude=gate_nodes,
            # the fused graph's contrib ops (SkipLayerNormalization) have no types for its shape inference: every
            # activation it asks about is float32
            extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    except DecodeError:  # the graph parsed above: a copy of it that does not was cut off as it was written
        raise OSError(
            errno.ENOSPC,
            f"the disk is full: onnxruntime's shape-inferred copy of {path.name} was cut off",
        ) from None
    finally:
        root.setLevel(level)
    named = quantized.replace(path.with_name(quantized_name(path.name)))
    path.unlink()
    return named


def fuse_graph(path: Path, config) -> dict[str, int]:
    """Rewrite the graph at `path` with onnxruntime's transformer optimizer (`optimize_model`, its Python fusions
    for BART, `opt_level` 0: the session applies onnxruntime's own graph optimizations when it loads the graph).
    It fuses each residual add with the LayerNorm after it (`SkipLayerNormalization`) and folds the shape
    arithmetic the exporters leave per layer; the weights are not copied (an RK block's stages still read one F's).
    Its attention fusions look for BART's q/k/v products and find none in ours, separate q/k/v projections
    included (checked: onnxruntime 1.32.0). Returns the count of each fused operator."""
    import logging

    from onnxruntime.transformers.optimizer import optimize_model

    heads = config.encoder_attention_heads
    root = logging.getLogger()
    level = root.level
    # its modules log a line per node they remove, under top-level names (fusion_utils, onnx_model, ...)
    root.setLevel(logging.ERROR)
    try:
        optimized = optimize_model(
            str(path), "bart", num_heads=heads, hidden_size=config.d_model, opt_level=0
        )
        optimized.save_model_to_file(str(path))
        fused = optimized.get_fused_operator_statistics()
    finally:
        root.setLevel(level)
    return {name: count for name, count in fused.items() if count}


def fold_weight_identities(graph) -> int:
    """Point every node that reads a weight through an `Identity` at the weight itself, and drop those `Identity`
    nodes; returns how many. TorchScript gives each later use of a shared weight its own `Identity` (an RK block
    evaluates F, with the same weights, once per stage), and onnxruntime's `quantize_dynamic` quantises only
    products whose weight is an initializer: without this, every stage after the first stayed float."""
    weights = {init.name for init in graph.initializer}
    outputs = {value.name for value in graph.output}
    aliases = {
        node.output[0]: node.input[0]
        for node in graph.node
        if node.op_type == "Identity" and node.input[0] in weights and node.output[0] not in outputs
    }
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name in aliases:
                node.input[index] = aliases[name]
    kept = [node for node in graph.node if not (node.op_type == "Identity" and node.output[0] in aliases)]
    del graph.node[:]
    graph.node.extend(kept)
    return len(aliases)


def _fix_cache_dims(path: Path, config) -> None:
    """Give the cache tensors of a TorchScript graph their fixed heads and head_dim: the exporter leaves the
    dims it cannot trace to an input as symbols (`Concatpresent..._dim_1`), where the dynamo exporter and Optimum's
    graphs state the numbers, which a loop preallocating its cache reads."""
    import onnx

    graph = onnx.load(str(path))
    heads = config.decoder_attention_heads
    fixed = {1: heads, 3: config.d_model // heads}
    for value in [*graph.graph.input, *graph.graph.output]:
        if value.name.startswith(("past_key_values.", "present.")):
            for index, size in fixed.items():
                value.type.tensor_type.shape.dim[index].dim_value = size
    onnx.save(graph, str(path))


@contextlib.contextmanager
def _quiet_dynamo_exporter():
    """Without the dynamo exporter's notes that say nothing about the graph: that torchvision's operators are not
    registered (no torchvision op is exported), that an axis name is merged with an equal one (`batch` with
    `batch`), and torch.export's deprecation notes to itself; about 20 lines per graph otherwise."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="# The axis name: ", category=UserWarning)
            warnings.filterwarnings(
                "ignore", message=r"`isinstance\(treespec, LeafSpec\)`", category=FutureWarning
            )
            yield
    finally:
        registration.setLevel(level)


def _export_graph(spec: _GraphSpec, path: Path, dynamo: bool, opset: int) -> None:
    import torch

    names = {"input_names": spec.input_names, "output_names": spec.output_names, "opset_version": opset}
    spec.module.eval()  # a wrapper starts in train mode (nn.Module's), and torch.onnx warns of exporting in it
    if dynamo:
        dynamic_shapes = _dynamic_shapes(spec)
        with _quiet_dynamo_exporter():
            program = torch.onnx.export(
                spec.module, spec.inputs, dynamo=True, dynamic_shapes=dynamic_shapes, verbose=False, **names
            )
        program.save(str(path), external_data=False)
    else:
        with warnings.catch_warnings():
            # The tracer warns at each Python check on a tensor (transformers' cache and mask code, the model's
            # input checks): each holds for the example inputs and for any other, and the graphs are checked
            # against the eager model at several lengths (tests/test_onnx.py), so the warnings would only alarm.
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            # Its note on advanced indexing (wrong results with negative indices) is about transformers' padding
            # mask, which indexes by aranges: never negative.
            warnings.filterwarnings("ignore", message="Exporting aten::index operator", category=UserWarning)
            torch.onnx.export(
                spec.module, spec.inputs, str(path), dynamo=False, dynamic_axes=spec.axes, **names
            )
