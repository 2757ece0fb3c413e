"""Translate (summarise, correct, continue) text with a trained model folder, one line per input line.

    python -m ode_transformer.translate MODEL --input src.txt --output hyp.txt --num_beams 4
    cat src.txt | python -m ode_transformer.translate MODEL > hyp.txt

``MODEL`` is a folder written by ``ode_transformer.train.run`` / ``save_pretrained`` (or a Hub id). Decoding defaults come
from the folder's ``generation_config.json`` (the run's beam size, length penalty and output length);
flags override them. Inputs are batched by length (longest first) and written back in input order. A causal
LM continues each line as a prompt and writes the continuation only; its prompts are padded on the left, which
changes no output (positions come from the attention mask).

This is the decoder ``ode_transformer.train.run`` scores its test split with: fp32 by default, and then the hypotheses are
the ones plain ``model.generate`` gives, whatever the batching. ``--bf16`` runs the model under bf16
autocast (faster on recent CPUs and GPUs; hypotheses may differ, so state the precision with a score).
``--quantize int8`` runs the Linear layers in dynamic int8 on a CPU (``modeling_ode.quantization``): faster than
float32 (``benchmarks.bench_translate``, docs/performance.md); hypotheses may differ slightly from float32's. ``--compile`` decodes
with a static cache and each decoding step compiled (:func:`compile_decoding`): less Python per token, after
seconds to a minute of compiling per new batch shape, so it pays for many sentences in small batches.

``--backend`` picks who decodes: ``pytorch`` (the model's ``generate``), ``onnx`` (onnxruntime, on the graphs in
``MODEL/onnx`` that ``ode-export MODEL OUT --onnx [--quantize int8]`` writes into ``OUT/onnx``: translate with
``OUT``; float32 graphs for float32, int8 ones with ``--quantize int8``) or ``auto`` (the default): the path
:data:`FASTEST` names for the batch size and beams asked, measured by ``python -m benchmarks.bench_translate
--real-text MODEL``, ONNX only where the folder has the graphs (else PyTorch, with the command that writes them).
The choice is logged at INFO, after the folder is checked; a warning only where the folder's own graphs go unused
(another precision, onnxruntime missing). Both backends share the tokenization, the batching by length and the
outputs. ``--max_length`` is ``generate()``'s (the whole generated sequence), given instead of ``--max_new_tokens``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import CompileConfig, PreTrainedModel, PreTrainedTokenizerBase

from modeling_ode.compat import compile_on_any_device
from modeling_ode.quantization import QUANTIZE_CHOICES, quantize_int8
from ode_transformer.cli import output_problem, positive_int, program_name

from .files import lock_output, read_lines, write_atomic
from .loading import (
    check_generation_config,
    check_model_folder,
    load_model_tokenizer,
    load_saved_model,
    read_config_json,
    tokenizer_digest_problem,
)
from .precision import choose_precision, emulated_bf16_warning
from .tokenizer import tokenizer_sides, truncated_rows

__all__ = [
    "BACKENDS",
    "FASTEST",
    "choose_backend",
    "decode",
    "encode_texts",
    "fastest_backend",
    "generate_ids",
    "generate_texts",
    "length_batches",
    "load_for_generation",
    "load_onnx_for_generation",
    "check_onnx",
    "main",
    "onnx_problem",
    "pad_batch",
]

logger = logging.getLogger(__name__)

# What transformers' generate() adds when neither max_new_tokens nor max_length is set; generate_texts passes a
# causal LM's max_new_tokens explicitly, since its prompt is cut to leave that many positions.
DEFAULT_NEW_TOKENS = 20
_SHOWN_LINES = 5  # line numbers quoted in a warning

BACKENDS = ("auto", "pytorch", "onnx")
# The fastest backend per measured (batch size, beams) and precision: the figures of `python -m
# benchmarks.bench_translate --real-text MODEL` (the demo model, real sentences, early stopping; FASTEST_SOURCE),
# whose goal rows check this table against the run, so that it cannot drift from the measurement. `auto` takes the
# entry nearest the settings asked (fastest_backend).
FASTEST: dict[tuple[int, int], dict[str, str]] = {
    (16, 4): {"float32": "onnx", "int8": "onnx"},
    (1, 1): {"float32": "onnx", "int8": "onnx"},
}
FASTEST_SOURCE = "measured by benchmarks.bench_translate --real-text"  # its results: benchmarks/results/


def load_for_generation(
    model_name_or_path: str,
    device: str | torch.device = "cpu",
    quantize: str | None = None,
    compile: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (in eval mode, on ``device``) and tokenizer of a saved folder or Hub id. ``quantize="int8"``: the
    Linear layers in int8 (``modeling_ode.quantization.quantize_int8``; CPU only), faster on a CPU; hypotheses may
    differ slightly from float32's (tests/test_quantization.py bounds how often). ``compile``: decoding steps
    compiled (:func:`compile_decoding`).

    Raises:
        FileNotFoundError: a local folder is missing, or holds no tokenizer (path and fix named).
        ValueError: ``device`` is not one this machine has, or ``quantize`` is unknown or not for that device.
    """
    if (problem := device_problem(str(device))) is not None:
        raise ValueError(f"device {device}: {problem}")
    if quantize is not None and (problem := quantize_problem(quantize, str(device))) is not None:
        raise ValueError(f"quantize {quantize!r}: {problem}")
    tokenizer, model = _load_one_export(model_name_or_path, load_saved_model)
    model = model.to(device).eval()
    if quantize:
        quantize_int8(model)
    return (compile_decoding(model) if compile else model), tokenizer


