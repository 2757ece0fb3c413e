"""A run that starts from, or evaluates, a saved model (``--model_name_or_path``): its task, flags and preset
checked against what the saved model fixes, the model loaded for training, its tokenizer, and a checkpoint's
configuration and tokenizer checked before resuming. Loading and checking the folder itself is
:mod:`ode_transformer.loading`'s.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from modeling_ode import PRESETS, ODETransformerConfig, non_finite_message, non_finite_tensors
from ode_transformer.loading import (
    check_model_folder,
    check_tokenizer_shapes,
    load_model_tokenizer,
    load_saved_model,
    ode_model_config,
)
from ode_transformer.tokenizer import check_task_tokenizer, check_tokenizer_files, check_vocabulary_size

from .tasks import TASKS, get_task

if TYPE_CHECKING:
    from .arguments import ModelArguments

logger = logging.getLogger(__name__)


# Config fields a fine-tuning run may change in a saved model (regularisation, not the model's shape or its
# parameters' meaning); every other model flag is refused with --model_name_or_path where it differs.
TRAINING_FIELDS = ("dropout", "attention_dropout", "activation_dropout")


def check_saved_model_task(model_name_or_path: str, task: str) -> None:
    """A saved ODE Transformer whose kind fits ``--task`` (an encoder-decoder for the seq2seq tasks, a
    decoder-only model for ``lm``): otherwise the model class refuses it in words about classes, not the flag."""
    seq2seq = ode_model_config(model_name_or_path).get("is_encoder_decoder", True)
    lm = get_task(task).is_lm
    if seq2seq and lm:
        tasks = [name for name, other in TASKS.items() if not other.is_lm]
        raise ValueError(
            f"{model_name_or_path} is an encoder-decoder model, and --task {task} trains a decoder-only one: give "
            f"--task {', '.join(tasks[:-1])} or {tasks[-1]}, or a language model's folder"
        )
    if not seq2seq and not lm:
        raise ValueError(f"{model_name_or_path} is a decoder-only language model: give --task lm with it")


def check_saved_model_flags(model_args: ModelArguments, task: str) -> None:
    """Refuse model flags (``--d_model``, ``--encoder_layers``, ``--config_overrides``, ...) that differ from the
    saved model's config: a saved model keeps its shape, so such a flag could only be ignored. Flags
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
        key
        for key in preset
        if key not in flags and key not in sized_by_the_run and saved.get(key) != preset[key]
    )
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
            f"{non_finite_message(model_args.model_name_or_path, bad)}: training cannot recover them; start from a "
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


def named_tokenizer_for_saved_model(model_args: ModelArguments, task: str) -> PreTrainedTokenizerFast | None:
    """The tokenizer of ``--tokenizer_name`` for the saved model of ``--model_name_or_path`` (None unless both are
    given), loaded and checked before anything is written: the model's embeddings are rows of the vocabulary it
    was trained with, so a tokenizer of another size, other special ids or another vocabulary would train (or
    score) a model reading every token as another one.

    Raises:
        ValueError: what does not fit (both sizes, the special ids, the vocabulary) and the fix.
    """
    named, model = model_args.tokenizer_name, model_args.model_name_or_path
    if not (named and model):
        return None
    if not (Path(named) / "tokenizer.json").is_file():
        raise ValueError(
            f"--tokenizer_name {named} holds no tokenizer.json: with --model_name_or_path it must name the folder of "
            f"a saved tokenizer, the one {model} was trained with; leave it out to use {model}'s own tokenizer"
        )
    check_tokenizer_files(named)
    check_tokenizer_shapes(named)
    tokenizer = AutoTokenizer.from_pretrained(named)
    check_task_tokenizer(tokenizer, get_task(task).is_lm, named)
    check_tokenizer_fits_model(tokenizer, named, model)
    logger.info("using the tokenizer in %s (%d tokens) with %s", named, len(tokenizer), model)
    return tokenizer


_MODEL_SPECIAL_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")


def check_tokenizer_fits_model(
    tokenizer: PreTrainedTokenizerBase, where: str, model_name_or_path: str
) -> None:
    """Refuse ``tokenizer`` (from ``where``) for the saved model of ``model_name_or_path`` unless its size is the
    model's ``vocab_size``, its pad/bos/eos ids are the config's, and (where the model folder holds its own
    tokenizer) its vocabulary is that tokenizer's.

    Raises:
        ValueError: what differs, both values, and the fix.
    """
    config = ode_model_config(model_name_or_path)
    fix = (
        f"leave --tokenizer_name out to use {model_name_or_path}'s own tokenizer, or leave --model_name_or_path "
        f"out to train a new model with the tokenizer in {where}"
    )
    size = config.get("vocab_size")
    if len(tokenizer) != size:
        raise ValueError(
            f"the tokenizer in {where} has {len(tokenizer)} tokens, and {model_name_or_path} was trained with a "
            f"{size}-token vocabulary (its embeddings are rows of that vocabulary); {fix}"
        )
    differing = [
        f"{name} {getattr(tokenizer, name)} (the model's: {config[name]})"
        for name in _MODEL_SPECIAL_IDS
        if getattr(tokenizer, name) is not None
        and config.get(name) is not None
        and getattr(tokenizer, name) != config[name]
    ]
    if differing:
        raise ValueError(
            f"the tokenizer in {where} has other special ids than {model_name_or_path}/config.json: "
            f"{', '.join(differing)}; {fix}"
        )
    own = _own_tokenizer_vocabulary(model_name_or_path)
    if own is not None and own != tokenizer.get_vocab():
        moved = sum(1 for token, index in tokenizer.get_vocab().items() if own.get(token) != index)
        raise ValueError(
            f"the tokenizer in {where} has another vocabulary than {model_name_or_path}'s own tokenizer ({moved} "
            f"of its {len(tokenizer)} tokens have another id or are not in it); {fix}"
        )


