"""Decoding the ONNX graphs that `ode_transformer.hub.onnx_export` writes, with onnxruntime, driven by transformers' own
`generate`; the graphs' file names and their cache tensors' names (`parse_cache_name`), which the exporter writes,
are defined here.

`ORTModelForODESeq2SeqLM` is a `PreTrainedModel` with `GenerationMixin` whose encoder and forward run the three
onnxruntime sessions instead of PyTorch modules, as 🤗 Optimum's `ORTModelForSeq2SeqLM` wraps its graphs: the
forward returns a `Seq2SeqLMOutput` whose cache is an `EncoderDecoderCache` holding the graphs' `present.*` tensors
(the self-attention slots per (layer, stage), then the cross-attention pair per layer, each found by its name in
the graphs' Optimum order, `cache_pairs`). So
greedy search, beam search, sampling, the logits processors and the stopping rules are transformers' code, not a copy
of it that would drift with each release; beam search reorders the cache through the cache object's own
`reorder_cache`.

`ONNXSeq2SeqGenerator` keeps the folder-level entry point: it opens the graphs (of `export_onnx`, or the `onnx/`
folder of `ode-export --onnx`), reads the decoding defaults beside them, and takes and returns numpy arrays.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import GenerationConfig, GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from modeling_ode.compat import CACHE_FIELD, CACHE_KWARGS

from .cli import install_command

__all__ = [
    "DECODER",
    "DECODER_WITH_PAST",
    "ENCODER",
    "GRAPHS",
    "QUANTIZED_GRAPHS",
    "RUNTIME_PACKAGES",
    "ONNXSeq2SeqGenerator",
    "ORTModelForODESeq2SeqLM",
    "graphs_folder",
    "open_sessions",
    "pair_name",
    "parse_cache_name",
    "quantized_name",
    "require",
    "self_attention_name",
]

# The graphs' file names, the contract between the exporter (`ode_transformer.hub.onnx_export`) and this decoder.
ENCODER, DECODER, DECODER_WITH_PAST = (
    "encoder_model.onnx",
    "decoder_model.onnx",
    "decoder_with_past_model.onnx",
)
GRAPHS = (ENCODER, DECODER, DECODER_WITH_PAST)
QUANTIZED_SUFFIX = "_quantized"  # Optimum's ORTQuantizer: model.onnx -> model_quantized.onnx


def quantized_name(graph: str) -> str:
    """The file name of `graph`'s int8 version: `encoder_model.onnx` -> `encoder_model_quantized.onnx`."""
    stem, dot, suffix = graph.rpartition(".")
    return f"{stem}{QUANTIZED_SUFFIX}{dot}{suffix}"


QUANTIZED_GRAPHS = tuple(quantized_name(graph) for graph in GRAPHS)
RUNTIME_PACKAGES = ("onnxruntime",)

CachePair = tuple[int, "int | None"]
"""One (key, value) pair of the cache: (layer, stage) of a self-attention slot, or (layer, None) for the layer's
cross-attention."""


def self_attention_name(layer: int, stage: int) -> str:
    """The middle of a self-attention cache tensor's name: `{layer}.decoder` for stage 0 (Optimum's), and
    `{layer}.decoder_stage{stage}` for the later stages of an RK decoder."""
    return f"{layer}.decoder" if stage == 0 else f"{layer}.decoder_stage{stage}"


def pair_name(pair: CachePair) -> str:
    """The middle of a cache tensor's name: `{layer}.encoder` (cross-attention) or :func:`self_attention_name`."""
    layer, stage = pair
    return f"{layer}.encoder" if stage is None else self_attention_name(layer, stage)


def parse_cache_name(name: str) -> tuple[CachePair, str]:
    """(pair, "key" or "value") of a cache tensor's name: `present.1.decoder_stage2.value` -> ((1, 2), "value")."""
    _, layer, attention, kind = name.split(".")
    if attention == "encoder":
        return (int(layer), None), kind
    return (int(layer), int(attention.removeprefix("decoder").removeprefix("_stage") or 0)), kind


def require(packages: Sequence[str], purpose: str) -> None:
    """Refuse by name, before any work, when a package of the `onnx` extra is missing."""
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        raise ModuleNotFoundError(
            f"{purpose} needs the {', '.join(missing)} package{'s' if len(missing) > 1 else ''}: install the "
            f"[onnx] extra ({install_command('onnx')})",
            name=missing[0],
        )


# The token ids `generate` needs, taken from config.json where the generation config lacks them.
_TOKEN_FIELDS = ("decoder_start_token_id", "eos_token_id", "pad_token_id")


def _complete(folder: Path, names: Sequence[str]) -> bool:
    return all((folder / name).is_file() for name in names)