def _load_one_export(model_name_or_path: str, load) -> tuple[PreTrainedTokenizerBase, object]:
    """The folder's tokenizer and what ``load`` loads from it (the model, or its config), both of one export: an
    export records its weights digest in both, and a reader that loads while another export replaces the folder
    can take one from each. Loaded again once; then refused.

    Raises:
        ValueError: the two digests, loaded twice.
    """
    for attempt in range(2):
        tokenizer, loaded = load_model_tokenizer(model_name_or_path), load(model_name_or_path)
        config = loaded.config if isinstance(loaded, PreTrainedModel) else loaded
        problem = tokenizer_digest_problem(tokenizer, config, model_name_or_path)
        if problem is None:
            return tokenizer, loaded
        if attempt == 0:
            logger.warning("%s: it was replaced while it loaded; loading it again", problem)
    raise ValueError(
        f"{problem}, loaded twice: its files come from two exports; load it again once the export writing it has "
        "finished, or export the model again"
    )


def load_onnx_for_generation(
    model_name_or_path: str,
    quantize: str | None = None,
    graphs: str | Path | None = None,
    threads: int | None = None,
    search: bool = True,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The folder's ONNX graphs as a model that ``generate`` drives (``ORTModelForODESeq2SeqLM``, onnxruntime on
    the CPU), with the folder's tokenizer and generation config: what :func:`generate_texts` and
    :func:`generate_ids` take in place of :func:`load_for_generation`'s model. ``graphs``: the folder of the graphs
    (default: ``MODEL/onnx``, where ``ode-export --onnx`` writes them); float32 ones, or int8 ones with
    ``quantize="int8"``. ``threads``: onnxruntime's threads (default: torch's, as the PyTorch path uses).
    ``search``: where the folder has the search graph of that precision (``ode-export --onnx`` writes it), decode
    with it (``ORTSearchModel``: the whole search in onnxruntime; the settings it cannot follow through the
    three graphs under ``generate``).

    Raises:
        FileNotFoundError: no such graphs (the command that writes them named).
        ValueError: the graphs are not of the precision asked.
        ModuleNotFoundError: onnxruntime is missing (the extra named).
    """
    check_onnx(model_name_or_path, quantize, graphs)
    import onnxruntime
    from transformers import GenerationConfig

    from modeling_ode import ODETransformerConfig

    from .onnx_generation import ONNXSeq2SeqGenerator, graphs_folder
    from .onnx_search_decoding import ONNXSearchGenerator, ORTSearchModel, search_graph_file

    tokenizer, config = _load_one_export(model_name_or_path, ODETransformerConfig.from_pretrained)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads or torch.get_num_threads(), 1
    folder = graphs if graphs is not None else model_name_or_path
    generation = GenerationConfig.from_pretrained(model_name_or_path)
    search_graph = graphs_folder(folder) / search_graph_file(quantize)
    if search and search_graph.is_file():
        model = ORTSearchModel(ONNXSearchGenerator(search_graph, generation, session_options=options))
    else:
        model = ONNXSeq2SeqGenerator(folder, generation, session_options=options).model
    # generate_texts truncates inputs to the positions the model was built for, read from its config: the same
    # limit as the PyTorch path's, so that both decode the same ids
    model.config.max_position_embeddings = config.max_position_embeddings
    return model, tokenizer


def check_onnx(model_name_or_path: str, quantize: str | None, graphs: str | Path | None = None) -> None:
    """Refuse, with the fix, a folder that cannot decode with its ONNX graphs as asked: onnxruntime missing, no
    graphs (``graphs``, else ``MODEL/onnx`` or the folder itself), or graphs of another precision than
    ``quantize`` asks for (float32 graphs for float32, int8 ones for int8: a backend never changes the precision).

    Raises:
        ModuleNotFoundError: onnxruntime is missing (the extra named).
        FileNotFoundError: no graphs (the command that writes them named).
        ValueError: the graphs are of the other precision.
    """
    from .onnx_generation import QUANTIZED_GRAPHS, RUNTIME_PACKAGES, graph_files, graphs_folder, require

    require(RUNTIME_PACKAGES, "decoding with ONNX")
    write = f"`ode-export {model_name_or_path} OUT --onnx{' --quantize int8' if quantize else ''}`, then translate OUT"
    try:
        folder = graphs_folder(graphs if graphs is not None else model_name_or_path)
    except FileNotFoundError as error:
        # its advice names MODEL and OUT/onnx; this one names the folder and what to translate after
        raise FileNotFoundError(f"{str(error).split('; write them')[0]}; write them with {write}") from None
    int8 = set(graph_files(folder).values()) == set(QUANTIZED_GRAPHS)
    if quantize and not int8:
        raise ValueError(
            f"{folder} holds float32 graphs, not the int8 ones --quantize int8 asks for; write them with {write}"
        )
    if int8 and not quantize:
        raise ValueError(
            f"{folder} holds int8 graphs (*_quantized.onnx): add --quantize int8 to decode with them, or write "
            f"float32 ones with {write}"
        )


def onnx_problem(
    model_name_or_path: str, quantize: str | None, graphs: str | Path | None = None
) -> str | None:
    """:func:`check_onnx`'s refusal as a line, or None."""
    try:
        check_onnx(model_name_or_path, quantize, graphs)
    except (ModuleNotFoundError, FileNotFoundError, ValueError) as error:
        return str(error)
    return None


