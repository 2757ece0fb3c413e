"""Loading and checking saved models, one home for training, translation, the hub tools and the benchmarks.

A folder is checked before it is used (its config is an ODE Transformer's, its weights fit and are finite, its
tokenizer files load), and flags are checked against what a saved model fixes. :func:`build_model` makes the
model of a run: a fresh one from a preset, a saved one, or a residual one upcycled to RK blocks.
"""

from __future__ import annotations

import json
import logging
import math
import pickle
from pathlib import Path
from typing import TYPE_CHECKING

from transformers import (
    AutoTokenizer,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from modeling_ode import (  # importing modeling_ode registers the model with the auto classes
    PAPER_DECODING,
    PRESETS,
    ODETransformerConfig,
    ODETransformerForCausalLM,
    ODETransformerForConditionalGeneration,
    non_finite_tensors,
)
from modeling_ode.modeling_ode_transformer import WEIGHTS_DIGEST

from .checkpoints import complete_checkpoints, unsafe_pickle_message
from .tokenizer import check_tokenizer_files

if TYPE_CHECKING:  # the arguments module imports this one
    from .arguments import DataArguments, ModelArguments, RunArguments

logger = logging.getLogger(__name__)


# Config fields a fine-tuning run may change in a saved model (regularisation, not the model's shape or its
# parameters' meaning); every other model flag is refused with --model_name_or_path where it differs.
TRAINING_FIELDS = ("dropout", "attention_dropout", "activation_dropout")


def target_length(generation: GenerationConfig) -> int | None:
    """The most tokens an encoder-decoder's generation config lets an output have: ``max_length`` less the start
    token (what this project saves, as BART does), or the ``max_new_tokens`` of folders saved before it."""
    if generation.max_new_tokens is not None:
        return generation.max_new_tokens
    return generation.max_length - 1 if generation.max_length is not None else None


def check_saved_model_task(model_name_or_path: str, task: str) -> None:
    """A saved ODE Transformer whose kind fits ``--task`` (an encoder-decoder for the seq2seq tasks, a
    decoder-only model for ``lm``): otherwise the model class refuses it in words about classes, not the flag."""
    seq2seq = ode_model_config(model_name_or_path).get("is_encoder_decoder", True)
    if seq2seq and task == "lm":
        raise ValueError(
            f"{model_name_or_path} is an encoder-decoder model, and --task lm trains a decoder-only one: give "
            "--task translation, summarization or gec, or a language model's folder"
        )
    if not seq2seq and task != "lm":
        raise ValueError(f"{model_name_or_path} is a decoder-only language model: give --task lm with it")


def check_saved_model_flags(model_args: ModelArguments, task: str) -> None:
    """Refuse model flags (``--d_model``, ``--encoder_layers``, ``--config_overrides``, ...) that differ from the
    saved model's config: a saved model keeps its shape, and the flags had been dropped without a word. Flags
    equal to the saved values change nothing and pass; :data:`TRAINING_FIELDS` (the dropout rates) are
    applied to the model instead. ``--preset`` is not read with a saved model.

    Raises:
        ValueError: the flags, the saved values and the fix.
    """
    path = model_args.model_name_or_path
    check_model_folder(path)
    saved = ode_model_config(path)
    asked = model_args.task_overrides(task)
    asked.pop("is_encoder_decoder", None)  # --task against the model's kind: check_saved_model_task's message
    differing = sorted(k for k, v in asked.items() if k not in TRAINING_FIELDS and saved.get(k) != v)
    if differing:
        flags = ", ".join(f"--{key} {asked[key]!r} (saved: {saved.get(key)!r})" for key in differing)
        raise ValueError(
            f"{flags}: {path} is a saved model, whose shape and method its config.json fixes; leave these flags out "
            "to fine-tune it as it is, or leave --model_name_or_path out to train a new model with them"
        )


def check_saved_model_preset(model_args: ModelArguments, task: str) -> None:
    """Refuse a ``--preset`` (given, or in the recipe) that differs from the saved model of
    ``--model_name_or_path`` in a field no flag sets: the saved config.json decides the model, so the preset would
    be dropped without a word. The sizes the run sets from its tokenizer and data (vocabulary, positions) are not
    compared; fields a flag sets are :func:`check_saved_model_flags`' to check.

    Raises:
        ValueError: the preset's differing fields, the saved values and the fix.
    """
    ODETransformerConfig.from_preset(model_args.preset)  # an unknown name is refused, the presets listed
    preset = PRESETS[model_args.preset]
    saved = ode_model_config(model_args.model_name_or_path)
    flags = model_args.task_overrides(task)
    sized_by_the_run = ("vocab_size", "max_position_embeddings")
    differing = sorted(
        key for key in preset
        if key not in flags and key not in sized_by_the_run and saved.get(key) != preset[key]
    )  # fmt: skip
    if differing:
        fields = ", ".join(f"{key} {preset[key]!r} (saved: {saved.get(key)!r})" for key in differing)
        raise ValueError(
            f"--preset {model_args.preset} sets {fields}: {model_args.model_name_or_path} is a saved model, whose "
            "config.json fixes its shape and method; leave --preset out to fine-tune it as it is (dropout rates "
            "are flags: --dropout, --attention_dropout, --activation_dropout)"
        )


def load_trainable_model(model_args: ModelArguments, task: str):
    """The saved model of ``--model_name_or_path`` to train on, with the run's :data:`TRAINING_FIELDS` set;
    refused before anything is written when its weights are not finite (training would only stop at the first
    step, blaming the learning rate).

    Raises:
        ValueError: the non-finite tensors, by name.
    """
    changes = {k: v for k, v in model_args.task_overrides(task).items() if k in TRAINING_FIELDS}
    model = load_saved_model(model_args.model_name_or_path, **changes)
    if bad := non_finite_tensors(model):
        raise ValueError(
            f"{model_args.model_name_or_path} holds non-finite weights (NaN or infinity) in {len(bad)} tensors "
            f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}): training cannot recover them; start from a "
            "checkpoint saved before its run diverged, or train a new model"
        )
    return model


