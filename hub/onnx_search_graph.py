"""The whole search in one ONNX graph: onnxruntime's `BeamSearch` contrib op over the exported graphs.

`build_search_graph` packs the three graphs of `ode_transformer.hub.onnx_export` (float32 or int8) as the two
subgraphs of one `com.microsoft.BeamSearch` node with its encoder-decoder interface (`model_type` 1, built for T5;
onnxruntime's `transformers/convert_generation.py` writes the same node for T5):

    encoder subgraph   encoder_model + decoder_model (the first step)
        in:  encoder_input_ids, encoder_attention_mask, decoder_input_ids (int32)
        out: logits, encoder_hidden_states, present_key_self_{i} / present_value_self_{i} for each slot i,
             present_key_cross_{i} / present_value_cross_{i} for each slot i
    decoder subgraph   decoder_with_past_model (the next token)
        in:  input_ids (batch, 1), encoder_attention_mask (int32), past_key_self_{i}, past_value_self_{i} ...,
             past_key_cross_{i}, past_value_cross_{i} ...
        out: logits, present_key_self_{i}, present_value_self_{i} ...

The op knows one self-attention pair and one cross-attention pair per "layer" and feeds each present back as the
past of the same index. An RK decoder keeps one self-attention pair per (layer, stage) (`StageCacheLayout`), so
each slot is one of the op's layers, and its cross-attention pair is its layer's: the encoder subgraph outputs it
once per stage (the decoder subgraph reads stage 0's). The search runs in onnxruntime's C++ (`SEARCH_GRAPH`, one
`session.run` per batch), with the options `SEARCH_OPTIONS` lists; `ode_transformer.onnx_search_decoding` decodes with it
(`ONNXSearchGenerator` takes `generate`'s keywords for them and refuses the others by name).

The graph takes int64 ``input_ids`` and ``attention_mask`` (what transformers and Optimum pass; the op's int32
is cast inside), and returns ``sequences`` (int64, batch x num_return_sequences x max_length, the decoder start
token first, padded with the model's pad id: ``tokenizer.batch_decode(sequences[:, 0])`` reads them),
``sequences_scores`` and ``sequence_lengths`` (each sequence's tokens before its padding, the start token counted).

The weights the two subgraphs share (the decoder's, in `decoder_model` and `decoder_with_past_model`) are stored
once, in the main graph, which the subgraphs read from the outer scope.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ode_transformer.onnx_generation import GRAPHS, CachePair, pair_name, parse_cache_name, quantized_name
from ode_transformer.onnx_search_decoding import (
    OP_PAD,
    SEARCH_GRAPH,
    SEARCH_INPUTS,
    SEQUENCE_LENGTHS,
    search_graph_file,
)

__all__ = ["SEARCH_GRAPH", "build_search_graph", "search_graph_file", "write_search_graph"]

MS_DOMAIN = "com.microsoft"


def _prefixed(path: Path, prefix: str):
    """The model at `path` with `prefix` before every name in its graph (the two subgraphs hold three graphs)."""
    import onnx
    from onnx import compose

    return compose.add_prefix(onnx.load(str(path)), prefix)


def _opsets(models) -> list:
    """The operator sets `models` import (each domain at its highest version), and the op's own domain."""
    from onnx import helper

    versions = {MS_DOMAIN: 1}
    for model in models:
        for opset in model.opset_import:
            versions[opset.domain] = max(versions.get(opset.domain, 0), opset.version)
    return [helper.make_opsetid(domain, version) for domain, version in versions.items()]


def _value(graph, name: str):
    """The ValueInfo of `graph`'s input or output `name`."""
    return next(v for v in [*graph.input, *graph.output] if v.name == name)


def _renamed(value, name: str, elem_type: int | None = None, dims: Sequence[Any] | None = None):
    """A copy of ValueInfo `value` under `name`, with another element type or shape where given."""
    import onnx

    copy = onnx.ValueInfoProto()
    copy.CopyFrom(value)
    copy.name = name
    if elem_type is not None:
        copy.type.tensor_type.elem_type = elem_type
    if dims is not None:
        shape = copy.type.tensor_type.shape
        del shape.dim[:]
        for size in dims:
            dim = shape.dim.add()
            if isinstance(size, int):
                dim.dim_value = size
            else:
                dim.dim_param = size
    return copy