def fastest_backend(batch_size: int, beams: int, precision: str) -> tuple[str, tuple[int, int]]:
    """The backend :data:`FASTEST` names for ``precision`` ("float32" or "int8") at the measured setting nearest
    ``batch_size`` and ``beams`` (counted in doublings of each; a tie goes to the smaller setting), and that
    setting."""
    setting = min(
        FASTEST,
        key=lambda s: (abs(math.log2(s[0] / batch_size)) + abs(math.log2(s[1] / beams)), s),
    )
    return FASTEST[setting][precision], setting


def choose_backend(
    backend: str,
    model_name_or_path: str,
    batch_size: int,
    beams: int,
    quantize: str | None = None,
    device: str = "cpu",
    pytorch_only: str | None = None,
) -> tuple[str, str]:
    """The backend to decode with and one line saying why. ``backend`` "pytorch" or "onnx" is kept; "auto" takes
    :func:`fastest_backend`'s for ``batch_size`` (the inputs per batch) and ``beams``, ONNX only where
    :func:`onnx_problem` finds none (else PyTorch, and the line names the command that writes the graphs).
    ``pytorch_only``: a flag asked that only PyTorch has (``--compile``, ``--bf16``), which decides."""
    backend, reason, _ = _choose_backend(
        backend, model_name_or_path, batch_size, beams, quantize, device, pytorch_only
    )
    return backend, reason