def saved_model_tokenizer(model_args: ModelArguments) -> PreTrainedTokenizerFast | None:
    """A saved model's own tokenizer (unless --tokenizer_name names another): never trained, since the model's
    embeddings are rows of that vocabulary; a folder without one is refused."""
    if not model_args.model_name_or_path or model_args.tokenizer_name:
        return None
    tokenizer = load_model_tokenizer(model_args.model_name_or_path)
    logger.info("using the tokenizer of %s (%d tokens)", model_args.model_name_or_path, len(tokenizer))
    return tokenizer


def check_resume_config(checkpoint: str, config: ODETransformerConfig) -> None:
    """Refuse to resume a checkpoint of another model configuration, naming the fields that differ."""
    saved = ODETransformerConfig.from_pretrained(checkpoint).to_dict()
    now = config.to_dict()
    bookkeeping = {
        "architectures",
        "auto_map",
        "transformers_version",
        "_name_or_path",
        "dtype",
        "use_cache",
        "weights_digest",  # an exported folder's, which a saved checkpoint does not carry
    }  # not the model
    fields = sorted(k for k in (saved.keys() | now.keys()) - bookkeeping if saved.get(k) != now.get(k))
    if fields:
        detail = ", ".join(f"{k}: {saved.get(k)!r} in the checkpoint, {now.get(k)!r} now" for k in fields)
        raise ValueError(
            f"{checkpoint} was trained with another model configuration ({detail}); resume with the checkpoint's "
            "settings, or start a new run in an empty --output_dir."
        )


