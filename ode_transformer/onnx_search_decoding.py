"""Decoding with the search graph that `ode_transformer.hub.onnx_search_graph` builds (`beam_search_model.onnx`):
onnxruntime's `BeamSearch` contrib op over the exported graphs, the whole search in one `session.run` per batch.

The graph's file name (`SEARCH_GRAPH`, `search_graph_file`), the options it takes (`SEARCH_OPTIONS`) and the pad it
writes (`OP_PAD`) are the contract between the builder and this decoder, defined here. `ONNXSearchGenerator` takes
`generate`'s keywords for those options and refuses the others by name; `ORTSearchModel` is the model
`ode_transformer.translate` drives, which hands a call the graph cannot follow to transformers' `generate` over
the same folder's graphs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from modeling_ode.weights_integrity import WEIGHTS_DIGEST

from .onnx_generation import (
    RUNTIME_PACKAGES,
    ONNXSeq2SeqGenerator,
    load_generation_config,
    quantized_name,
    require,
)

__all__ = [
    "OP_PAD",
    "SEARCH_ATTRIBUTES",
    "SEARCH_GRAPH",
    "SEARCH_INPUTS",
    "SEARCH_OPTIONS",
    "SEQUENCE_LENGTHS",
    "ONNXSearchGenerator",
    "ORTSearchModel",
    "search_graph_file",
    "search_graph_path",
    "unsupported_settings",
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
# The op pads its sequences with its `pad_token_id` attribute and returns no lengths: a sequence's end is its first
# pad. The op pads with -1, which no token has, so that a model emitting its pad token inside a sentence (as a
# minimum length may make it) keeps it, as `generate` does. The graph's own `sequences` are int64 and padded with
# the model's pad id (what `tokenizer.batch_decode` takes), and `SEQUENCE_LENGTHS` says where each one ends.
OP_PAD = -1
SEQUENCE_LENGTHS = "sequence_lengths"
"""The search graph's output of each sequence's length (the start token counted, the padding not)."""


def search_graph_file(quantize: str | None) -> str:
    """`beam_search_model.onnx`, or its int8 version's name (`beam_search_model_quantized.onnx`)."""
    return quantized_name(SEARCH_GRAPH) if quantize else SEARCH_GRAPH


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
# sampling's and assisted decoding's settings (inert without do_sample or an assistant model), and what a saved
# generation config records besides settings
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
    # not a setting: the digest of the weights an export records (`ode-export`), checked when it loads
    WEIGHTS_DIGEST,
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

            node = next(node for node in self.proto.graph.node if node.op_type == "BeamSearch")
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
        ids_type = self.input_type("input_ids")
        feed = {
            "input_ids": ids.astype(ids_type),
            "attention_mask": mask.astype(ids_type),
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
        # a graph of an earlier export: the op's own sequences
        if SEQUENCE_LENGTHS not in self.output_names():
            return session.run(["sequences"], feed)[0]
        sequences, ends = session.run(["sequences", SEQUENCE_LENGTHS], feed)
        return np.where(np.arange(sequences.shape[-1]) < ends[..., None], sequences, OP_PAD)

    def input_type(self, name: str) -> type:
        """The numpy type of the graph's input `name`: int64 (int32 in a graph of an earlier export)."""
        from onnx import helper

        graph_input = next(value for value in self.proto.graph.input if value.name == name)
        return helper.tensor_dtype_to_np_dtype(graph_input.type.tensor_type.elem_type).type

    def output_names(self) -> list[str]:
        return [value.name for value in self.proto.graph.output]

    def exact(self):
        """`ONNXSeq2SeqGenerator` over the same folder's graphs (transformers' `generate`), for the sentences the
        op would rank otherwise."""
        if self._exact is None:
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
        "--onnx` (into OUT/onnx) or `ode_transformer.hub.onnx_search_graph.build_search_graph`."
    )


class ORTSearchModel:
    """The search graph as the model `ode_transformer.translate.generate_ids` drives: `generate` takes and
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