def _slots(decoder_with_past) -> list[CachePair]:
    """The self-attention slots in the order of decoder_with_past's outputs (after the logits)."""
    return [parse_cache_name(o.name.split("/", 1)[1])[0] for o in decoder_with_past.output[1::2]]


def _name(prefix: str, pair: CachePair, kind: str, tense: str) -> str:
    """A cache tensor's name in a prefixed graph: `p/past_key_values.0.decoder_stage1.key`."""
    return f"{prefix}{tense}.{pair_name(pair)}.{kind}"


def _renaming(nodes, mapping: dict[str, str]) -> list:
    """Copies of `nodes` with every input and output named in `mapping` renamed: the op's names given to the
    exported graphs' tensors themselves, where an `Identity` between them would copy the cache at every step."""
    renamed = []
    for node in nodes:
        copy = type(node)()
        copy.CopyFrom(node)
        for field in (copy.input, copy.output):
            names = [mapping.get(name, name) for name in field]
            del field[:]
            field.extend(names)
        renamed.append(copy)
    return renamed


def _first_slots(slots: list[CachePair]) -> dict[int, int]:
    """The index of each layer's stage-0 slot: the op's layer that carries the layer's cross-attention pair."""
    return {pair[0]: index for index, pair in enumerate(slots) if pair[1] == 0}


def _encoder_subgraph(encoder, decoder, slots: list[CachePair]):
    """encoder_model then decoder_model on the start token, under the op's names (int32 ids, cast to int64)."""
    from onnx import TensorProto, helper

    int64, int32 = TensorProto.INT64, TensorProto.INT32
    first = _first_slots(slots)
    mapping = {
        "d/encoder_attention_mask": "e/attention_mask",
        "e/last_hidden_state": "encoder_hidden_states",
        "d/encoder_hidden_states": "encoder_hidden_states",
        "d/logits": "logits",
    }
    outputs = [
        _renamed(_value(decoder, "d/logits"), "logits"),
        _renamed(_value(encoder, "e/last_hidden_state"), "encoder_hidden_states"),
    ]
    copies, cross_outputs = [], []
    for index, pair in enumerate(slots):
        for kind in ("key", "value"):
            inner = _name("d/", pair, kind, "present")
            mapping[inner] = f"present_{kind}_self_{index}"
            outputs.append(_renamed(_value(decoder, inner), mapping[inner]))
            inner, name = _name("d/", (pair[0], None), kind, "present"), f"present_{kind}_cross_{index}"
            if index == first[pair[0]]:
                mapping[inner] = name
            else:  # a later stage's slot: its layer's pair once more (once per sentence, not per step)
                copies.append(
                    helper.make_node("Identity", [f"present_{kind}_cross_{first[pair[0]]}"], [name])
                )
            cross_outputs.append(_renamed(_value(decoder, inner), name))
    nodes = [
        helper.make_node("Cast", ["encoder_input_ids"], ["e/input_ids"], to=int64),
        helper.make_node("Cast", ["encoder_attention_mask"], ["e/attention_mask"], to=int64),
        helper.make_node("Cast", ["decoder_input_ids"], ["d/input_ids"], to=int64),
        *_renaming(encoder.node, mapping),
        *_renaming(decoder.node, mapping),
        *copies,
    ]
    inputs = [
        _renamed(_value(encoder, "e/input_ids"), "encoder_input_ids", int32),
        _renamed(_value(encoder, "e/attention_mask"), "encoder_attention_mask", int32),
        _renamed(_value(decoder, "d/input_ids"), "decoder_input_ids", int32, ["batch", 1]),
    ]
    initializers = [*encoder.initializer, *decoder.initializer]
    return helper.make_graph(
        nodes, "encoder and first decoder step", inputs, outputs + cross_outputs, initializers
    )