def graphs_folder(folder: str | Path) -> Path:
    """The folder holding the three graphs (float32, or int8 `*_quantized.onnx`): `folder` itself, or its `onnx/`
    (where `ode-export --onnx` writes)."""
    folder = Path(folder)
    inner = folder / "onnx"
    graphs = inner if any(_complete(inner, names) for names in (GRAPHS, QUANTIZED_GRAPHS)) else folder
    if not any(_complete(graphs, names) for names in (GRAPHS, QUANTIZED_GRAPHS)):
        missing = [name for name in GRAPHS if not (graphs / name).is_file()]
        raise FileNotFoundError(
            f"{graphs} lacks the ONNX graphs {missing} (or their int8 {list(QUANTIZED_GRAPHS)}); write them with "
            "`ode-export MODEL OUT --onnx` (into OUT/onnx) or `ode_transformer.hub.onnx_export.export_onnx(model, folder)`."
        )
    return graphs


def graph_files(graphs: Path) -> dict[str, str]:
    """The file of each graph, by its float32 name: the float32 graphs where the folder has all three, else the int8
    ones (`*_quantized.onnx`)."""
    return dict(zip(GRAPHS, GRAPHS if _complete(graphs, GRAPHS) else QUANTIZED_GRAPHS))


def open_sessions(graphs: Path, providers: Sequence[str] | None = None, session_options: Any = None) -> dict:
    """An onnxruntime session per graph, by its float32 file name (`GRAPHS`), whichever file `graph_files` picks."""
    require(RUNTIME_PACKAGES, "decoding with onnxruntime")
    import onnxruntime

    providers = list(providers or ["CPUExecutionProvider"])
    return {
        name: onnxruntime.InferenceSession(str(graphs / file), session_options, providers=providers)
        for name, file in graph_files(graphs).items()
    }


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().contiguous().numpy()


class _ORTEncoder(nn.Module):
    """`get_encoder()` for `generate`: the encoder graph, returning a `BaseModelOutput`."""

    main_input_name = "input_ids"

    def __init__(self, session):
        super().__init__()
        self.session = session

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        feed = {"input_ids": _numpy(input_ids.long()), "attention_mask": _numpy(attention_mask.long())}
        (hidden,) = self.session.run(None, feed)
        return BaseModelOutput(last_hidden_state=torch.from_numpy(hidden))