def _own_tokenizer_vocabulary(model_name_or_path: str) -> dict[str, int] | None:
    """The vocabulary of the tokenizer saved in a local model folder, None where it holds none (or is a Hub id)."""
    if not (Path(model_name_or_path) / "tokenizer.json").is_file():
        return None
    return load_model_tokenizer(model_name_or_path).get_vocab()


def check_fresh_model_tokenizer(
    tokenizer: PreTrainedTokenizerBase, model_args: ModelArguments, output_dir: str
) -> None:
    """A tokenizer a new model is built on (``len(tokenizer)`` is its vocabulary) holds enough tokens to write text
    (:func:`ode_transformer.tokenizer.check_vocabulary_size`): a broken folder, reused, would build a model of a
    handful of tokens without a word."""
    if model_args.tokenizer_name:
        where = model_args.tokenizer_name
        fix = "name a folder that holds a whole tokenizer, or leave --tokenizer_name out to train one"
    else:
        where = f"{output_dir}/tokenizer"
        fix = f"delete {where} to train a new one (with a --vocab_size of a few thousand)"
    check_vocabulary_size(tokenizer, where, fix)


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
        # an exported folder's, which a saved checkpoint does not carry
        "weights_digest",
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
    tokenizer (as the run has fitted it) saves is compared, as JSON, with the checkpoint's own copy. A
    tokenizer of ``folder`` edited between a kill and the resume (another BPE of the same size, a changed
    normalizer, an edited ``eos_token``) would otherwise resume and train another model, or be refused as
    "another model configuration", naming neither the file nor the fix.

    A checkpoint of ode-train holds a copy of each file (the trainer saves its tokenizer with it), so a file
    missing beside the others was lost from it, and is refused too: what it held cannot be compared. A
    checkpoint with no tokenizer file at all (saved by a Trainer given no tokenizer) has nothing to compare
    with: it resumes, with a warning that says so.

    Raises:
        ValueError: the files that differ, or that the checkpoint lacks, ``folder`` and the fix.
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ode-tokenizer-") as scratch:
        tokenizer.save_pretrained(scratch)
        saved = sorted(Path(scratch).iterdir())
        missing = [path.name for path in saved if not (Path(checkpoint) / path.name).is_file()]
        differing = [
            path.name
            for path in saved
            if path.name not in missing and _file_content(path) != _file_content(Path(checkpoint) / path.name)
        ]
    new_run = "start a new run with this tokenizer (--overwrite_output_dir true, or another --output_dir)"
    if len(missing) == len(saved):
        logger.warning(
            "%s holds no tokenizer files, so the tokenizer in %s cannot be compared with the one it was trained "
            "with; resuming with it",
            checkpoint,
            folder,
        )
        return
    if differing:
        raise ValueError(
            f"the tokenizer in {folder} is not the one {checkpoint} was trained with: its {', '.join(differing)} "
            f"differ from the checkpoint's copies; copy them from {checkpoint} back into {folder} to resume, or "
            f"{new_run}"
        )
    if missing:
        names = ", ".join(missing)
        raise ValueError(
            f"{checkpoint} has no copy of the tokenizer's {names} (every checkpoint saves one), so the tokenizer "
            f"in {folder} cannot be shown to be the one it was trained with; resume from a checkpoint that holds "
            f"it (--resume_from_checkpoint FOLDER), copy {names} from {folder} into {checkpoint} if that is the "
            f"run's tokenizer, or {new_run}"
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


@contextmanager
def cache_on(model) -> Iterator[None]:
    """``model.config.use_cache`` true inside the block, the class default, which generation wants: the Trainer
    sets it to its ``--use_cache`` (false by default) for training, and the saved config.json kept that."""
    config = getattr(model, "config", None)
    if config is None:
        yield
        return
    saved, config.use_cache = config.use_cache, True
    try:
        yield
    finally:
        config.use_cache = saved


def load_state(model, state: dict, source) -> None:
    """Load ``state`` (a safetensors file's tensors, tied weights stored once) into ``model``."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded = {params[key].data_ptr() for key in state if key in params}
    untied = [key for key in missing if key not in params or params[key].data_ptr() not in loaded]
    if unexpected or untied:  # keys left out of the safetensors file must be tied to loaded ones
        raise ValueError(f"{source} does not fit the model: missing {untied}, unexpected {unexpected}")