def _decoder_subgraph(decoder, slots: list[CachePair]):
    """decoder_with_past_model on the newest token under the op's names: a cross-attention input per slot (a
    stage after the first reads its layer's, from stage 0's input)."""
    from onnx import TensorProto, helper

    int64, int32 = TensorProto.INT64, TensorProto.INT32
    first = _first_slots(slots)
    mapping = {"p/logits": "logits"}
    self_inputs, cross_inputs, outputs = [], [], [_renamed(_value(decoder, "p/logits"), "logits")]
    cross_template = next(i for i in decoder.input if ".encoder." in i.name)
    for index, pair in enumerate(slots):
        for kind in ("key", "value"):
            for tense, name in (("past_key_values", f"past_{kind}_self_{index}"), ("present", None)):
                inner = _name("p/", pair, kind, tense)
                mapping[inner] = name or f"present_{kind}_self_{index}"
                (self_inputs if name else outputs).append(_renamed(_value(decoder, inner), mapping[inner]))
            name = f"past_{kind}_cross_{index}"
            if index == first[pair[0]]:
                inner = _name("p/", (pair[0], None), kind, "past_key_values")
                mapping[inner] = name
                cross_inputs.append(_renamed(_value(decoder, inner), name))
            else:  # unread: the layer's pair is stage 0's input
                cross_inputs.append(_renamed(cross_template, name))
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["p/input_ids"], to=int64),
        helper.make_node("Cast", ["encoder_attention_mask"], ["p/encoder_attention_mask"], to=int64),
        *_renaming(decoder.node, mapping),
    ]
    inputs = [
        _renamed(_value(decoder, "p/input_ids"), "input_ids", int32, ["batch", 1]),
        _renamed(_value(decoder, "p/encoder_attention_mask"), "encoder_attention_mask", int32),
        *self_inputs,
        *cross_inputs,
    ]
    return helper.make_graph(nodes, "decoder step", inputs, outputs, list(decoder.initializer))


def _share_initializers(first, second) -> list:
    """Move the initializers `first` and `second` both hold (equal type, shape and bytes) into a list for the main
    graph, under one name each, and point both graphs' nodes at it; returns that list."""
    from onnx import helper, numpy_helper

    def key(tensor) -> tuple:
        return (
            tensor.data_type,
            tuple(tensor.dims),
            hashlib.sha1(numpy_helper.to_array(tensor).tobytes()).digest(),
        )

    in_first = {key(t): t for t in first.initializer}
    shared, renames = {}, ({}, {})
    for tensor in list(second.initializer):
        found = in_first.get(key(tensor))
        if found is None:
            continue
        name = f"shared/{found.name}"
        if name not in shared:
            copy = type(found)()
            copy.CopyFrom(found)
            copy.name = name
            shared[name] = copy
        renames[0][found.name] = name
        renames[1][tensor.name] = name
    for graph, mapping in zip((first, second), renames):
        kept = [t for t in graph.initializer if t.name not in mapping]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        for node in graph.node:
            for index, name in enumerate(node.input):
                if name in mapping:
                    node.input[index] = mapping[name]
        for tensor in shared.values():  # the outer-scope values' types, which onnxruntime asks of a subgraph
            graph.value_info.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
    return list(shared.values())


def _padded_with(pad_token_id: int) -> list:
    """Nodes from the op's ``op/sequences`` (int32, each ended by `OP_PAD`, which no token has) to the graph's
    ``sequences`` (int64, padded with the model's pad id, which ``tokenizer.batch_decode`` takes: -1 it cannot) and
    ``sequence_lengths`` (each sequence's tokens before the padding, the start token counted: where it ends, even
    where the model wrote its pad token inside it)."""
    from onnx import TensorProto, helper

    int64 = TensorProto.INT64
    constants = {"op/op_pad": OP_PAD, "op/pad": pad_token_id}
    return [
        *(
            helper.make_node("Constant", [], [name], value=helper.make_tensor(name, int64, [], [value]))
            for name, value in constants.items()
        ),
        helper.make_node(
            "Constant", [], ["op/last_axis"], value=helper.make_tensor("axes", int64, [1], [-1])
        ),
        helper.make_node("Cast", ["op/sequences"], ["op/sequences64"], to=int64),
        helper.make_node("Equal", ["op/sequences64", "op/op_pad"], ["op/is_pad"]),
        helper.make_node("Where", ["op/is_pad", "op/pad", "op/sequences64"], ["sequences"]),
        helper.make_node("Not", ["op/is_pad"], ["op/is_token"]),
        helper.make_node("Cast", ["op/is_token"], ["op/tokens"], to=int64),
        helper.make_node("ReduceSum", ["op/tokens", "op/last_axis"], [SEQUENCE_LENGTHS], keepdims=0),
    ]