class ORTModelForODESeq2SeqLM(PreTrainedModel, GenerationMixin):
    """The exported encoder-decoder as a model that transformers' `generate` drives (CPU tensors in and out).

    Args:
        sessions: the onnxruntime session of each graph, by file name (`open_sessions`).
        generation_config: the decoding defaults and token ids, as `model.generation_config`.
    """

    config_class = PreTrainedConfig
    main_input_name = "input_ids"

    def __init__(self, sessions: dict, generation_config: GenerationConfig):
        self_pairs = _pairs(sessions[DECODER_WITH_PAST].get_outputs())
        first_pairs = _pairs(sessions[DECODER].get_outputs())
        # `generate` sizes the empty cache it passes to the first step by `num_hidden_layers`: one layer per
        # self-attention slot, as the graphs' cache has
        super().__init__(PreTrainedConfig(is_encoder_decoder=True, num_hidden_layers=len(self_pairs)))
        self.sessions = sessions
        self.encoder = _ORTEncoder(sessions[ENCODER])
        # the Python cache: the self-attention slots in the order of decoder_with_past's outputs, then the
        # cross-attention layers in decoder_model's order; each graph tensor's (part, layer index) in it
        cross_pairs = [pair for pair in first_pairs if pair[1] is None]
        where = {pair: (0, i) for i, pair in enumerate(self_pairs)} | {
            pair: (1, i) for i, pair in enumerate(cross_pairs)
        }
        self.first_targets = [where[pair] for pair in first_pairs]
        inputs = sessions[DECODER_WITH_PAST].get_inputs()[2:]
        self.past_names = [i.name for i in inputs]
        self.past_sources = [
            (*where[pair], f"{kind}s") for pair, kind in map(parse_cache_name, self.past_names)
        ]
        self.num_self = 2 * len(self_pairs)
        self.generation_config = generation_config

    # No parameters: the weights live in the graphs, and the tensors `generate` handles stay on the CPU.
    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def get_encoder(self, *args, **kwargs) -> nn.Module:
        return self.encoder

    def forward(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_outputs: BaseModelOutput | tuple,
        attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        """One decoder step: `decoder_model.onnx` while the cache is empty (it builds the cache: a slot per
        (layer, stage), then the cross-attention layers), `decoder_with_past_model.onnx` on the newest tokens after
        (it grows the self-attention slots in place)."""
        hidden = encoder_outputs[0]
        if attention_mask is None:
            attention_mask = torch.ones(hidden.shape[:2], dtype=torch.long)
        mask = _numpy(attention_mask.long())
        tokens = _numpy(decoder_input_ids.long())
        cache = next((kwargs[key] for key in CACHE_KWARGS if kwargs.get(key) is not None), None)
        if cache is None or cache.get_seq_length() == 0:
            feed = {
                "input_ids": tokens,
                "encoder_attention_mask": mask,
                "encoder_hidden_states": _numpy(hidden),
            }
            logits, *present = self.sessions[DECODER].run(None, feed)
            slots, layers = self.num_self // 2, (len(present) - self.num_self) // 2
            cache = EncoderDecoderCache(
                Cache(layers=[_PresentLayer() for _ in range(slots)]),
                Cache(layers=[_EncoderLayer() for _ in range(layers)]),
            )
            targets = self.first_targets
        else:
            parts = (cache.self_attention_cache.layers, cache.cross_attention_cache.layers)
            # No IO binding: on the CPU `session.run` reads these numpy views of the cache in place and returns
            # arrays over onnxruntime's own buffers (which `torch.from_numpy` shares), so no step copies the cache
            # outside the graph but beam search's reordering of the self-attention slots. Binding preallocated
            # buffers (`io_binding`) gains nothing here (docs/performance.md).
            feed = {
                "input_ids": tokens,
                "encoder_attention_mask": mask,
                **{
                    name: _numpy(getattr(parts[part][index], field))
                    for name, (part, index, field) in zip(self.past_names, self.past_sources)
                },
            }
            logits, *present = self.sessions[DECODER_WITH_PAST].run(None, feed)
            targets = [(0, i) for i in range(self.num_self // 2)]
        parts = (cache.self_attention_cache.layers, cache.cross_attention_cache.layers)
        present = [torch.from_numpy(tensor) for tensor in present]
        for (part, index), key, value in zip(targets, present[::2], present[1::2]):
            parts[part][index].update(key, value)
        return Seq2SeqLMOutput(logits=torch.from_numpy(logits), **{CACHE_FIELD: cache})


def _pairs(outputs: Sequence[Any]) -> list:
    """The cache pairs of a decoder graph's outputs (after the logits), in the graph's order."""
    return [parse_cache_name(output.name)[0] for output in outputs[1::2]]


class _PresentLayer(DynamicLayer):
    """A self-attention slot holding the graph's `present` pair as it is: the graph has already appended the step's
    keys and values to the past it was given, so `update` replaces them rather than concatenating, which would copy
    the whole cache at every step."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = key_states, value_states
        return self.keys, self.values


class _EncoderLayer(_PresentLayer):
    """A cross-attention layer: the encoder's keys and values, the same for every beam of a sentence. Beam search
    only reorders the beams within each sentence, so reordering these would copy them for nothing."""

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        return None


def _read_json(folders: Sequence[Path], name: str) -> dict[str, Any]:
    for folder in folders:
        if (folder / name).is_file():
            return json.loads((folder / name).read_text(encoding="utf-8"))
    return {}


def load_generation_config(given: Any, folders: Sequence[Path]) -> GenerationConfig:
    """`given` (a `GenerationConfig` or a dict) or the `generation_config.json` in `folders`, its missing token ids
    from `config.json` there. The graphs carry their own cache, so transformers' cache kinds (a static cache for
    compiling the PyTorch model) do not apply and are dropped."""
    if given is None:
        given = _read_json(folders, "generation_config.json")
    elif hasattr(given, "to_dict"):
        given = given.to_dict()
    given = {k: v for k, v in given.items() if v is not None and k != "transformers_version"}
    model_config = _read_json(folders, "config.json")
    for name in _TOKEN_FIELDS:
        if given.get(name) is None and model_config.get(name) is not None:
            given[name] = model_config[name]
    if given.get("decoder_start_token_id") is None:
        raise ValueError(
            "no `decoder_start_token_id` in the generation config or config.json; pass generation_config="
            "model.generation_config (or a dict with it)."
        )
    given.pop("cache_implementation", None)
    return GenerationConfig(**given)


class ONNXSeq2SeqGenerator:
    """Decoding of the graphs `export_onnx` writes, with onnxruntime and transformers' `generate`
    (`ORTModelForODESeq2SeqLM`): every decoding option of `model.generate`, and its tokens, up to float rounding
    between runtimes.

    Args:
        folder: the folder of the graphs, or the folder of `ode-export --onnx` (the graphs in its `onnx/`): the
            float32 graphs where the folder has them, else the int8 ones (`encoder_model_quantized.onnx`, ...).
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
        graphs = graphs_folder(folder)
        # an `onnx/` folder is ode-export's: the configs are in the export folder above it
        configs = [graphs, graphs.parent] if graphs.name == "onnx" else [graphs]
        config = load_generation_config(generation_config, configs)
        self.sessions = open_sessions(graphs, providers, session_options)
        self.model = ORTModelForODESeq2SeqLM(self.sessions, config)

    @property
    def generation_config(self) -> GenerationConfig:
        return self.model.generation_config

    def generate(self, input_ids: Any, attention_mask: Any = None, **kwargs) -> np.ndarray:
        """The generated ids (batch, length), the decoder start token first, as `model.generate` returns them;
        `kwargs` are `generate`'s (max_new_tokens, num_beams, length_penalty, ...), the rest from the generation
        config."""
        input_ids = torch.as_tensor(np.asarray(input_ids, dtype=np.int64))
        if attention_mask is not None:
            attention_mask = torch.as_tensor(np.asarray(attention_mask, dtype=np.int64))
        with torch.inference_mode():
            return self.model.generate(input_ids, attention_mask=attention_mask, **kwargs).numpy()