def _choose_backend(
    backend: str,
    model_name_or_path: str,
    batch_size: int,
    beams: int,
    quantize: str | None,
    device: str,
    pytorch_only: str | None,
) -> tuple[str, str, bool]:
    """:func:`choose_backend`'s backend and line, and whether the line is worth a warning: the folder's own ONNX
    graphs go unused where they would be the faster path (another precision, onnxruntime missing)."""
    if backend != "auto":
        return backend, f"backend {backend}: asked for", False
    if pytorch_only:
        return "pytorch", f"backend pytorch: {pytorch_only} is PyTorch's", False
    if torch.device(device).type != "cpu":
        return "pytorch", f"backend pytorch: on {device} (the ONNX graphs run on the CPU)", False
    precision = "int8" if quantize else "float32"
    fastest, (batch, k) = fastest_backend(batch_size, beams, precision)
    measured = f"fastest in {precision} at batch {batch}, {k} beam(s) ({FASTEST_SOURCE}; asked: batch {batch_size}, {beams} beam(s))"
    if fastest == "pytorch":
        return "pytorch", f"backend pytorch: {measured}", False
    if (problem := onnx_problem(model_name_or_path, quantize)) is None:
        return "onnx", f"backend onnx: {measured}", False
    if not has_onnx_graphs(model_name_or_path):  # a plain model folder: the usual case, said in short
        export = f"ode-export {model_name_or_path} OUT --onnx{' --quantize int8' if quantize else ''}"
        return (
            "pytorch",
            f"backend pytorch: no ONNX graphs in {model_name_or_path} (`{export}` writes them)",
            False,
        )
    return "pytorch", f"backend pytorch: onnx is {measured}, but {problem}", True


def has_onnx_graphs(model_name_or_path: str | Path) -> bool:
    """Whether a local folder holds any ONNX graph (``*.onnx``), in itself or in its ``onnx/``: a folder someone
    exported, whose graphs ``--backend auto`` may still not use (another precision, a missing onnxruntime)."""
    folder = Path(model_name_or_path)
    return any(any(where.glob("*.onnx")) for where in (folder, folder / "onnx") if where.is_dir())


def compile_decoding(model: PreTrainedModel) -> PreTrainedModel:
    """``model`` set to decode with a static (preallocated) cache and its decoding step compiled by transformers'
    own ``generate`` compilation (``CompileConfig``: one graph per step, ``fullgraph``), on a CPU too, where
    transformers compiles only when told. The first step after the encoder runs eager. Each new batch shape and
    source length costs a compile (seconds to a minute; after the first, dims become dynamic); then a step runs
    with little Python around its operators (the speed-ups ``benchmarks.bench_translate`` measured:
    docs/performance.md). Float32 and int8 (``modeling_ode.quantization``) both compile.
    """
    compile_config = CompileConfig(fullgraph=True, mode="default")  # "reduce-overhead" is CUDA graphs
    compile_on_any_device(compile_config)  # transformers compiles only on a GPU unless told
    model.generation_config.cache_implementation = "static"
    model.generation_config.compile_config = compile_config
    return model


def quantize_problem(quantize: str, device: str) -> str | None:
    """Why the model cannot be quantised as asked on ``device`` (an unknown choice, or not a CPU), else None."""
    if quantize not in QUANTIZE_CHOICES:
        return f"not a quantisation this supports; use one of {list(QUANTIZE_CHOICES)}, or leave it out (float32)"
    if torch.device(device).type != "cpu":
        return (
            f"int8 runs on the CPU only (fbgemm kernels), not on {device}; use --device cpu, or leave it out"
        )
    return None


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices in batches of at most ``batch_size``, longest first."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for index in order:
        full = batches and len(batches[-1]) == batch_size
        if not batches or full:
            batches.append([])
        batches[-1].append(index)
    return batches


def pad_batch(
    sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device, left: bool
) -> dict[str, torch.Tensor]:
    """Padded ids and attention mask; a causal LM's prompts are padded on the left, so that every prompt ends
    where generation starts (positions come from the mask: padding on either side changes no output)."""
    longest = max(len(seq) for seq in sequences)
    input_ids = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, seq in enumerate(sequences):
        span = slice(longest - len(seq), longest) if left else slice(0, len(seq))
        input_ids[row, span] = torch.as_tensor(seq, dtype=torch.long)
        mask[row, span] = 1
    return {"input_ids": input_ids.to(device), "attention_mask": mask.to(device)}