def build_search_graph(
    graphs: str | Path,
    out: str | Path,
    decoder_start_token_id: int,
    eos_token_id: int,
    pad_token_id: int,
    early_stopping: bool = False,
    no_repeat_ngram_size: int = 0,
    files: dict[str, str] | None = None,
) -> Path:
    """Write the search graph of the three graphs in folder `graphs` to `out`.

    Args:
        graphs: the folder of `encoder_model.onnx`, `decoder_model.onnx`, `decoder_with_past_model.onnx` (or their
            int8 `*_quantized.onnx`, named in `files`).
        out: the file to write.
        decoder_start_token_id, eos_token_id: the token ids (the op's attributes; it pads with `OP_PAD`).
        pad_token_id: what the graph's ``sequences`` are padded with (int64, as ``generate`` returns them); each
            one's length is the graph's ``sequence_lengths``.
        early_stopping, no_repeat_ngram_size: the op's attributes; `ONNXSearchGenerator` changes them per session.
        files: the file of each graph by its float32 name (default: the float32 files).
    Returns: `out`.
    """
    import onnx
    from onnx import TensorProto, helper

    files = files or {name: name for name in GRAPHS}
    graphs = Path(graphs)
    models = [_prefixed(graphs / files[name], prefix) for name, prefix in zip(GRAPHS, ("e/", "d/", "p/"))]
    encoder, decoder, with_past = (model.graph for model in models)
    slots = _slots(with_past)
    encoder_graph = _encoder_subgraph(encoder, decoder, slots)
    decoder_graph = _decoder_subgraph(with_past, slots)
    shared = _share_initializers(encoder_graph, decoder_graph)
    int64, int32, float32 = TensorProto.INT64, TensorProto.INT32, TensorProto.FLOAT
    scalars = {"length_penalty": float32, "repetition_penalty": float32}
    inputs = [
        helper.make_tensor_value_info("input_ids", int64, ["batch_size", "sequence_length"]),
        *[helper.make_tensor_value_info(name, scalars.get(name, int32), [1]) for name in SEARCH_INPUTS],
        helper.make_tensor_value_info("attention_mask", int64, ["batch_size", "sequence_length"]),
    ]
    node = helper.make_node(
        "BeamSearch",
        ["op/input_ids", *SEARCH_INPUTS, "", "", "op/attention_mask"],
        ["op/sequences", "sequences_scores"],
        name="BeamSearch",
        domain=MS_DOMAIN,
        eos_token_id=eos_token_id,
        pad_token_id=OP_PAD,
        decoder_start_token_id=decoder_start_token_id,
        no_repeat_ngram_size=no_repeat_ngram_size,
        early_stopping=int(early_stopping),
        model_type=1,
        encoder=encoder_graph,
        decoder=decoder_graph,
    )
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["op/input_ids"], to=int32),  # the op takes int32 ids
        helper.make_node("Cast", ["attention_mask"], ["op/attention_mask"], to=int32),
        node,
        *_padded_with(pad_token_id),
    ]
    sequences_shape = ["batch_size", "num_return_sequences", "max_length"]
    outputs = [
        helper.make_tensor_value_info("sequences", int64, sequences_shape),
        helper.make_tensor_value_info("sequences_scores", float32, ["batch_size", "num_return_sequences"]),
        helper.make_tensor_value_info(SEQUENCE_LENGTHS, int64, ["batch_size", "num_return_sequences"]),
    ]
    graph = helper.make_graph(nodes, "beam search", inputs, outputs, shared)
    model = helper.make_model(graph, producer_name="ode-transformer", opset_imports=_opsets(models))
    out = Path(out)
    onnx.save(model, str(out))
    return out


def write_search_graph(model, folder: Path, quantize: str | None = None) -> Path:
    """Build the search graph of the three graphs `export_onnx` wrote into `folder` (float32, or int8 with
    `quantize`), with `model`'s token ids and early stopping (the exported generation config's)."""
    names = [quantized_name(name) for name in GRAPHS] if quantize else list(GRAPHS)
    generation, config = model.generation_config, model.config
    start = generation.decoder_start_token_id
    eos = generation.eos_token_id if generation.eos_token_id is not None else config.eos_token_id
    return build_search_graph(
        folder,
        folder / search_graph_file(quantize),
        config.decoder_start_token_id if start is None else start,
        int(eos[0] if isinstance(eos, (list, tuple)) else eos),
        _pad_id(generation, config),
        early_stopping=True,
        files=dict(zip(GRAPHS, names)),
    )


def _pad_id(generation, config) -> int:
    """The pad id the search graph pads with: the generation config's, else the model config's."""
    pad = generation.pad_token_id if generation.pad_token_id is not None else config.pad_token_id
    return int(pad[0] if isinstance(pad, (list, tuple)) else pad)
