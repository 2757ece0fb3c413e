"""Loading and checking saved models, one home for translation, training, the hub tools and the benchmarks.

A folder is checked before it is used: its config is an ODE Transformer's, its weights fit and are finite, its
generation config and tokenizer files load. What a training run checks against a saved model (its flags, preset
and task) is ``ode_transformer.train.saved_model``'s.
"""

from __future__ import annotations

import json
import logging
import math
import pickle
from pathlib import Path

from transformers import (
    AutoTokenizer,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from modeling_ode import (  # importing modeling_ode registers the model with the auto classes
    ODETransformerConfig,
    ODETransformerForCausalLM,
    ODETransformerForConditionalGeneration,
)
from modeling_ode.weights_integrity import WEIGHTS_DIGEST

from .checkpoints import complete_checkpoints, unsafe_pickle_message
from .cli import hub_unreachable
from .tokenizer import check_tokenizer_files

logger = logging.getLogger(__name__)


def target_length(generation: GenerationConfig) -> int | None:
    """The most tokens an encoder-decoder's generation config lets an output have: ``max_length`` less the start
    token (what this project saves, as BART does), or the ``max_new_tokens`` of folders saved before it."""
    if generation.max_new_tokens is not None:
        return generation.max_new_tokens
    return generation.max_length - 1 if generation.max_length is not None else None


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
    Hub id loads only from the local cache: without a cached copy, one line saying why in words (the Hub cannot
    be reached, or the user set ``HF_HUB_OFFLINE``) and naming the ways forward (transformers' own message spans
    lines and names none)."""
    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE and not isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        why, cached = hub_unreachable(repo_id)
        raise FileNotFoundError(
            f"{repo_id} is no local folder, and {why}: give a local model folder (the --output_dir "
            f"ode_transformer.train.run wrote), or {cached}"
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
    "vocab_size",
    "source_vocab_size",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "max_position_embeddings",
)


def _stored_parameters(weights: Path) -> int:
    """How many numbers a safetensors file holds, from its header alone (checked whole first)."""
    from modeling_ode.weights_integrity import check_safetensors_file

    header = check_safetensors_file(weights)
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
    # tied weights are stored once: a model needs about what its file holds
    if needed > 2 * stored + 1_000_000:
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
    "max_length": (True, 1, True),
    "max_new_tokens": (True, 1, True),
    "min_length": (True, 0, True),
    "min_new_tokens": (True, 0, True),
    "num_beams": (True, 1, True),
    "num_beam_groups": (True, 1, True),
    "num_return_sequences": (True, 1, True),
    "no_repeat_ngram_size": (True, 0, True),
    "top_k": (True, 0, True),
    "length_penalty": (False, None, True),
    "temperature": (False, 0, False),
    "top_p": (False, 0, False),
    "repetition_penalty": (False, 0, False),
}


def check_generation_config(folder: str | Path) -> None:
    """A local folder's ``generation_config.json``: one JSON object whose decoding fields are numbers in
    range, so that ``max_length`` -1, ``num_beams`` 0 or ``length_penalty`` "abc" is named with its file, not
    left to transformers' message without the file or a raw ZeroDivisionError / TypeError from inside
    generation.

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
    # from_pretrained reads it too, and fails deep inside on a bad one
    check_generation_config(model_name_or_path)
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
            source,
            ", ".join(dropped),
        )


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
    number) are refused by name, before transformers fails on them with long tracebacks (``'list' object has
    no attribute 'get'``, ``KeyError: 'added_tokens'``) naming neither file. ``tokenizer.json`` is parsed by
    the tokenizers library itself; ``tokenizer_config.json``'s special tokens must be strings (or token
    objects).

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
        wrong = (
            []
            if isinstance(decoder, dict) and all(isinstance(v, dict) for v in decoder.values())
            else ["added_tokens_decoder (an object of token objects)"]
        )
        wrong += [
            f"{key} (a string)"
            for key in _SPECIAL_TOKENS
            if data.get(key) is not None and not isinstance(data[key], (str, dict))
        ]
        if wrong:
            raise ValueError(f"{path}: {', '.join(wrong)} is of another type; {fix}")