def _length_cap(model: PreTrainedModel, generate_kwargs: dict, inputs: dict) -> dict:
    """``generate_kwargs`` with ``max_new_tokens`` given as the ``max_length`` it means for this batch (the prompt's
    padded length, or the decoder's start token, plus the new tokens): passed beside the ``max_length`` of a
    saved generation config, ``max_new_tokens`` makes transformers warn that both are set. (A generation config
    that sets ``max_new_tokens`` itself keeps it: it would take precedence over ``max_length``.)"""
    new_tokens = generate_kwargs.get("max_new_tokens")
    if generate_kwargs.get("max_length") is not None and model.generation_config.max_new_tokens is not None:
        # a max_length asked for decides, not the max_new_tokens of a generation config saved with one
        return {**generate_kwargs, "max_new_tokens": None}
    if new_tokens is None or model.generation_config.max_new_tokens is not None:
        return generate_kwargs
    start = inputs["input_ids"].shape[1] if not model.config.is_encoder_decoder else 1
    return {
        **{k: v for k, v in generate_kwargs.items() if k != "max_new_tokens"},
        "max_length": start + new_tokens,
    }


@torch.no_grad()
def generate_ids(
    model: PreTrainedModel,
    sequences: Sequence[Sequence[int]],
    batch_size: int = 32,
    bf16: bool = False,
    progress: bool = False,
    **generate_kwargs,
) -> list[list[int]]:
    """``model.generate`` over token-id ``sequences`` in length-sorted batches; the new ids, in input order.

    ``generate_kwargs`` (``num_beams``, ``length_penalty``, ``max_new_tokens``, ...) override the model's
    generation config. A causal LM's prompts are padded on the left and its outputs exclude the prompt.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size}: give a positive number of inputs per batch")
    returns = generate_kwargs.get("num_return_sequences") or model.generation_config.num_return_sequences or 1
    if returns != 1:  # the outputs are matched to the inputs one to one
        raise ValueError(
            f"num_return_sequences {returns}: this returns one output per input; call model.generate(..., "
            f"num_return_sequences={returns}) for several"
        )
    model.eval()
    causal = not model.config.is_encoder_decoder
    pad_id = model.generation_config.pad_token_id if model.generation_config.pad_token_id is not None else 0
    outputs: list[list[int]] = [[] for _ in sequences]
    # closed however the loop ends: after Ctrl-C, the bar's line ends before the command's message
    with tqdm(total=len(sequences), unit="sent", disable=not progress, file=sys.stderr) as bar:
        for batch in length_batches([len(seq) for seq in sequences], batch_size):
            inputs = pad_batch([sequences[i] for i in batch], pad_id, model.device, left=causal)
            with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=bf16):
                generated = model.generate(**inputs, **_length_cap(model, generate_kwargs, inputs))
            new = generated[:, inputs["input_ids"].shape[1] :] if causal else generated
            for index, ids in zip(batch, new.tolist()):
                outputs[index] = ids
            bar.update(len(batch))
    return outputs


def decode(tokenizer: PreTrainedTokenizerBase, ids: Sequence[Sequence[int]]) -> list[str]:
    """Generated ids -> stripped strings without special tokens, each on one line: a byte-level vocabulary can
    write a line break, which would shift every later hypothesis against its input."""
    return [
        " ".join(text.splitlines()).strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)
    ]


def generate_texts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    max_source_length: int | None = None,
    **kwargs,
) -> list[str]:
    """Translate (summarise, correct, continue) ``texts`` in one call: the outputs, in input order.

    transformers 5 has no seq2seq pipelines; this is their stand-in, the decoder of ``ode-translate``. Inputs
    are truncated to ``max_source_length`` tokens, by default the tokenizer's ``model_max_length`` (the length the
    model was trained for, in the folders this project saves; its positions have no limit), with a warning counting
    the lines cut. A causal LM's prompt loses its start, not the end it continues, and leaves ``max_new_tokens`` of
    the trained length to its continuation (the generation config's, else transformers' default of 20 new tokens).
    Then decoded in length-sorted batches (:func:`generate_ids`) with the model's generation config (beam size,
    length penalty, ``max_new_tokens``); ``kwargs`` (``batch_size``, ``num_beams``, ``max_new_tokens``, ``bf16``,
    ...) override it. No texts, no outputs; an empty (or blank) text gets an empty output, with a warning.

    >>> model, tokenizer = load_for_generation("path/to/model")
    >>> generate_texts(model, tokenizer, ["A man is riding a bike.", "Two dogs play in the snow."])
    """
    if isinstance(texts, str):  # list("a b") would decode every character as an input
        raise TypeError("texts is one string: give a list of strings (for one text, [text])")
    texts = list(texts)
    if not texts:
        return []
    if (bad := next((i for i, text in enumerate(texts) if not isinstance(text, str)), None)) is not None:
        raise TypeError(f"texts[{bad}] is {type(texts[bad]).__name__}, not a string: give a list of strings")
    if max_source_length is not None and max_source_length < 1:
        raise ValueError(f"max_source_length {max_source_length}: give a positive number of tokens, or None")
    if (new_tokens := kwargs.get("max_new_tokens")) is not None and new_tokens < 1:
        raise ValueError(f"max_new_tokens {new_tokens}: give a positive number of new tokens")
    causal = not model.config.is_encoder_decoder
    if (max_length := kwargs.get("max_length")) is not None:
        if new_tokens is not None:
            raise ValueError(
                "max_length and max_new_tokens both cap the output (max_length the whole generated sequence, "
                "max_new_tokens the new tokens): give one of them"
            )
        if max_length < 2:
            start = "a causal LM's prompt" if causal else "the decoder's start token"
            raise ValueError(
                f"max_length {max_length}: it counts {start}; give at least 2, or max_new_tokens"
            )
    # a prompt leaves room for its continuation, counted in new tokens (unless max_length counts it in)
    elif causal:
        kwargs["max_new_tokens"] = new_tokens or model.generation_config.max_new_tokens or DEFAULT_NEW_TOKENS
    outputs = [""] * len(texts)
    if not (kept := _with_text(texts)):
        return outputs
    ids = encode_texts(
        model,
        tokenizer,
        [texts[i] for i in kept],
        max_source_length,
        kwargs.get("max_new_tokens"),
        max_length,
    )
    for index, output in zip(kept, decode(tokenizer, generate_ids(model, ids, **kwargs))):
        outputs[index] = output
    return outputs


def _with_text(texts: Sequence[str]) -> list[int]:
    """The indices of the texts to decode; an empty (or blank) one has nothing to translate, and the model would
    write a sentence of its own for it: it gets an empty output, in its place, with a warning naming its line."""
    blank = [i for i, text in enumerate(texts) if not text.strip()]
    if blank:
        shown = ", ".join(str(i + 1) for i in blank[:_SHOWN_LINES]) + (
            ", ..." if len(blank) > _SHOWN_LINES else ""
        )
        logger.warning(
            "%d of %d input line(s) are empty (line numbers %s): each gets an empty output line, not a translation",
            len(blank),
            len(texts),
            shown,
        )
    return [i for i, text in enumerate(texts) if text.strip()]


def encode_texts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    max_source_length: int | None = None,
    max_new_tokens: int | None = None,
    max_length: int | None = None,
) -> list[list[int]]:
    """The token ids :func:`generate_texts` decodes ``texts`` from: truncated to ``max_source_length`` tokens, by
    default the tokenizer's ``model_max_length`` and at most the model's positions (less a causal LM's
    ``max_new_tokens``; given ``max_length``, which counts the prompt, its prompt is shorter than that), with a
    warning counting the lines cut; a causal LM's prompt loses its start."""
    # The model has no length limit (sinusoidal positions); inputs are cut to the tokenizer's model_max_length (the
    # trained length) and at most max_position_embeddings (the positions it was built for), where a causal LM's
    # prompt leaves room for its continuation.
    positions, causal = model.config.max_position_embeddings, not model.config.is_encoder_decoder
    limit, model_limit = positions, f"the model's max_position_embeddings {positions}"
    by_max_length = causal and max_length is not None and max_length <= positions
    if causal and max_length is not None:
        limit = min(positions, max_length) - 1
        if by_max_length:
            model_limit = f"max_length {max_length} less one new token"
    elif causal:
        new_tokens = max_new_tokens or model.generation_config.max_new_tokens or DEFAULT_NEW_TOKENS
        limit, model_limit = max(positions - new_tokens, 2), f"{model_limit} less max_new_tokens {new_tokens}"
    # an explicit max_source_length is the user's choice, past the trained length too (the positions have no limit)
    length = max_source_length if max_source_length is not None else min(tokenizer.model_max_length, limit)
    with tokenizer_sides(tokenizer, truncation="left" if causal else "right"):
        encoded = tokenizer(texts, truncation=True, max_length=length)
    cut = sum(truncated_rows(encoded))
    if cut:
        logger.warning(
            "%d input line(s) longer than %d tokens were truncated (%s); %s",
            cut,
            length,
            f"--max_source_length {max_source_length}"
            if length == max_source_length
            else model_limit
            if length == limit
            else f"the tokenizer's model_max_length {tokenizer.model_max_length}",
            "raise --max_length to keep them whole"
            if by_max_length and length == limit != max_source_length
            else "raise --max_source_length to keep them whole"
            + ("" if length < limit else " (past the positions the model was built for)"),
        )
    return encoded["input_ids"]