def check_resume_tokenizer(checkpoint: str, tokenizer: PreTrainedTokenizerBase, folder: str) -> None:
    """Refuse to resume ``checkpoint`` with a tokenizer other than the one it was trained with: every file the
    tokenizer (as the run has fitted it) saves is compared, as JSON, with the checkpoint's own copy. A tokenizer of
    ``folder`` edited between a kill and the resume (another BPE of the same size, a changed normalizer) had resumed
    and trained another model; an edited ``eos_token`` was refused as "another model configuration", naming neither
    the file nor the fix.

    Raises:
        ValueError: the files that differ, ``folder`` and the fix.
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ode-tokenizer-") as scratch:
        tokenizer.save_pretrained(scratch)
        differing = [
            path.name
            for path in sorted(Path(scratch).iterdir())
            if (Path(checkpoint) / path.name).is_file()
            and _file_content(path) != _file_content(Path(checkpoint) / path.name)
        ]
    if differing:
        raise ValueError(
            f"the tokenizer in {folder} is not the one {checkpoint} was trained with: its {', '.join(differing)} "
            f"differ from the checkpoint's copies; copy them from {checkpoint} back into {folder} to resume, or "
            "start a new run with this tokenizer (--overwrite_output_dir true, or another --output_dir)"
        )


# What transformers records in tokenizer_config.json about how a tokenizer was loaded, not what it does: a tokenizer
# trained by the run and saved in its first checkpoint has none of them, the same one read back from disk has some.
_LOADING_RECORD = ("is_local", "local_files_only", "name_or_path", "_commit_hash", "cache_dir", "revision")


def _file_content(path: Path) -> object:
    """A JSON file's value (its formatting and :data:`_LOADING_RECORD` aside), else its bytes."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError):
        return path.read_bytes()
    return {k: v for k, v in value.items() if k not in _LOADING_RECORD} if isinstance(value, dict) else value


