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
`session.run` per batch), with the options `SEARCH_OPTIONS` lists; `ONNXSearchGenerator` takes
`generate`'s keywords for them and refuses the others by name.

The weights the two subgraphs share (the decoder's, in `decoder_model` and `decoder_with_past_model`) are stored
once, in the main graph, which the subgraphs read from the outer scope.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .onnx_export import (
    GRAPHS,
    RUNTIME_PACKAGES,
    CachePair,
    pair_name,
    parse_cache_name,
    quantized_name,
    require,
)

__all__ = [
    "SEARCH_GRAPH",
    "SEARCH_OPTIONS",
    "ONNXSearchGenerator",
    "ORTSearchModel",
    "build_search_graph",
    "search_graph_file",
    "search_graph_path",
    "unsupported_settings",
    "write_search_graph",
]

SEARCH_GRAPH = "beam_search_model.onnx"
# generate()'s keywords the graph takes: as its inputs (per call) or as the op's attributes (fixed in a session:
# `ONNXSearchGenerator` opens one session per value asked).
SEARCH_INPUTS = (
    "max_length",
    "min_length",
    "num_beams",
    "num_return_sequences",
    "length_penalty",
    "repetition_penalty",
)
SEARCH_ATTRIBUTES = ("early_stopping", "no_repeat_ngram_size", "eos_token_id")
SEARCH_OPTIONS = (*SEARCH_INPUTS, *SEARCH_ATTRIBUTES, "max_new_tokens", "min_new_tokens")
MS_DOMAIN = "com.microsoft"
# The op pads its sequences with its `pad_token_id` attribute and returns no lengths: a sequence's end is its first
# pad. The graph pads with -1, which no token has, so that a model emitting its pad token inside a sentence (as a
# minimum length may make it) keeps it, as `generate` does.
OP_PAD = -1


def search_graph_file(quantize: str | None) -> str:
    """`beam_search_model.onnx`, or its int8 version's name (`beam_search_model_quantized.onnx`)."""
    return quantized_name(SEARCH_GRAPH) if quantize else SEARCH_GRAPH


# ----------------------------------------------------------------------------------------------------------
# Building the graph
# ----------------------------------------------------------------------------------------------------------


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


def build_search_graph(
    graphs: str | Path,
    out: str | Path,
    decoder_start_token_id: int,
    eos_token_id: int,
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
    int32, float32 = TensorProto.INT32, TensorProto.FLOAT
    scalars = {"length_penalty": float32, "repetition_penalty": float32}
    inputs = [
        helper.make_tensor_value_info("input_ids", int32, ["batch_size", "sequence_length"]),
        *[helper.make_tensor_value_info(name, scalars.get(name, int32), [1]) for name in SEARCH_INPUTS],
        helper.make_tensor_value_info("attention_mask", int32, ["batch_size", "sequence_length"]),
    ]
    node = helper.make_node(
        "BeamSearch",
        ["input_ids", *SEARCH_INPUTS, "", "", "attention_mask"],
        ["sequences", "sequences_scores"],
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
    outputs = [
        helper.make_tensor_value_info(
            "sequences", int32, ["batch_size", "num_return_sequences", "max_length"]
        ),
        helper.make_tensor_value_info("sequences_scores", float32, ["batch_size", "num_return_sequences"]),
    ]
    graph = helper.make_graph([node], "beam search", inputs, outputs, shared)
    model = helper.make_model(graph, producer_name="ode-transformer", opset_imports=_opsets(models))
    out = Path(out)
    onnx.save(model, str(out))
    return out


# ----------------------------------------------------------------------------------------------------------
# Decoding with it
# ----------------------------------------------------------------------------------------------------------

# transformers' values for the settings the graph takes, where neither the model nor the call sets them (the
# defaults `generate` fills in; checked: transformers 5.23.0, 5.24.0)
GENERATE_DEFAULTS = {
    "max_length": 20,
    "min_length": 0,
    "num_beams": 1,
    "num_return_sequences": 1,
    "early_stopping": False,
    "length_penalty": 1.0,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
}
# generate()'s settings the graph follows as transformers does, and those that change nothing at these values; any
# other setting given is refused by name (`unsupported_settings`)
_FOLLOWED = {
    *SEARCH_OPTIONS,
    "decoder_start_token_id",
    "pad_token_id",
    "bos_token_id",
    "cache_implementation",
}
_NEUTRAL = {
    "do_sample": False,
    "use_cache": True,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "encoder_repetition_penalty": 1.0,
    "encoder_no_repeat_ngram_size": 0,
    "output_attentions": False,
    "output_hidden_states": False,
    "output_scores": False,
    "output_logits": False,
    "return_dict_in_generate": False,
    "remove_invalid_values": False,
    "renormalize_logits": False,
}
# sampling's and assisted decoding's settings: inert without do_sample or an assistant model
_INERT = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "top_h",
    "typical_p",
    "epsilon_cutoff",
    "eta_cutoff",
    "num_assistant_tokens",
    "num_assistant_tokens_schedule",
    "assistant_confidence_threshold",
    "max_matching_ngram_size",
    "transformers_version",
)


def option(config, name: str):
    """Setting `name` of GenerationConfig `config`, or transformers' default where it is unset."""
    value = getattr(config, name, None)
    return GENERATE_DEFAULTS.get(name) if value is None else value


def unsupported_settings(config) -> list[str]:
    """The settings of GenerationConfig `config` that the search graph cannot follow as `generate` does."""
    found = [
        name
        for name, value in config.to_dict().items()
        if not name.startswith("_")
        and name not in (*_FOLLOWED, *_INERT)
        and value is not None
        and value is not False
        and (name not in _NEUTRAL or value != _NEUTRAL[name])
    ]
    if option(config, "early_stopping") not in (True, False):
        found.append(f"early_stopping={config.early_stopping!r}")
    if config.forced_eos_token_id not in (None, config.eos_token_id):
        found.append("forced_eos_token_id")
    if isinstance(config.eos_token_id, (list, tuple)) and len(set(config.eos_token_id)) > 1:
        found.append("several eos_token_id")
    if option(config, "num_beams") > 1 and option(config, "early_stopping") is False:
        # onnxruntime's test of whether a running beam can still win counts the start token, transformers' not
        found.append("early_stopping=False with beam search")
    if option(config, "num_beams") == 1 and option(config, "repetition_penalty") != 1.0:
        # greedy search applies it to the logits, onnxruntime's search to the log-probabilities
        found.append("repetition_penalty with greedy search")
    return found


def _one(value) -> int:
    return int(value[0] if isinstance(value, (list, tuple)) else value)


class ONNXSearchGenerator:
    """Decoding with the search graph (`SEARCH_GRAPH`): one `session.run` per batch, the search in onnxruntime's
    C++. Takes `generate`'s keywords for the settings in `SEARCH_OPTIONS` and returns `generate`'s tokens (the
    decoder start token first, each sequence ended by eos unless cut at max_length, then padded). What it takes
    from onnxruntime 1.32's op, and how it keeps `generate`'s tokens:

    - greedy search runs as one beam with early stopping, which is greedy search: `GreedySearch` takes decoder-only
      models only (`model_type` 0);
    - the op's sequences stop before eos and are padded (with `OP_PAD`); eos is put back;
    - the op scores a hypothesis cut at max_length by its length with the start token, transformers without (a
      finished one alike in both): with beams and a positive length penalty, a sentence whose returned hypotheses
      include a cut one is decoded again by `ONNXSeq2SeqGenerator` (the same folder's graphs under transformers'
      `generate`), and with a negative one the whole call is (a minimum length of max_length leaves no finished
      hypothesis to rank against, and nothing to decode again); with early stopping (the exported generation
      config's) nothing else differs;
    - early_stopping=False with beams is refused: the op's test of whether a running beam can still win counts
      the start token too, and stops elsewhere; so are sampling, several eos ids, and every other setting
      `unsupported_settings` names.

    Args:
        folder: the search graph's file, its folder, or the folder of `ode-export --onnx` (the graph in its
            `onnx/`): the float32 graph where there is one, else the int8 one.
        generation_config: the decoding defaults and token ids, as `ONNXSeq2SeqGenerator` takes them.
        session_options: an `onnxruntime.SessionOptions` (e.g. `intra_op_num_threads`).
    """

    def __init__(self, folder: str | Path, generation_config: Any = None, session_options: Any = None):
        require(RUNTIME_PACKAGES, "decoding with onnxruntime")
        import onnx

        from .onnx_generation import load_generation_config

        self.path = search_graph_path(folder)
        configs = (
            [self.path.parent, self.path.parent.parent]
            if self.path.parent.name == "onnx"
            else [self.path.parent]
        )
        self.generation_config = load_generation_config(generation_config, configs)
        self.proto = onnx.load(str(self.path))
        self.session_options = session_options
        self.sessions: dict[tuple, Any] = {}
        self._exact = None
        self.redone = 0  # the sentences of the last call decoded again by transformers' search

    def session(self, early_stopping: bool, no_repeat_ngram_size: int, eos_token_id: int):
        """The session whose op has these attributes (built once per set, from the graph in memory)."""
        key = (bool(early_stopping), int(no_repeat_ngram_size), int(eos_token_id))
        if key not in self.sessions:
            import onnxruntime
            from onnx import helper

            node = self.proto.graph.node[0]
            names = ("early_stopping", "no_repeat_ngram_size", "eos_token_id", "pad_token_id")
            values = dict(zip(names, (*map(int, key), OP_PAD)))
            kept = [a for a in node.attribute if a.name not in values]
            del node.attribute[:]
            node.attribute.extend([*kept, *(helper.make_attribute(n, v) for n, v in values.items())])
            self.sessions[key] = onnxruntime.InferenceSession(
                self.proto.SerializeToString(), self.session_options, providers=["CPUExecutionProvider"]
            )
        return self.sessions[key]

    def settings(self, **kwargs):
        """The GenerationConfig of a call (the defaults updated by `kwargs`), refused by name where the graph
        cannot follow it."""
        config = copy_config(self.generation_config, kwargs)
        unsupported = unsupported_settings(config)
        if unsupported:
            raise ValueError(
                f"the ONNX search graph cannot follow {', '.join(unsupported)} as generate() does: leave "
                f"{'it' if len(unsupported) == 1 else 'them'} out, or decode with ONNXSeq2SeqGenerator (the "
                "graphs under transformers' generate) or the PyTorch model"
            )
        return config

    def generate(self, input_ids: Any, attention_mask: Any = None, **kwargs) -> np.ndarray:
        """The generated ids (batch x num_return_sequences, length), as `model.generate` returns them."""
        config = self.settings(**kwargs)
        ids = np.asarray(input_ids, dtype=np.int64)
        mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, dtype=np.int64)
        beams, penalty = option(config, "num_beams"), option(config, "length_penalty")
        if beams > 1 and penalty < 0:  # see the class's docstring
            self.redone = len(ids)
            return self.exact().generate(ids, mask, **kwargs)
        sequences = self.search(ids, mask, config)
        eos, pad = _one(config.eos_token_id), _one(config.pad_token_id)
        rows = list(with_eos(sequences.reshape(-1, sequences.shape[-1]), eos, pad))
        cut = (sequences[:, :, -1] != OP_PAD).any(axis=1)  # a sentence with a hypothesis cut at max_length
        # ranked otherwise only against finished ones, which a minimum length of max_length rules out
        max_length, min_length = lengths(config)
        self.redone = int(cut.sum()) if beams > 1 and penalty > 0 and min_length < max_length else 0
        if self.redone:
            returns = sequences.shape[1]
            exact = iter(self.exact().generate(ids[cut], mask[cut], **kwargs))
            for sentence in np.flatnonzero(cut):
                rows[sentence * returns : (sentence + 1) * returns] = [next(exact) for _ in range(returns)]
        width = max(len(row) for row in rows)
        return np.stack([np.pad(row, (0, width - len(row)), constant_values=pad) for row in rows])

    def search(self, ids: np.ndarray, mask: np.ndarray, config) -> np.ndarray:
        """The op's sequences (batch, num_return_sequences, max_length) for GenerationConfig `config`."""
        max_length, min_length = lengths(config)
        beams = option(config, "num_beams")
        feed = {
            "input_ids": ids.astype(np.int32),
            "attention_mask": mask.astype(np.int32),
            "max_length": np.array([max_length], np.int32),
            "min_length": np.array([min_length], np.int32),
            "num_beams": np.array([beams], np.int32),
            "num_return_sequences": np.array([option(config, "num_return_sequences")], np.int32),
            "length_penalty": np.array([option(config, "length_penalty")], np.float32),
            "repetition_penalty": np.array([option(config, "repetition_penalty")], np.float32),
        }
        early_stopping = True if beams == 1 else option(config, "early_stopping")
        session = self.session(
            early_stopping, option(config, "no_repeat_ngram_size"), _one(config.eos_token_id)
        )
        return session.run(["sequences"], feed)[0]

    def exact(self):
        """`ONNXSeq2SeqGenerator` over the same folder's graphs (transformers' `generate`), for the sentences the
        op would rank otherwise."""
        if self._exact is None:
            from .onnx_generation import ONNXSeq2SeqGenerator

            self._exact = ONNXSeq2SeqGenerator(
                self.path.parent, self.generation_config, session_options=self.session_options
            )
        return self._exact


def lengths(config) -> tuple[int, int]:
    """(max_length, min_length) of GenerationConfig `config` as the op counts them, the decoder start token
    included (as transformers counts an encoder-decoder's): max_new_tokens and min_new_tokens first."""
    max_length = 1 + config.max_new_tokens if config.max_new_tokens else option(config, "max_length")
    min_length = 1 + config.min_new_tokens if config.min_new_tokens else option(config, "min_length")
    return max_length, min_length


def with_eos(sequences: np.ndarray, eos: int, pad: int) -> np.ndarray:
    """The op's sequences (the start token, the tokens before eos, `OP_PAD` to max_length) as `generate`'s: eos
    after every sequence that ended before max_length, then `pad`, and as many columns as the longest."""
    rows, max_length = sequences.shape
    padded = sequences[:, 1:] == OP_PAD
    lengths = np.where(padded.any(axis=1), padded.argmax(axis=1) + 1, max_length)
    out = np.full((rows, max_length), pad, dtype=np.int64)
    for row, length in enumerate(lengths):
        out[row, :length] = sequences[row, :length]
        if length < max_length:
            out[row, length] = eos
    return out[:, : int(min(max_length, (lengths + (lengths < max_length)).max()))]


def copy_config(config, updates: dict):
    """A copy of GenerationConfig `config` with `updates` (generate()'s keywords) applied."""
    import copy

    config = copy.deepcopy(config)
    unused = config.update(**updates)
    if unused:
        raise ValueError(f"not generation settings: {sorted(unused)}")
    return config


def search_graph_path(folder: str | Path) -> Path:
    """The search graph `folder` names, or the one in `folder` or its `onnx/`: float32 where there is one, else
    int8."""
    folder = Path(folder)
    if folder.is_file():
        return folder
    for place in (folder / "onnx", folder):
        for name in (SEARCH_GRAPH, quantized_name(SEARCH_GRAPH)):
            if (place / name).is_file():
                return place / name
    raise FileNotFoundError(
        f"{folder} has no {SEARCH_GRAPH} (or {quantized_name(SEARCH_GRAPH)}); write it with `ode-export MODEL OUT "
        "--onnx` (into OUT/onnx) or `ode_transformer.hub.onnx_search.build_search_graph`."
    )


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
        _one(eos),
        early_stopping=True,
        files=dict(zip(GRAPHS, names)),
    )


class ORTSearchModel:
    """The search graph as the model `ode_transformer.train.translate.generate_ids` drives: `generate` takes and
    returns torch tensors, and `generate`'s keywords. A call whose settings the graph cannot follow
    (`unsupported_settings`) goes to the same folder's graphs under transformers' `generate`
    (`ORTModelForODESeq2SeqLM`), so every option of `ode-translate --backend onnx` keeps working."""

    def __init__(self, search: ONNXSearchGenerator):
        import torch

        self.search = search
        self.loop = search.exact().model
        self.loop.generation_config = search.generation_config  # one set of decoding defaults for both
        self.config = self.loop.config
        self.device = torch.device("cpu")

    @property
    def generation_config(self):
        return self.search.generation_config

    def eval(self) -> ORTSearchModel:
        return self

    def generate(self, input_ids, attention_mask=None, **kwargs):
        import torch

        if unsupported_settings(copy_config(self.generation_config, kwargs)):
            return self.loop.generate(input_ids, attention_mask=attention_mask, **kwargs)
        mask = None if attention_mask is None else attention_mask.numpy()
        return torch.from_numpy(self.search.generate(input_ids.numpy(), mask, **kwargs))