def device_problem(device: str) -> str | None:
    """Why ``device`` cannot run the model here (an unknown name, no CUDA or MPS, or a GPU index past the count),
    else None."""
    try:
        parsed = torch.device(device)
    except RuntimeError:
        return "not a torch device; e.g. cpu, cuda, cuda:1 or mps"
    if parsed.type == "cuda" and not torch.cuda.is_available():
        return "this torch has no CUDA device (torch.cuda.is_available() is False); use --device cpu"
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        return f"there are {torch.cuda.device_count()} CUDA device(s), numbered from 0; use cuda:0 or cpu"
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        return "this machine has no Apple MPS device (torch.backends.mps.is_available() is False); use --device cpu"
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program_name(__spec__.name),
        description="Translate (summarise, correct, continue) a text file or stdin with a trained model folder.",
    )
    parser.add_argument(
        "model", help="model folder (ode_transformer.train.run output, save_pretrained) or Hub id"
    )
    parser.add_argument("--input", default="-", help="text file, one input per line (.gz ok); '-' = stdin")
    parser.add_argument("--output", default="-", help="file for the outputs, one per line; '-' = stdout")
    parser.add_argument(
        "--batch_size", type=positive_int, default=32, help="sentences per batch (batched by length)"
    )
    parser.add_argument(
        "--num_beams", type=positive_int, default=None, help="default: the model's generation config"
    )
    parser.add_argument("--length_penalty", type=float, default=None, help="default: the generation config")
    parser.add_argument(
        "--max_new_tokens", type=positive_int, default=None, help="default: the generation config"
    )
    parser.add_argument(
        "--max_length",
        type=positive_int,
        default=None,
        help="generate()'s max_length: the whole generated sequence, the decoder's start token (or a causal LM's "
        "prompt) included; instead of --max_new_tokens",
    )
    parser.add_argument(
        "--max_source_length",
        type=positive_int,
        default=None,
        help="truncate inputs to N tokens (default: the tokenizer's limit)",
    )
    parser.add_argument(
        "--device", default=None, help="default: cuda where there is one, else cpu (with --backend onnx: cpu)"
    )
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="bf16 autocast (default fp32; fast only where the device has native bf16)",
    )
    parser.add_argument(
        "--quantize",
        choices=QUANTIZE_CHOICES,
        default=None,
        help="int8: Linear layers in dynamic int8 (CPU only, where it is faster than float32)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="static cache and compiled decoding steps (pays for many sentences in small batches)",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="who decodes: pytorch, onnx (the graphs of `ode-export MODEL OUT --onnx [--quantize int8]`: translate "
        "OUT) or auto, the faster of the two measured for the batch size and beams asked (default)",
    )
    parser.add_argument("--no_progress", action="store_true", help="no progress bar on stderr")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    # found before decoding, not after it
    if (problem := output_problem(args.output, {"--input": args.input})) is not None:
        parser.error(problem)
    if args.max_length is not None and args.max_new_tokens is not None:
        parser.error(
            "--max_length and --max_new_tokens both cap the output: --max_length counts the whole generated "
            "sequence (as generate()'s max_length: the decoder's start token, or a causal LM's prompt, included), "
            "--max_new_tokens the new tokens only; give one of them"
        )
    if args.backend == "onnx":
        if (flag := _pytorch_only_flag(args)) is not None:
            parser.error(
                f"--backend onnx decodes with onnxruntime, and {flag} is PyTorch's: leave out {flag}, or use --backend pytorch"
            )
        if args.device not in (None, "cpu"):
            parser.error(
                f"--backend onnx runs the graphs on the CPU, not on {args.device}: use --device cpu, or --backend pytorch"
            )
        check_model_folder(args.model)  # a missing folder named as one, not as a folder without graphs
        if (problem := onnx_problem(args.model, args.quantize)) is not None:
            parser.error(f"--backend onnx: {problem}")
    args.device = args.device or ("cuda" if torch.cuda.is_available() and args.backend != "onnx" else "cpu")
    if (problem := device_problem(args.device)) is not None:
        parser.error(f"--device {args.device}: {problem}")
    if args.quantize and (problem := quantize_problem(args.quantize, args.device)) is not None:
        parser.error(f"--quantize {args.quantize}: {problem}")
    if args.bf16 and (warning := emulated_bf16_warning(choose_precision(args.device, "bf16"))):
        logger.warning(warning)
    # One writer per --output (a second one is refused, not silently the last one), and the file written whole
    # at the end: until then it keeps its old content, whatever happens (Ctrl-C, a full disk).
    to_file = args.output != "-"
    with lock_output(args.output, "--output") if to_file else contextlib.nullcontext():
        try:
            hypotheses = _translate_file(args)
        except KeyboardInterrupt:
            kept = " (it keeps its old content)" if to_file and Path(args.output).exists() else ""
            written = f"nothing was written to {args.output}{kept}" if to_file else "nothing was written"
            raise KeyboardInterrupt(f"{written}; run the command again to translate the input") from None
        text = "".join(h + "\n" for h in hypotheses)
        if to_file:
            write_atomic(args.output, text)
        else:
            sys.stdout.write(text)


def _pytorch_only_flag(args: argparse.Namespace) -> str | None:
    """The first flag asked that only the PyTorch backend has, or None."""
    return next((flag for flag in ("--compile", "--bf16") if getattr(args, flag[2:])), None)


def _translate_file(args: argparse.Namespace) -> list[str]:
    texts = read_lines(args.input)  # "-": stdin, read as bytes so that bad UTF-8 is named
    overrides = {
        key: value
        for key in ("num_beams", "length_penalty", "max_new_tokens", "max_length")
        if (value := getattr(args, key)) is not None
    }
    # the beams asked, else the folder's (a Hub id's are not read before loading: it has no local graphs anyway),
    # checked before anything computes with them
    check_model_folder(args.model)
    check_generation_config(args.model)
    saved = read_config_json(args.model, "generation_config.json") or {}
    beams = overrides.get("num_beams", saved.get("num_beams") or 1)
    backend, reason, unused_graphs = _choose_backend(
        args.backend,
        args.model,
        min(args.batch_size, max(len(texts), 1)),
        beams,
        args.quantize,
        args.device,
        _pytorch_only_flag(args),
    )
    if args.backend == "auto":
        # a warning only where it helps (the folder's graphs go unused); otherwise the choice is logged at INFO, as
        # transformers logs its own choices, and the plain run stays quiet
        logger.log(logging.WARNING if unused_graphs else logging.INFO, reason)
    if backend == "onnx":
        model, tokenizer = load_onnx_for_generation(args.model, args.quantize)
    else:
        model, tokenizer = load_for_generation(
            args.model, args.device, quantize=args.quantize, compile=args.compile
        )
    beams = overrides.get("num_beams", model.generation_config.num_beams)
    if args.compile and beams > 1:
        raise ValueError(
            f"--compile speeds up greedy decoding only, and {args.model} decodes with {beams} beams: transformers "
            "compiles no beam-search step, and the static cache that compiling needs is slower there; add "
            "--num_beams 1, or leave out --compile"
        )
    return generate_texts(
        model,
        tokenizer,
        texts,
        args.max_source_length,
        batch_size=args.batch_size,
        bf16=args.bf16,
        progress=not args.no_progress,
        **overrides,
    )


if __name__ == "__main__":
    main()