def load_state(model, state: dict, source) -> None:
    """Load ``state`` (a safetensors file's tensors, tied weights stored once) into ``model``."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded = {params[key].data_ptr() for key in state if key in params}
    untied = [key for key in missing if key not in params or params[key].data_ptr() not in loaded]
    if unexpected or untied:  # keys left out of the safetensors file must be tied to loaded ones
        raise ValueError(f"{source} does not fit the model: missing {untied}, unexpected {unexpected}")


def build_model(
    model_args: ModelArguments,
    data_args: DataArguments,
    task: str,
    tokenizer: PreTrainedTokenizerFast,
    saved_model=None,
):
    """A fresh model from the preset and overrides, or the saved one of ``model_name_or_path``: the one
    :func:`load_trainable_model` loaded for training (``saved_model``), else (evaluation) as it was saved; with
    ``--upcycle``, that residual model with its blocks swapped (from_residual)."""
    if model_args.upcycle:
        return ODETransformerForConditionalGeneration.from_residual(
            model_args.model_name_or_path, **model_args.overrides()
        )
    if model_args.model_name_or_path:  # its kind checked against the task (check_saved_model_task)
        return saved_model if saved_model is not None else load_saved_model(model_args.model_name_or_path)
    model_class = ODETransformerForCausalLM if task == "lm" else ODETransformerForConditionalGeneration
    overrides = model_args.task_overrides(task)
    preset_positions = ODETransformerConfig.from_preset(model_args.preset).max_position_embeddings
    needed = max(data_args.max_source_length, data_args.max_target_length) + 2
    config = ODETransformerConfig.from_preset(
        model_args.preset,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
        max_position_embeddings=max(preset_positions, needed),
        **overrides,
    )
    return model_class(config)


def set_decoding_defaults(model, run_args: RunArguments, data_args: DataArguments, saved: bool) -> dict:
    """Beam size and length penalty of the test decoding, written into ``model.generation_config``.

    ``--num_beams``/``--length_penalty`` if given, else a ``saved`` model's own, else the paper's for the task;
    ``max_length`` is ``--max_target_length`` + 1 (the start token and the target's tokens).
    """
    if run_args.task == "lm":
        return {}
    generation = model.generation_config
    beams, penalty = (
        PAPER_DECODING[run_args.task]["num_beams"],
        PAPER_DECODING[run_args.task]["length_penalty"],
    )
    if saved:  # unset fields of a generation config read as greedy search, length penalty 1
        beams, penalty = (
            generation.num_beams or 1,
            1.0 if generation.length_penalty is None else generation.length_penalty,
        )
    decoding = {
        "num_beams": run_args.num_beams or beams,
        "length_penalty": penalty if run_args.length_penalty is None else run_args.length_penalty,
    }
    # BART's convention: max_length, which counts the decoder's start token, so that a user's max_length,
    # generation_max_length or max_new_tokens each take effect (a saved max_new_tokens would override the first two)
    generation.max_length, generation.max_new_tokens = data_args.max_target_length + 1, None
    generation.num_beams = decoding["num_beams"]
    if decoding["num_beams"] > 1:  # beam-only settings are refused by greedy generation configs
        generation.length_penalty = decoding["length_penalty"]
        generation.early_stopping = True
    return decoding


# Any of these makes a folder's tokenizer loadable by AutoTokenizer (ode_transformer.train.run saves tokenizer.json).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


# The modules of the code save_pretrained writes beside the weights: what this project's auto_map points to.
_OWN_CODE = ("configuration_ode_transformer.", "modeling_ode_transformer.")


def _holds_models(folder: Path) -> bool:
    """Whether ``folder`` (not the current one) holds a saved model or a run's checkpoints in a subfolder."""
    if folder == Path(".") or not folder.is_dir():
        return False
    return any(
        (child / "config.json").is_file() or any(child.glob("checkpoint-*"))
        for child in folder.iterdir()
        if child.is_dir()
    )


def _check_hub_id_reachable(repo_id: str) -> None:
    """Offline (``HF_HUB_OFFLINE``, which ``ode-train`` and ``ode-translate`` set where the Hub is unreachable), a
    Hub id loads only from the local cache: without a cached copy, one line naming both ways forward (transformers'
    own message spans lines and names neither)."""
    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE and not isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        raise FileNotFoundError(
            f"{repo_id} is no local folder, and the Hub is offline with no cached copy of it: give the folder "
            "ode_transformer.train.run wrote (its --output_dir), or go online to download it"
        )


def check_model_folder(model_name_or_path: str) -> None:
    """A local model folder must exist and hold a tokenizer; each problem named in one line with its fix (else
    transformers reads the path as a Hub id, or asks for sentencepiece)."""
    folder = Path(model_name_or_path)
    if not folder.exists():
        looks_local = (
            folder.is_absolute()
            or model_name_or_path.startswith(".")
            or model_name_or_path.count("/") > 1
            or _holds_models(folder.parent)  # runs/modle beside runs/model: a mistyped path, not a Hub id
        )
        if looks_local:
            raise FileNotFoundError(
                f"no model folder {model_name_or_path}: give the folder ode_transformer.train.run wrote (its --output_dir) or "
                "a Hub id (USER/NAME)"
            )
        _check_hub_id_reachable(model_name_or_path)
        return  # a Hub id
    if not folder.is_dir():
        raise NotADirectoryError(
            f"{model_name_or_path} is a file: give the model's folder (its --output_dir)"
        )
    # a finished run's folder holds checkpoints too: they are read only when the final model is missing
    if not (folder / "config.json").is_file() and (checkpoints := complete_checkpoints(folder)):
        raise FileNotFoundError(
            f"{folder} holds checkpoints ({', '.join(path.name for path in checkpoints[-3:])}) but no final model: "
            f"the run has not finished. Give a checkpoint folder ({checkpoints[-1]}), or finish the run with "
            "--resume_from_checkpoint last"
        )
    read_config_json(folder)  # the tokenizer's loader reads it too, with a raw TypeError on a JSON list
    check_generation_config(folder)
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        raise FileNotFoundError(
            f"{folder} holds no tokenizer (tokenizer.json): copy tokenizer.json and tokenizer_config.json into it "
            "from the run's output folder (ode_transformer.train.run writes them beside model.safetensors)"
        )


def read_config_json(model_name_or_path: str | Path, name: str = "config.json") -> dict | None:
    """A local model folder's ``config.json`` (or ``name``) as a dict (``None`` for a Hub id or a missing file);
    refused by name when it is not UTF-8 JSON of one object: transformers fails on a JSON list with a raw
    ``TypeError`` from inside its loader.

    Raises:
        ValueError: the file, what is wrong with it, and the fix.
    """
    path = Path(model_name_or_path) / name
    if not path.is_file():
        return None
    fix = "copy it again from the folder the model was saved in (save_pretrained writes it)"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text; {fix}") from None
    except ValueError as error:
        raise ValueError(f"{path} is not valid JSON ({error}: cut off or damaged); {fix}") from None
    if not isinstance(data, dict):
        raise ValueError(
            f'{path} holds a JSON {type(data).__name__}, not an object of fields (`{{"model_type": ...}}`); {fix}'
        )
    return data


# The config fields that size a model: named when a config.json asks for far more parameters than its weights hold.
_SIZE_FIELDS = (
    "vocab_size", "source_vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_ffn_dim",
    "decoder_ffn_dim", "max_position_embeddings",
)  # fmt: skip


def _stored_parameters(weights: Path) -> int:
    """How many numbers a safetensors file holds, from its header alone (checked whole first)."""
    import struct

    from modeling_ode.modeling_ode_transformer import check_safetensors_file

    check_safetensors_file(weights)
    with open(weights, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return sum(math.prod(t["shape"]) for key, t in header.items() if key != "__metadata__")


def check_config_fits_weights(model_name_or_path: str | Path, model_class, **config_changes) -> None:
    """Refuse a local folder whose config.json asks for a model far larger than its ``model.safetensors`` holds
    (a hostile ``vocab_size`` was allocated in full before any check): the model is built on the meta device, which
    allocates nothing, and its parameters are counted against the file's header.

    Raises:
        ValueError: the sizes, the config's size fields and the fix.
    """
    import torch

    weights = Path(model_name_or_path) / "model.safetensors"
    if not weights.is_file():
        return  # a Hub id, or pickle weights: transformers reads those
    stored = _stored_parameters(weights)
    config = model_class.config_class.from_pretrained(str(model_name_or_path), **config_changes)
    with torch.device("meta"):
        needed = sum(p.numel() for p in model_class(config).parameters())
    if (
        needed > 2 * stored + 1_000_000
    ):  # tied weights are stored once: a model needs about what its file holds
        fields = ", ".join(
            f"{key} {getattr(config, key)}" for key in _SIZE_FIELDS if getattr(config, key, None) is not None
        )
        raise ValueError(
            f"{Path(model_name_or_path) / 'config.json'} asks for a model of {needed:,} parameters ({fields}), but "
            f"{weights} holds {stored:,}: the config does not describe these weights, and building the model would "
            "allocate their memory for nothing; copy config.json again from the folder the model was saved in"
        )


# generation_config.json fields: (whole number?, lowest value, lowest value allowed itself?)
_GENERATION_FIELDS = {
    "max_length": (True, 1, True), "max_new_tokens": (True, 1, True), "min_length": (True, 0, True),
    "min_new_tokens": (True, 0, True), "num_beams": (True, 1, True), "num_beam_groups": (True, 1, True),
    "num_return_sequences": (True, 1, True), "no_repeat_ngram_size": (True, 0, True), "top_k": (True, 0, True),
    "length_penalty": (False, None, True), "temperature": (False, 0, False), "top_p": (False, 0, False),
    "repetition_penalty": (False, 0, False),
}  # fmt: skip


def check_generation_config(folder: str | Path) -> None:
    """A local folder's ``generation_config.json``: one JSON object whose decoding fields are numbers in range
    (``max_length`` -1, ``num_beams`` 0 or ``length_penalty`` "abc" gave transformers' message without the file,
    or a raw ZeroDivisionError / TypeError from inside generation).

    Raises:
        ValueError: the file, the field, what it must be and the fix.
    """
    data = read_config_json(folder, "generation_config.json")
    path = Path(folder) / "generation_config.json"
    for key, (whole, lowest, inclusive) in _GENERATION_FIELDS.items():
        value = data.get(key) if data else None
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        fits = number and (not whole or isinstance(value, int))
        fits = fits and (lowest is None or value > lowest or (inclusive and value == lowest))
        if key == "top_p":
            fits = fits and value <= 1
        if not fits:
            kind = "a whole number" if whole else "a number"
            bound = "" if lowest is None else f" {'of at least' if inclusive else 'above'} {lowest}"
            bound += " and at most 1" if key == "top_p" else ""
            raise ValueError(
                f"{path}: {key} {value!r} is not {kind}{bound}; correct it, or remove the field to decode with "
                "the default"
            )


def ode_model_config(model_name_or_path: str | Path) -> dict:
    """A saved model's config.json as a dict, refused unless it is an ODE Transformer's: given another model's
    (a BART folder, say) transformers only warns, and loads a randomly initialised ODE Transformer."""
    read_config_json(model_name_or_path)  # a local one: JSON of the right shape, named otherwise
    config, _ = PretrainedConfig.get_config_dict(str(model_name_or_path))
    model_type = config.get("model_type")
    if model_type != ODETransformerConfig.model_type:
        found = f"model_type {model_type!r}" if model_type else "no model_type"
        raise ValueError(
            f"{model_name_or_path} is not an ODE Transformer folder: its config.json has {found}, expected "
            f"{ODETransformerConfig.model_type!r}. Pass a folder written by an ODE Transformer's save_pretrained "
            "(ode_transformer.train.run's output; ode_transformer.hub.convert_fairseq converts the authors' fairseq checkpoints)."
        )
    return config


def _weight_problems(info: dict) -> list[str]:
    """What ``from_pretrained(..., output_loading_info=True)`` could not load, in words (first five of each)."""
    problems = []
    if missing := sorted(info.get("missing_keys") or ()):
        problems.append(f"{len(missing)} missing (they would be random): {missing[:5]}")
    if unexpected := sorted(info.get("unexpected_keys") or ()):
        problems.append(f"{len(unexpected)} unexpected: {unexpected[:5]}")
    if mismatched := sorted(info.get("mismatched_keys") or ()):
        shapes = [f"{key} {tuple(saved)} vs {tuple(expected)}" for key, saved, expected in mismatched[:5]]
        problems.append(f"{len(mismatched)} of another shape (file vs config): {shapes}")
    return problems


def load_saved_model(model_name_or_path: str | Path, **config_changes) -> PreTrainedModel:
    """A saved ODE Transformer (seq2seq or causal LM, as its config says) with every weight loaded. transformers
    only warns when a folder holds another model type or weights that do not fit its config, and returns a model
    that is partly random initialisation. (Tied weights, stored once, are not missing.) ``config_changes`` are
    set in the config before the model is built (a fine-tuning run's ``dropout``). Config entries that are not
    this project's are dropped (:func:`drop_foreign_config_entries`).

    Raises:
        ValueError: the folder's ``model_type`` is not ``ode_transformer``, its ``generation_config.json`` is of the
            wrong shape (:func:`check_generation_config`), or weights are missing, unexpected or of another shape
            (the first five of each named).
    """
    seq2seq = ode_model_config(model_name_or_path).get("is_encoder_decoder", True)
    check_generation_config(
        model_name_or_path
    )  # from_pretrained reads it too, and fails deep inside on a bad one
    model_class = ODETransformerForConditionalGeneration if seq2seq else ODETransformerForCausalLM
    check_config_fits_weights(model_name_or_path, model_class, **config_changes)
    try:
        model, info = model_class.from_pretrained(
            model_name_or_path, output_loading_info=True, ignore_mismatched_sizes=True, **config_changes
        )  # mismatched sizes reported below, by name, instead of a size-mismatch trace from torch
    except pickle.UnpicklingError as error:  # torch.load(weights_only=True) refused a pickle: it ran nothing
        pickles = sorted(Path(model_name_or_path).glob("*.bin"))
        fix = (
            "convert weights you trust to model.safetensors (save_pretrained writes it), or give the folder "
            "ode_transformer.train.run wrote"
        )
        raise ValueError(
            unsafe_pickle_message(pickles[0] if pickles else model_name_or_path, error, fix)
        ) from None
    if problems := _weight_problems(info):
        raise ValueError(
            f"the weights in {model_name_or_path} do not match its config.json: {'; '.join(problems)}. Give a "
            "folder written by the trained model's save_pretrained (its config.json and weights together)."
        )
    drop_foreign_config_entries(model.config, model_name_or_path)
    return model


def drop_foreign_config_entries(config: ODETransformerConfig, source: str | Path) -> None:
    """Remove from ``config`` what is not this project's: keys that are no field of :class:`ODETransformerConfig`
    (``trust_remote_code``, a misspelt or another library's field) and ``auto_map`` entries that point to other
    code (``AutoTokenizer: evil.Evil``). transformers keeps them as attributes, and every folder saved from the
    model would carry them on: a copied auto_map entry makes ``trust_remote_code=True`` run a file that, dropped
    beside the folder, anybody could have written. Logged as a warning, by name."""
    known = set(type(config)().to_dict()) | {"auto_map"}
    dropped = sorted(set(config.to_dict()) - known)
    for key in dropped:
        delattr(config, key)
    auto_map = getattr(config, "auto_map", None) or {}
    own = {k: v for k, v in auto_map.items() if isinstance(v, str) and v.startswith(_OWN_CODE)}
    dropped += [f"auto_map.{key}" for key in sorted(auto_map.keys() - own.keys())]
    if auto_map:
        config.auto_map = own
    if dropped:
        logger.warning(
            "%s/config.json: dropped %s, not this project's (not a field of the ODE Transformer, or code of another "
            "project): what is saved from this model carries the ODE Transformer's own fields and auto_map only",
            source, ", ".join(dropped),
        )  # fmt: skip


def tokenizer_digest_problem(
    tokenizer: PreTrainedTokenizerBase, config: PretrainedConfig, folder: str | Path
) -> str | None:
    """Why ``tokenizer`` may be another export's than ``config`` (both loaded from ``folder``): the weights digests
    that ``ode-export`` records in ``tokenizer_config.json`` and ``config.json`` differ; None where they agree or
    either records none."""
    held = tokenizer.init_kwargs.get(WEIGHTS_DIGEST)
    expected = getattr(config, WEIGHTS_DIGEST, None)
    if held and expected and held != expected:
        return (
            f"{folder}: tokenizer_config.json records the weights digest {held[:12]}, but config.json "
            f"{expected[:12]}"
        )
    return None


def load_model_tokenizer(model_name_or_path: str) -> PreTrainedTokenizerBase:
    """The tokenizer saved with a model (folder or Hub id); a local folder without one, or with a damaged
    tokenizer file, is refused by name."""
    check_model_folder(model_name_or_path)
    if not Path(model_name_or_path).is_dir():
        return AutoTokenizer.from_pretrained(model_name_or_path)
    check_tokenizer_files(model_name_or_path)
    check_tokenizer_shapes(model_name_or_path)
    try:
        return AutoTokenizer.from_pretrained(model_name_or_path)
    except (AttributeError, KeyError, TypeError, ValueError) as error:  # a shape the checks above let through
        raise ValueError(
            f"the tokenizer files of {model_name_or_path} (tokenizer.json, tokenizer_config.json) do not load "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); {_TOKENIZER_FIX}"
        ) from None


_TOKENIZER_FIX = (
    "copy them again from the folder the tokenizer was saved in (ode_transformer.train.run writes tokenizer.json "
    "and tokenizer_config.json beside model.safetensors)"
)
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def check_tokenizer_shapes(folder: str | Path) -> None:
    """Tokenizer files that are JSON of the wrong shape (a list, a missing ``added_tokens``, a token that is a
    number) are refused by name: transformers failed with long tracebacks (``'list' object has no attribute
    'get'``, ``KeyError: 'added_tokens'``) naming neither file. ``tokenizer.json`` is parsed by the tokenizers
    library itself; ``tokenizer_config.json``'s special tokens must be strings (or token objects).

    Raises:
        ValueError: the file, what is wrong, and the fix.
    """
    from tokenizers import Tokenizer

    for name in _TOKENIZER_FILES:
        path = Path(folder) / name
        if not path.is_file():
            continue
        data = json.loads(path.read_text(encoding="utf-8"))  # JSON text: check_tokenizer_files
        fix = _TOKENIZER_FIX.replace("them", "it")
        if not isinstance(data, dict):
            raise ValueError(
                f"{path} holds a JSON {type(data).__name__}, not an object of tokenizer fields; {fix}"
            )
        if name == "tokenizer.json":
            needed = (("added_tokens", list, "a list"), ("model", dict, "an object"))
            if wrong := [
                f"{key} ({what})" for key, kind, what in needed if not isinstance(data.get(key), kind)
            ]:
                raise ValueError(f"{path}: {', '.join(wrong)} is missing or of another type; {fix}")
            try:
                Tokenizer.from_file(str(path))
            except Exception as error:  # the Rust parser's message: the field and where
                raise ValueError(f"{path} is not a tokenizer ({str(error).splitlines()[0]}); {fix}") from None
            continue
        decoder = data.get("added_tokens_decoder", {})
        wrong = [] if isinstance(decoder, dict) and all(isinstance(v, dict) for v in decoder.values()) else [
            "added_tokens_decoder (an object of token objects)"
        ]  # fmt: skip
        wrong += [
            f"{key} (a string)" for key in _SPECIAL_TOKENS if data.get(key) is not None
            and not isinstance(data[key], (str, dict))
        ]  # fmt: skip
        if wrong:
            raise ValueError(f"{path}: {', '.join(wrong)} is of another type; {fix}")
