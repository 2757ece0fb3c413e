"""Train and evaluate an ODE Transformer: ``python -m train.run [RECIPE.yaml] [--flag value ...]``.

One entry point for the four tasks of the paper (``--task translation|summarization|gec|lm``) on
:class:`~transformers.Seq2SeqTrainer` / :class:`~transformers.Trainer`. Arguments are the fields of
:class:`ModelArguments`, :class:`DataArguments`, :class:`RunArguments` and
:class:`~transformers.Seq2SeqTrainingArguments`, read by :class:`~transformers.HfArgumentParser`;
a YAML/JSON recipe given first supplies defaults that flags on the command line override::

    python -m train.run train/recipes/multi30k_en_de_cpu.yaml --max_steps 200
    accelerate launch -m train.run train/recipes/wmt14_en_de_base.yaml   # GPUs; FSDP/DeepSpeed via accelerate config
    accelerate launch --multi_gpu --num_processes 2 -m train.run RECIPE --use_cpu true  # 2 CPU processes, gloo

A run: load the data (a shared corpus, local files or a Hub dataset, optionally streamed), train
or reuse a joint BPE tokenizer, tokenise, build the model from a preset plus overrides, train
with token-budget batches (resumable: ``--resume_from_checkpoint last``), optionally average the
last checkpoints, then on the test split write the hypotheses, ``hub_metrics.json`` (the schema of
:mod:`hub.model_card`), ``loss_curves.png`` and the model card. Everything lands in
``--output_dir``: the model with its tokenizer and generation config (the paper's decoding
defaults), checkpoints, TensorBoard logs (``runs/``).

``--do_train/--do_eval/--do_predict`` select the steps as in transformers' ``run_translation.py``
(default: train and test); ``--do_train false --model_name_or_path MODEL --test_file ...`` evaluates a
saved model and writes only the hypotheses and metrics. The test split is decoded by
:mod:`train.translate` in fp32 on the plain model, so the reported score is that of ``python -m
train.translate`` and of plain ``model.generate`` on the saved folder.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path
from typing import Literal

import datasets
import torch
import yaml
from datasets import Dataset, DatasetDict, IterableDataset, concatenate_datasets
from safetensors.torch import load_file
from transformers import (
    EarlyStoppingCallback,
    GenerationConfig,
    HfArgumentParser,
    PreTrainedTokenizerFast,
    Seq2SeqTrainingArguments,
    TrainerCallback,
    TrainerState,
    set_seed,
)

from modeling_ode import (
    PAPER_DECODING,
    PAPER_LABEL_SMOOTHING,
    PRESETS,
    ODETransformerConfig,
    ODETransformerForCausalLM,
    ODETransformerForConditionalGeneration,
    fit_tokenizer_to_model,
    non_finite_tensors,
)
from ode_transformer.cli import program_name, report_interrupt, report_user_error

from . import metrics
from .batching import seq2seq_lengths
from .card import metrics_document, write_card
from .checkpoints import (
    FINAL_MODEL_STAGING,
    LOCK_FILES,
    STAGING,
    TRAINER_STATE,
    WEIGHTS,
    check_checkpoint_pickles,
    complete_checkpoints,
    lock_output_dir,
    missing_part,
    read_run_id,
    remove_staging,
)
from .data import (
    DataSpec,
    MissingCorpusError,
    conll2013_test,
    load_hub_dataset,
    load_local_file,
    load_task_data,
)
from .files import clear_folder, read_lines, refuse_occupied, replacing, saving, write_atomic
from .precision import PRECISIONS, accelerator_present, choose_precision, emulated_bf16_warning
from .tokenizer import check_task_tokenizer, load_or_train_tokenizer, truncated_rows
from .trainer import (
    PadCollator,
    TokenBudgetSeq2SeqTrainer,
    TokenBudgetTrainer,
    fp32_forward,
    lm_negative_log_likelihood,
)
from .translate import (
    check_model_folder,
    decode,
    generate_ids,
    load_model_tokenizer,
    load_saved_model,
    ode_model_config,
)

logger = logging.getLogger(__name__)

TASKS = ("translation", "summarization", "gec", "lm")
DEFAULT_LENGTH = 256  # --max_source_length / --max_target_length of a new model
TOKENIZER_SAMPLE = 200_000  # streamed examples the tokenizer is trained on
RECIPES = Path(__file__).resolve().parent / "recipes"  # packaged with the install
# Config fields a fine-tuning run may change in a saved model (regularisation, not the model's shape or its
# parameters' meaning); every other model flag is refused with --model_name_or_path where it differs.
TRAINING_FIELDS = ("dropout", "attention_dropout", "activation_dropout")


@dataclass
class ModelArguments:
    """The model: a preset of :class:`ODETransformerConfig` plus overrides, and the tokenizer."""

    _argument_group_name = "model"

    preset: str = field(
        default="base", metadata={"help": "tiny, base, deep, big, big_deep, pcformer_rk2, pcformer_rk4"}
    )
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "start from a saved model folder or Hub id, with its own tokenizer"}
    )
    upcycle: bool = field(
        default=False,
        metadata={
            "help": "convert the --model_name_or_path model (a residual ODE Transformer) to this run's ODE blocks "
            "(--encoder_ode_method, --config_overrides, ...) before training; RK blocks start as its residual "
            "blocks (ODETransformerForConditionalGeneration.from_residual; hub.upcycle converts M2M100/NLLB-200)"
        },
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={
            "help": "tokenizer folder: reused if it has one, else trained there (default OUTPUT_DIR/tokenizer)"
        },
    )
    vocab_size: int = field(
        default=8000, metadata={"help": "vocabulary size (specials included) when a tokenizer is trained"}
    )
    tokenizer_type: str = field(
        default="bpe",
        metadata={"help": "bpe (joint byte-level BPE) or word (word-level, e.g. Penn Treebank's 10k words)"},
    )
    d_model: int | None = None
    encoder_layers: int | None = None
    decoder_layers: int | None = None
    encoder_ffn_dim: int | None = None
    decoder_ffn_dim: int | None = None
    encoder_attention_heads: int | None = None
    decoder_attention_heads: int | None = None
    dropout: float | None = None
    attention_dropout: float | None = None
    activation_dropout: float | None = None
    encoder_ode_method: str | None = field(default=None, metadata={"help": "euler, rk2, rk4, ..."})
    decoder_ode_method: str | None = None
    encoder_ode_coefficients: str | None = field(
        default=None, metadata={"help": "tableau, gated, learnable, ..."}
    )
    decoder_ode_coefficients: str | None = None
    encoder_ode_function: str | None = field(
        default=None, metadata={"help": "layer, attention, ffn, sublayers"}
    )
    decoder_ode_function: str | None = None
    encoder_layer_connections: str | None = field(default=None, metadata={"help": "residual, dense, ..."})
    decoder_layer_connections: str | None = None
    max_relative_position: int | None = None
    config_overrides: str | None = field(
        default=None, metadata={"help": "JSON object of further config fields"}
    )

    def overrides(self) -> dict:
        """Config fields set on the command line / in the recipe (``None`` = preset value)."""
        skip = {
            "preset",
            "model_name_or_path",
            "upcycle",
            "tokenizer_name",
            "vocab_size",
            "tokenizer_type",
            "config_overrides",
        }
        chosen = {k: v for k, v in asdict(self).items() if k not in skip and v is not None}
        try:
            extra = json.loads(self.config_overrides or "{}")
        except json.JSONDecodeError as error:
            raise ValueError(
                f"--config_overrides {self.config_overrides!r} is not JSON ({error.msg} at column {error.colno}); "
                "quote names and strings: '{\"d_model\": 32}'"
            ) from None
        if not isinstance(extra, dict):
            raise ValueError(
                f"--config_overrides must be a JSON object of config fields, got {self.config_overrides!r}"
            )
        return {**chosen, **extra}

    def task_overrides(self, task: str) -> dict:
        """:meth:`overrides` with what a task fixes (``lm``: a decoder-only model without label smoothing)."""
        if task == "lm":
            return {"is_encoder_decoder": False, **self.overrides()}
        return self.overrides()


@dataclass
class DataArguments:
    """Where the data comes from and how it is cut into batches."""

    _argument_group_name = "data"

    dataset: str | None = field(
        default=None,
        metadata={
            "help": "shared corpus: multi30k, libreoffice, cnndm, wi_locness, fce, ptb; '+' joins training sets"
        },
    )
    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "folder of the shared corpora (default: $ODE_DATA_DIR, else ../shared/data of a clone)"
        },
    )
    hub_dataset: str | None = field(default=None, metadata={"help": "Hub id or local dataset folder"})
    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "the data's name on the model card (default: the shared corpus's, or the Hub id; local files "
            "and folders are never named by their path)"
        },
    )
    hub_config: str | None = None
    source_lang: str | None = field(
        default=None, metadata={"help": "Hub dataset: language (or column) of the source"}
    )
    target_lang: str | None = None
    train_file: str | None = field(
        default=None,
        metadata={"help": "'SRC,TGT' aligned text files, or a .tsv/.jsonl file (text file for lm)"},
    )
    validation_file: str | None = None
    test_file: str | None = None
    source_column: str = field(
        default="source",
        metadata={
            "help": "TSV column or JSONL field of the source; a.b reads key b of field a (translation.en)"
        },
    )
    target_column: str = field(default="target", metadata={"help": "the same, of the target"})
    m2_file: str | None = field(
        default=None,
        metadata={"help": "GEC: M2 file of the test split (default: CoNLL-2013 when there is no test split)"},
    )
    streaming: bool = field(
        default=False,
        metadata={
            "help": "stream the training split (needs max_steps; batched by sentences, not max_tokens)"
        },
    )
    max_source_length: int | None = field(
        default=None,
        metadata={"help": "tokens per source (default 256; a saved model's: its tokenizer's limit)"},
    )
    max_target_length: int | None = field(
        default=None,
        metadata={
            "help": "tokens per target and per hypothesis (default 256; a saved model's: its generation config's)"
        },
    )
    max_tokens: int | None = field(default=None, metadata={"help": "token budget per batch and process"})
    max_train_tokens: int | None = field(
        default=None,
        metadata={
            "help": "drop training pairs with more tokens (</s> included) on either side, instead of truncating them"
        },
    )
    word_dropout: float = field(default=0.0, metadata={"help": "source word dropout in training (GEC)"})
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    max_test_samples: int | None = None


@dataclass
class RunArguments:
    """The task and what happens around training."""

    _argument_group_name = "run"

    task: str = field(default="translation", metadata={"help": "translation, summarization, gec, lm"})
    num_beams: int | None = field(default=None, metadata={"help": "default per task (paper): 4 / 4 / 6"})
    length_penalty: float | None = field(
        default=None, metadata={"help": "default per task (paper): 0.6 / 2.0 / 0.6"}
    )
    average_last_checkpoints: int = field(
        default=0, metadata={"help": "average the last N checkpoints before testing"}
    )
    time_budget_minutes: float | None = field(
        default=None, metadata={"help": "stop training after this long"}
    )
    early_stopping_patience: int | None = field(
        default=None,
        metadata={
            "help": "stop once --metric_for_best_model has not improved for this many evaluations "
            "(needs an --eval_strategy, and --load_best_model_at_end to keep the best)"
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "delete what --output_dir holds first (else a non-empty one is refused unless resuming)"
        },
    )
    precision: str = field(
        default="auto",
        metadata={
            "help": "auto: bf16 autocast where the device computes bf16 natively (CUDA from Ampere on, CPUs with "
            "AVX512_BF16/AMX), else fp32; or bf16, fp32. --bf16 true / --fp16 true are taken as asked"
        },
    )


ALL_ARGUMENTS = (ModelArguments, DataArguments, RunArguments, Seq2SeqTrainingArguments)
GROUP_TITLES = ("model", "data", "run")  # the ``_argument_group_name`` of our three dataclasses


# --------------------------------------------------------------------------------------------
# Arguments


def build_parser() -> HfArgumentParser:
    """The parser: ``[RECIPE.yaml]``, then our model/data/run groups, then transformers' training arguments.

    Without ``--do_train/--do_predict`` a run trains and tests (``--do_train false --do_predict`` evaluates
    ``--model_name_or_path``); ``--do_eval`` (on whenever ``--eval_strategy`` is set) evaluates the
    validation split at the end, as in transformers' ``run_translation.py``.
    """
    parser = HfArgumentParser(
        ALL_ARGUMENTS,
        prog=program_name(__spec__.name),
        usage="%(prog)s [RECIPE] [--flag value ...]",
        description="Train and evaluate an ODE Transformer. A YAML/JSON recipe given first supplies defaults; "
        "flags override them.",
    )
    parser.add_argument(
        "recipe",
        metavar="RECIPE",
        nargs="?",
        help="recipe of flag defaults, read first: a YAML/JSON file or a packaged recipe's name "
        "(e.g. multi30k_en_de_cpu; --list-recipes lists them)",
    )
    parser.add_argument(
        "--list-recipes", "--list_recipes", action="store_true", help="list the packaged recipes"
    )
    first = [
        group for group in parser._action_groups if group.title in ("positional arguments", *GROUP_TITLES)
    ]
    parser._action_groups = [*first, *(group for group in parser._action_groups if group not in first)]
    for group in parser._action_groups:
        if group.title == "options":
            group.title = "transformers Seq2SeqTrainingArguments"
    parser.set_defaults(do_train=True, do_predict=True)
    return parser


class RecipeNotFoundError(FileNotFoundError):
    """RECIPE is neither a file nor a packaged recipe."""


class RecipeError(ValueError):
    """RECIPE is not a mapping of flags to values of their types (a YAML error, an unknown key, a list for a number)."""


def recipe_names() -> list[str]:
    """The packaged recipes (``train/recipes/*.yaml``), by name."""
    return sorted(path.stem for path in RECIPES.glob("*.yaml"))


def find_recipe(name: str) -> Path:
    """A recipe file: ``name`` if it is a file, else the packaged recipe of that name (``.yaml`` optional)."""
    path = Path(name)
    if path.is_file():
        return path
    packaged = RECIPES / (name if path.suffix in (".yaml", ".yml", ".json") else f"{name}.yaml")
    if path.parent == Path(".") and packaged.is_file():
        return packaged
    raise RecipeNotFoundError(
        f"no recipe {name!r}: give a YAML/JSON file or a packaged recipe ({', '.join(recipe_names())})"
    )


def _list_recipes() -> None:
    for name in recipe_names():
        print(f"{name:<24} {RECIPES / f'{name}.yaml'}")


def read_recipe(path: Path) -> dict:
    """A recipe's flags and values; YAML (or JSON) that does not parse, or is not a mapping, is refused by name.

    Raises:
        RecipeError: the file, where it stops parsing, and the fix.
    """
    try:
        recipe = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise RecipeError(
            f"recipe {path} is not valid YAML ({problem}{where}); fix it: one `flag: value` per line, e.g. "
            "`learning_rate: 0.0005`"
        ) from None
    if recipe is None:
        return {}
    if not isinstance(recipe, dict):
        raise RecipeError(
            f"recipe {path} holds a {type(recipe).__name__}, not a mapping of flags to values: write one "
            "`flag: value` per line, e.g. `learning_rate: 0.0005`"
        )
    return recipe


def check_recipe_values(parser: HfArgumentParser, recipe: dict, path: Path) -> None:
    """Refuse a recipe key that is no flag, and a value the flag's type does not take: argparse converts a
    default only when it is a string, so ``learning_rate: [0.1]`` reached transformers as a list (a TypeError
    deep inside it).

    Raises:
        RecipeError: the file, the key, its value and what the flag takes.
    """
    actions = {action.dest: action for action in parser._actions}
    unknown = sorted(set(recipe) - set(actions))
    if unknown:
        raise RecipeError(
            f"recipe {path}: unknown keys {unknown}; `{program_name(__spec__.name)} --help` lists the flags"
        )
    for key, value in recipe.items():
        action = actions[key]
        many = action.nargs in ("+", "*")
        if value is None or (isinstance(value, str) and not many):
            continue  # a string is converted (and checked) by argparse, as on the command line
        if isinstance(value, dict) or (isinstance(value, list) and not many):
            raise RecipeError(
                f"recipe {path}: {key}: {value!r} is a {type(value).__name__}; give one value (`{key}: VALUE`)"
            )
        for item in value if isinstance(value, list) else [value]:
            try:
                converted = action.type(str(item)) if action.type is not None else item
                valid = not action.choices or converted in action.choices
            except (ValueError, TypeError, argparse.ArgumentTypeError):
                valid = False
            if not valid:
                takes = (
                    f"one of {list(action.choices)}"
                    if action.choices
                    else getattr(action.type, "__name__", "value")
                )
                raise RecipeError(f"recipe {path}: {key}: {item!r} is not a valid {key} (it takes {takes})")


def parse_arguments(argv: list[str] | None = None) -> tuple:
    """Parse ``[RECIPE] [--flag value ...]`` into the four argument dataclasses; RECIPE is a YAML/JSON file or
    a packaged recipe's name. ``--list-recipes`` prints the packaged recipes and exits."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if {"--list-recipes", "--list_recipes"} & set(argv):
        _list_recipes()
        raise SystemExit(0)
    if argv and not argv[0].startswith("-"):
        path = find_recipe(argv.pop(0))
        recipe = read_recipe(path)
        check_recipe_values(parser, recipe, path)
        parser.set_defaults(**recipe)
    else:
        recipe = {}
    argv += _cpu_only_flags(argv, recipe)
    model_args, data_args, run_args, training_args, positional = _resolve_precision(
        parser, argv, recipe, parser.parse_args_into_dataclasses(args=argv)
    )
    if positional.recipe is not None:
        raise ValueError(f"the recipe {positional.recipe} must come first, before the flags")
    if run_args.task not in TASKS:
        raise ValueError(f"--task must be one of {TASKS}, got {run_args.task!r}")
    for flag in ("max_source_length", "max_target_length"):
        length = getattr(data_args, flag)
        if length is not None and length <= 0:
            raise ValueError(f"--{flag} must be a positive number of tokens, got {length}")
        if length is None and not model_args.model_name_or_path:  # else: resolve_lengths
            setattr(data_args, flag, DEFAULT_LENGTH)
    if not model_args.model_name_or_path:
        _check_max_train_tokens(data_args)
    if data_args.streaming and training_args.max_steps <= 0:
        raise ValueError("--streaming needs --max_steps (a stream has no length)")
    # both need the whole split: lengths to bucket, rows to count
    for flag in ("max_tokens", "max_train_samples"):
        if data_args.streaming and getattr(data_args, flag) is not None:
            # a warning, not an error: every recipe sets max_tokens, and a flag cannot unset it
            logger.warning(
                "--%s %s does not apply to a stream, which is batched by --per_device_train_batch_size sentences "
                "and read to --max_steps: ignored", flag, getattr(data_args, flag),
            )  # fmt: skip
            setattr(data_args, flag, None)
    if model_args.upcycle and (not model_args.model_name_or_path or run_args.task == "lm"):
        raise ValueError(
            "--upcycle true converts the seq2seq model of --model_name_or_path to this run's ODE blocks: give that "
            "folder, and a seq2seq --task (translation, summarization, gec)"
        )
    if not training_args.do_train and not model_args.model_name_or_path:
        raise ValueError(
            "--do_train false evaluates a trained model: give its folder with --model_name_or_path"
        )
    for flag in ("max_train_samples", "max_eval_samples", "max_test_samples"):
        value = getattr(data_args, flag)
        if value is not None and value < 1:  # a slice [:-1] or [:0], not a limit
            raise ValueError(
                f"--{flag} must be a positive number of examples, got {value}; leave it out for all"
            )
    if data_args.max_tokens is not None and data_args.max_tokens <= 0:
        raise ValueError(
            f"--max_tokens must be a positive token budget per batch, got {data_args.max_tokens}"
        )
    if run_args.num_beams is not None and run_args.num_beams <= 0:
        raise ValueError(f"--num_beams must be a positive number of beams, got {run_args.num_beams}")
    metric = (training_args.metric_for_best_model or "loss").removeprefix("eval_")
    evaluated = metrics.evaluation_metrics(run_args.task, training_args.predict_with_generate)
    if metric not in evaluated:  # transformers would fail at the first evaluation, after training up to it
        model = "a language model" if run_args.task == "lm" else f"a {run_args.task} model"
        unlocked = sorted(set(metrics.evaluation_metrics(run_args.task, generate=True)) - set(evaluated))
        raise ValueError(
            f"--metric_for_best_model {metric}: {model}'s evaluation gives {', '.join(evaluated)}; choose one"
            + (f" (or {', '.join(unlocked)} with --predict_with_generate true)" if unlocked else "")
        )
    if run_args.early_stopping_patience and (
        not training_args.metric_for_best_model or training_args.eval_strategy == "no"
    ):
        raise ValueError(
            "--early_stopping_patience needs --metric_for_best_model (e.g. loss) and --load_best_model_at_end true, "
            "with an --eval_strategy to compare the evaluations"
        )
    if (
        run_args.average_last_checkpoints > 1
        and training_args.do_train
        and training_args.save_strategy == "no"
    ):
        raise ValueError(
            f"--average_last_checkpoints {run_args.average_last_checkpoints} averages saved checkpoints, but "
            "--save_strategy no saves none; give --save_strategy steps --save_steps N, or leave averaging out"
        )
    if (
        run_args.average_last_checkpoints > 1
        and training_args.save_total_limit is not None
        and training_args.save_total_limit < run_args.average_last_checkpoints
    ):
        raise ValueError(
            f"--average_last_checkpoints {run_args.average_last_checkpoints} averages saved checkpoints, but "
            f"--save_total_limit {training_args.save_total_limit} keeps fewer; raise --save_total_limit to at least "
            f"{run_args.average_last_checkpoints}, or average fewer"
        )
    if run_args.overwrite_output_dir and training_args.do_train:  # only a training run clears its folder
        _refuse_to_delete_inputs(args=(model_args, data_args, run_args, training_args))
    _label_smoothing(run_args.task, training_args, argv, recipe)
    if model_args.model_name_or_path and _given("preset", argv, recipe):
        check_saved_model_preset(model_args, run_args.task)
    if (
        model_args.model_name_or_path and not model_args.upcycle
    ):  # upcycling takes block flags (from_residual)
        check_saved_model_flags(model_args, run_args.task)
    if not model_args.model_name_or_path:  # a misspelt preset or field, bad sizes: before data and tokenizer
        # the vocabulary as the tokenizer will have it (build_model sets the tokenizer's actual size)
        checked = {"vocab_size": model_args.vocab_size, **model_args.task_overrides(run_args.task)}
        ODETransformerConfig.from_preset(model_args.preset, **checked)
    return model_args, data_args, run_args, training_args


def _given(flag: str, argv: list[str], recipe: dict) -> bool:
    """Whether ``--flag`` was set by the user, on the command line or in the recipe."""
    return flag in recipe or any(arg == f"--{flag}" or arg.startswith(f"--{flag}=") for arg in argv)


def _cpu_only_flags(argv: list[str], recipe: dict) -> list[str]:
    """``--use_cpu true`` on a machine without an accelerator, unless the user set it: the Trainer runs on the CPU
    there anyway, and transformers refuses bf16 without a GPU unless told so (auto picks bf16 on a CPU with native
    bf16, and a recipe or ``--bf16`` may ask for it). An accelerator's path is unchanged."""
    if _given("use_cpu", argv, recipe) or accelerator_present():
        return []
    return ["--use_cpu", "true"]


def _resolve_precision(parser: HfArgumentParser, argv: list[str], recipe: dict, parsed: tuple) -> tuple:
    """``--precision auto`` becomes bf16 where the device computes it natively, else fp32 (train.precision);
    an explicit ``--bf16``/``--fp16`` is taken as asked, with a warning where bf16 would be emulated. The
    arguments are parsed again with ``--bf16 true`` rather than patched, so transformers derives its mixed
    precision settings from the flag as usual. ``run_args.precision`` ends as what was asked (auto, bf16, fp16,
    fp32): :func:`train.precision.choose_precision` gives the same choice from it anywhere later."""
    run_args, training_args = parsed[2], parsed[3]
    if run_args.precision not in PRECISIONS:
        raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}, got {run_args.precision!r}")
    if _given("bf16", argv, recipe) or _given("fp16", argv, recipe):
        asked = "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32"
        if run_args.precision not in ("auto", asked):
            raise ValueError(
                f"--precision {run_args.precision} and {'--bf16' if asked == 'bf16' else '--fp16'} "
                f"{'true' if asked != 'fp32' else 'false'} disagree: give one of them"
            )
        run_args.precision = asked
    elif run_args.precision != "fp32" and choose_precision(training_args.device, run_args.precision).bf16:
        parsed = parser.parse_args_into_dataclasses(args=[*argv, "--bf16", "true"])
        run_args, training_args = parsed[2], parsed[3]
    choice = choose_precision(training_args.device, run_args.precision)
    if warning := emulated_bf16_warning(choice):
        logger.warning(warning)
    logger.info("precision: %s", choice.describe())
    return parsed


def _check_max_train_tokens(data_args: DataArguments) -> None:
    longest = min(data_args.max_source_length, data_args.max_target_length)
    if data_args.max_train_tokens is not None and not 0 < data_args.max_train_tokens < longest:
        raise ValueError(
            f"--max_train_tokens {data_args.max_train_tokens} must be positive and below --max_source_length/"
            f"--max_target_length ({longest}): longer sides are truncated to those before the filter counts them"
        )


def target_length(generation: GenerationConfig) -> int | None:
    """The most tokens an encoder-decoder's generation config lets an output have: ``max_length`` less the start
    token (what this project saves, as BART does), or the ``max_new_tokens`` of folders saved before it."""
    if generation.max_new_tokens is not None:
        return generation.max_new_tokens
    return generation.max_length - 1 if generation.max_length is not None else None


def resolve_lengths(data_args: DataArguments, tokenizer: PreTrainedTokenizerFast, saved_model: str) -> None:
    """The lengths a saved model was trained and decodes with, where the flags leave them unset: its tokenizer's
    ``model_max_length`` (the source limit its run saved) and its generation config's output length (:func:`target_length`), so that
    ``--do_train false`` scores the hypotheses ``train.translate`` writes."""
    if data_args.max_source_length is None:
        limit = tokenizer.model_max_length  # transformers' 1e30 where none was saved
        data_args.max_source_length = limit if limit < 1_000_000 else DEFAULT_LENGTH
    if data_args.max_target_length is None:
        try:
            new_tokens = target_length(GenerationConfig.from_pretrained(saved_model))
        except OSError:  # a folder without generation_config.json
            new_tokens = None
        data_args.max_target_length = new_tokens or DEFAULT_LENGTH
    _check_max_train_tokens(data_args)


def _refuse_to_delete_inputs(args: tuple) -> None:
    """``--overwrite_output_dir`` deletes what the output folder holds: never the run's own inputs (data, model,
    tokenizer, M2 file) or the folder the command runs in."""
    model_args, data_args, _, training_args = args
    out = Path(training_args.output_dir).resolve()
    named = [model_args.model_name_or_path, model_args.tokenizer_name, data_args.m2_file, data_args.data_dir]
    for spec in (data_args.train_file, data_args.validation_file, data_args.test_file):
        named += [spec, *spec.split(",")] if spec else []
    for name in filter(None, named):
        path = Path(name).resolve()
        if path.exists() and (path == out or out in path.parents):
            raise ValueError(
                f"--overwrite_output_dir would delete {name}, an input of this run, inside --output_dir "
                f"{training_args.output_dir}; write the run to another folder"
            )
    if out == Path.cwd().resolve() or out in Path.cwd().resolve().parents:
        raise ValueError(
            f"--overwrite_output_dir would delete the current folder's contents (--output_dir "
            f"{training_args.output_dir}); write the run to a folder of its own"
        )


def _label_smoothing(
    task: str, training_args: Seq2SeqTrainingArguments, argv: list[str], recipe: dict
) -> None:
    """The model returns plain cross entropy (as BART and Marian do); label smoothing is the Trainer's
    ``--label_smoothing_factor``: by default the paper's 0.1, and 0 for ``--task lm``. transformers shifts the
    labels of a smoothed loss only for its own causal LMs, so a smoothed ODE language model is refused."""
    if not _given("label_smoothing_factor", argv, recipe):
        training_args.label_smoothing_factor = 0.0 if task == "lm" else PAPER_LABEL_SMOOTHING
    elif task == "lm" and training_args.label_smoothing_factor:
        raise ValueError(
            f"--label_smoothing_factor {training_args.label_smoothing_factor} with --task lm: transformers' label "
            "smoother would not shift a causal LM's labels; leave it out (the paper's language models use none)"
        )


# --------------------------------------------------------------------------------------------
# Data


def _shared_corpus(names: str, kind: Literal["seq2seq", "lm"], data_args: DataArguments) -> DatasetDict:
    """A shared corpus; ``a+b`` concatenates the training splits (other splits from ``a``)."""
    parts = [
        load_task_data(
            kind,
            DataSpec(
                "shared",
                name,
                source_lang=data_args.source_lang,
                target_lang=data_args.target_lang,
                # libreoffice is built locally in its own cache folder, not read from the shared data
                root=data_args.data_dir if name != "libreoffice" else None,
            ),
        )
        for name in names.split("+")
    ]
    result = parts[0]
    if len(parts) > 1:
        result["train"] = concatenate_datasets([part["train"] for part in parts])
    return result


def load_raw_data(data_args: DataArguments, task: str) -> tuple[DatasetDict, str | None]:
    """Raw ``train``/``validation``/``test`` splits and, for GEC, the test split's M2 file.

    Without a test split: GEC tests on CoNLL-2013 (M2-scored), the others on the validation split.
    """
    kind = "lm" if task == "lm" else "seq2seq"
    if data_args.dataset:
        raw = _shared_corpus(data_args.dataset, kind, data_args)
    elif data_args.hub_dataset:  # streamed, the training split is read by streaming_train_split
        spec = DataSpec(
            "hub", data_args.hub_dataset, data_args.hub_config, data_args.source_lang, data_args.target_lang
        )
        raw = load_task_data(kind, spec, without_train=data_args.streaming)
    else:
        raw = DatasetDict()
    for split, spec in (
        ("train", data_args.train_file),
        ("validation", data_args.validation_file),
        ("test", data_args.test_file),
    ):
        if spec:  # evaluation splits keep every line: the hypotheses stay aligned with the inputs
            raw[split] = load_local_file(
                spec, kind, data_args.source_column, data_args.target_column, skip_empty=split == "train"
            )
    m2_file = data_args.m2_file
    if task == "gec" and "test" not in raw:
        raw["test"], conll_m2 = conll2013_test(data_args.data_dir)
        m2_file = m2_file or str(conll_m2)
    if task == "gec" and m2_file and "test" in raw:
        check_m2_aligned(m2_file, raw["test"].num_rows)
    if "test" not in raw and "validation" in raw:
        raw["test"] = raw["validation"]
    return raw, m2_file


def check_m2_aligned(m2_file: str, test_rows: int) -> None:
    """The M2 scorer pairs the i-th hypothesis with the i-th M2 sentence: the test split must have one row each."""
    sentences = len(metrics.parse_m2(read_lines(m2_file), m2_file))
    if sentences != test_rows:
        raise ValueError(
            f"{m2_file} has {sentences} sentences but the test split has {test_rows} rows (blank lines count: "
            "remove a trailing empty line); give the M2 file of this test set, one sentence per source line."
        )


def _slice(dataset: Dataset, limit: int | None) -> Dataset:
    return dataset if limit is None else dataset.select(range(min(limit, len(dataset))))


def _has_example(dataset: Dataset) -> bool:
    """Whether one row has text to learn or score: a non-blank ``text``, or a non-blank source and target.
    Evaluation splits keep their blank rows (to stay aligned), so an all-blank split has rows but no example."""

    def is_text(value: object) -> bool:
        return isinstance(value, str) and bool(value.strip())

    columns = ["text"] if "text" in dataset.column_names else ["source", "target"]
    # in batches: stops at the first example instead of reading a large training split into memory
    for batch in dataset.select_columns(columns).iter(batch_size=10_000):
        if any(all(map(is_text, row)) for row in zip(*(batch[column] for column in columns))):
            return True
    return False


def check_splits_not_empty(splits: dict, data_args: DataArguments) -> None:
    """Refuse a split without examples before training (an empty validation or test split would only fail, or be
    scored as nothing, after it)."""
    files = {
        "train": data_args.train_file,
        "validation": data_args.validation_file,
        "test": data_args.test_file,
    }
    for name, dataset in splits.items():
        if isinstance(dataset, Dataset) and not _has_example(dataset):
            source = files[name] or data_args.dataset or data_args.hub_dataset
            raise ValueError(
                f"the {name} split ({source}) has no examples ({dataset.num_rows} rows, none with text to learn "
                "or score, after skipping empty ones and --max_*_samples); give it data, or leave that split out."
            )


def streaming_train_split(data_args: DataArguments, raw: DatasetDict, world_size: int) -> IterableDataset:
    """The training split as a stream: from the Hub (``streaming=True``) or a local split."""
    if data_args.hub_dataset:
        return load_hub_dataset(
            data_args.hub_dataset,
            data_args.hub_config,
            data_args.source_lang,
            data_args.target_lang,
            split="train",
            streaming=True,
        )
    return raw["train"].to_iterable_dataset(num_shards=max(world_size, 1))


def _tokenizer_texts(train: Dataset | IterableDataset, task: str) -> Iterator[str]:
    columns = ("text",) if task == "lm" else ("source", "target")
    for example in islice(iter(train), TOKENIZER_SAMPLE) if isinstance(train, IterableDataset) else train:
        for column in columns:
            yield example[column]


def tokenize_function(
    tokenizer: PreTrainedTokenizerFast, task: str, data_args: DataArguments, report: bool = False
):
    """The ``map`` function: ``input_ids``, ``labels`` and ``length`` (the budgeted size); with ``report`` also
    the ``TRUNCATED_COLUMNS`` that mark the rows cut to ``--max_source_length``/``--max_target_length``."""

    def seq2seq(batch: dict) -> dict:
        sources = tokenizer(batch["source"], truncation=True, max_length=data_args.max_source_length)
        targets = tokenizer(batch["target"], truncation=True, max_length=data_args.max_target_length)
        columns = {
            "input_ids": sources["input_ids"],
            "labels": targets["input_ids"],
            "length": seq2seq_lengths(
                list(map(len, sources["input_ids"])), list(map(len, targets["input_ids"]))
            ),
        }
        if report:
            columns |= {
                "source_truncated": truncated_rows(sources),
                "target_truncated": truncated_rows(targets),
            }
        return columns

    def lm(batch: dict) -> dict:  # <s> text </s>, whatever the tokenizer adds itself (a prompt gets no </s>)
        encoded = tokenizer(
            batch["text"],
            add_special_tokens=False,
            truncation=True,
            max_length=data_args.max_target_length - 2,
        )
        ids = [[tokenizer.bos_token_id, *seq, tokenizer.eos_token_id] for seq in encoded["input_ids"]]
        columns = {"input_ids": ids, "labels": ids, "length": [len(seq) for seq in ids]}
        return columns | ({"target_truncated": truncated_rows(encoded)} if report else {})

    return lm if task == "lm" else seq2seq


TRUNCATED_COLUMNS = {"source_truncated": "--max_source_length", "target_truncated": "--max_target_length"}


def tokenize_splits(
    splits: dict, tokenizer: PreTrainedTokenizerFast, task: str, data_args: DataArguments
) -> dict:
    """Tokenise every split, keeping only the model's columns and ``length``; a warning counts the lines cut to
    ``--max_source_length``/``--max_target_length`` (a stream is cut without a count: it is read lazily)."""
    out = {}
    for name, dataset in splits.items():
        report = isinstance(dataset, Dataset)
        function = tokenize_function(tokenizer, task, data_args, report=report)
        columns = dataset.column_names or list(next(iter(dataset)).keys())
        out[name] = dataset.map(function, batched=True, remove_columns=columns)
        if report:
            out[name] = _report_truncation(name, out[name], data_args)
    return out


def _report_truncation(split: str, dataset: Dataset, data_args: DataArguments) -> Dataset:
    """Warn how many lines of ``split`` were cut (never a silent loss), then drop the marker columns."""
    present = [column for column in TRUNCATED_COLUMNS if column in dataset.column_names]
    for column in present:
        count = sum(dataset[column])
        if count:
            flag = TRUNCATED_COLUMNS[column]
            limit = getattr(data_args, flag.removeprefix("--"))
            seq2seq = "source_truncated" in dataset.column_names
            side = "source" if column == "source_truncated" else "target" if seq2seq else "text"
            logger.warning(
                "%s split: %d of %d %s line(s) longer than %s %d tokens were truncated; raise %s to keep them whole",
                split, count, dataset.num_rows, side, flag, limit, flag,
            )  # fmt: skip
    return dataset.remove_columns(present)


def drop_long_training_pairs(splits: dict, max_train_tokens: int | None) -> dict:
    """Without the training pairs whose longer side has more than ``max_train_tokens`` tokens (a long pair
    costs much compute per update and, truncated, teaches cut-off sentences); other splits are kept whole."""
    train = splits.get("train")
    if not max_train_tokens or not isinstance(train, Dataset):
        return splits
    kept = train.filter(
        lambda lengths: [n <= max_train_tokens for n in lengths], input_columns="length", batched=True
    )
    logger.info(
        "--max_train_tokens %d: %d of %d training pairs kept", max_train_tokens, kept.num_rows, train.num_rows
    )
    return {**splits, "train": kept}


# --------------------------------------------------------------------------------------------
# Model


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


class TimeBudgetCallback(TrainerCallback):
    """Stop training (after the current step) once ``minutes`` have passed since training began."""

    def __init__(self, minutes: float) -> None:
        self.seconds = 60.0 * minutes
        self.start = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if time.monotonic() - self.start > self.seconds:
            control.should_training_stop = True
        return control


# --------------------------------------------------------------------------------------------
# Evaluation


def lm_test_results(model, test: Dataset, raw_test: Dataset, collator: PadCollator, batch_size: int) -> dict:
    """Perplexity per subword token and per word (the sentence log-probability over words + ``</s>``)."""
    total, count = lm_negative_log_likelihood(model, test, collator, batch_size)
    words = sum(len(text.split()) + 1 for text in raw_test["text"])
    return {
        "nll_per_token": total / max(count, 1),
        "perplexity": metrics.perplexity(total / max(count, 1)),
        "word_perplexity": metrics.perplexity(total / words),
        "tokens": count,
        "words": words,
    }


def seq2seq_test_results(task: str, hyps: list[str], raw_test: Dataset, m2_file: str | None) -> list[dict]:
    """Metric records (hub schema ``results``) of the test hypotheses against the raw references."""
    refs = [text.strip() for text in raw_test["target"]]
    if task == "summarization":
        scores = metrics.rouge_scores(hyps, refs)
        return [{"metric": "rouge", "name": key.upper(), "value": value} for key, value in scores.items()]
    if task == "gec" and m2_file:
        # --max_test_samples: the first ones
        sentences = metrics.parse_m2(read_lines(m2_file), m2_file)[: len(hyps)]
        m2 = metrics.m2_score(hyps, sentences)
        return [
            {"metric": "precision", "name": "M2 precision", "value": m2["precision"]},
            {"metric": "recall", "name": "M2 recall", "value": m2["recall"]},
            {"metric": "f0.5", "name": "M2 F0.5", "value": m2["f0.5"]},
        ]
    bleu, chrf = metrics.sacrebleu_score(hyps, refs), metrics.chrf_score(hyps, refs)
    return [
        {"metric": "sacrebleu", "name": "BLEU", "value": bleu["score"], "signature": bleu["signature"]},
        {"metric": "chrf", "name": "chrF", "value": chrf["score"], "signature": chrf["signature"]},
    ]


# --------------------------------------------------------------------------------------------
# Main


def _saved_model_tokenizer(model_args: ModelArguments) -> PreTrainedTokenizerFast | None:
    """A saved model's own tokenizer (unless --tokenizer_name names another): never trained, since the model's
    embeddings are rows of that vocabulary; a folder without one is refused."""
    if not model_args.model_name_or_path or model_args.tokenizer_name:
        return None
    tokenizer = load_model_tokenizer(model_args.model_name_or_path)
    logger.info("using the tokenizer of %s (%d tokens)", model_args.model_name_or_path, len(tokenizer))
    return tokenizer


def _prepare_tokenizer(model_args, training_args, train, task: str) -> PreTrainedTokenizerFast:
    """The tokenizer asked for by name, else the output folder's own: reused if its record matches, else
    trained."""
    named = model_args.tokenizer_name
    if named and Path(named).is_file():
        raise ValueError(f"--tokenizer_name {named} is a file: give the folder that holds tokenizer.json")
    folder = named or str(Path(training_args.output_dir) / "tokenizer")
    with training_args.main_process_first(desc="tokenizer"):
        texts = _tokenizer_texts(train, task) if train is not None else None
        tokenizer = load_or_train_tokenizer(
            folder,
            texts,
            model_args.vocab_size,
            kind=model_args.tokenizer_type,
            causal=task == "lm",
            verify=not named,
        )
    if named:
        check_task_tokenizer(tokenizer, task, named)
    return tokenizer


def _make_trainer(args: tuple, model, tokenizer, splits: dict, collator: PadCollator):
    model_args, data_args, run_args, training_args = args
    callbacks = [TimeBudgetCallback(run_args.time_budget_minutes)] if run_args.time_budget_minutes else []
    if run_args.early_stopping_patience:
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=run_args.early_stopping_patience))
    common = {
        "model": model,
        "args": training_args,
        "train_dataset": splits.get("train"),
        "eval_dataset": splits.get("validation"),
        "processing_class": tokenizer,
        "data_collator": collator,
        "callbacks": callbacks,
        "max_tokens": data_args.max_tokens,
    }
    if run_args.task == "lm":
        return TokenBudgetTrainer(**common)
    compute = (
        metrics.build_seq2seq_compute_metrics(tokenizer, run_args.task)
        if training_args.predict_with_generate
        else None
    )
    return TokenBudgetSeq2SeqTrainer(**common, compute_metrics=compute)


def prepare_output_dir(training_args: Seq2SeqTrainingArguments, overwrite: bool) -> str | None:
    """Keep one run per output folder (as transformers' example scripts do); returns the checkpoint to resume from.

    A non-empty ``output_dir`` is refused unless the run resumes (``last`` = the newest complete checkpoint,
    incomplete ones skipped with a warning) or ``overwrite`` deletes its contents first. The advice leads
    somewhere: resuming is offered only where a complete checkpoint exists, else ``--overwrite_output_dir``.
    """
    out, resume = Path(training_args.output_dir), training_args.resume_from_checkpoint
    if overwrite and resume:
        raise ValueError(
            "--overwrite_output_dir would delete what --resume_from_checkpoint continues from; pass one of them."
        )
    if resume in ("last", "latest", "true", "True"):
        complete = complete_checkpoints(out)
        if not complete:
            raise ValueError(
                f"--resume_from_checkpoint {resume}: no complete checkpoint in {out}, nothing to resume; start "
                "the run again from the beginning with --overwrite_output_dir (instead of --resume_from_checkpoint)."
            )
        resume = str(complete[-1])
    elif resume and (problem := missing_part(Path(resume))):
        raise ValueError(f"{resume} is not a complete checkpoint ({problem}); resume from another one.")
    if resume:
        check_checkpoint_pickles(resume)
    else:
        resumable = bool(complete_checkpoints(out))
        refuse_occupied(
            out, overwrite, "--overwrite_output_dir", "--output_dir", what="a run",
            advice="continue it with --resume_from_checkpoint last, " if resumable else "", ignore=LOCK_FILES,
        )  # fmt: skip
    if resume and run_finished(out, resume, training_args.max_steps):
        return resume  # nothing to clean: the run changes nothing
    with training_args.main_process_first(desc="output dir"):
        if training_args.should_save and overwrite:
            clear_folder(out, keep=LOCK_FILES)
        if training_args.should_save and resume:
            remove_staging(out)
    return resume


def _read_json(path: Path) -> dict | None:
    """A JSON file's object, or ``None`` when it is missing or cut off (a kill while it was written)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None


def trained_to_the_end(checkpoint: str | Path, max_steps: int) -> bool:
    """Whether ``checkpoint`` is the run's last step (``--max_steps``, else the step count the run planned)."""
    state = _read_json(Path(checkpoint) / TRAINER_STATE) or {}
    last = max_steps if max_steps > 0 else state.get("max_steps", 0)
    return state.get("global_step", -1) >= last > 0


def run_finished(output_dir: str | Path, checkpoint: str | Path, max_steps: int) -> bool:
    """Whether the run of ``output_dir`` finished after ``checkpoint``, its last step: the run's own
    ``trainer_state.json``, written last of all, is complete and at that step."""
    if not trained_to_the_end(checkpoint, max_steps):
        return False
    final = _read_json(Path(output_dir) / TRAINER_STATE) or {}
    return final.get("global_step") == (_read_json(Path(checkpoint) / TRAINER_STATE) or {}).get("global_step")


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
    }  # not the model
    fields = sorted(k for k in (saved.keys() | now.keys()) - bookkeeping if saved.get(k) != now.get(k))
    if fields:
        detail = ", ".join(f"{k}: {saved.get(k)!r} in the checkpoint, {now.get(k)!r} now" for k in fields)
        raise ValueError(
            f"{checkpoint} was trained with another model configuration ({detail}); resume with the checkpoint's "
            "settings, or start a new run in an empty --output_dir."
        )


def _test(task: str, trainer, tokenizer, test, raw_test, m2_file, collator) -> tuple[list[dict], list[str]]:
    """Metric records for the test split and the hypotheses (empty for lm), on the main process only.

    Seq2seq hypotheses come from :func:`train.translate.generate_ids` on the plain model in fp32, the
    decoder of ``python -m train.translate`` and the same hypotheses plain ``model.generate`` gives: not
    from ``trainer.predict``, whose model runs under accelerate's bf16 autocast wrapper when ``--bf16``.
    """
    training_args = trainer.args
    if not trainer.is_world_process_zero():
        return [], []
    model = trainer.accelerator.unwrap_model(trainer.model)
    if task == "lm":
        scores = lm_test_results(model, test, raw_test, collator, training_args.per_device_eval_batch_size)
        return [
            {"metric": "perplexity", "name": "Word perplexity", "value": scores["word_perplexity"]},
            {"metric": "perplexity", "name": "Subword perplexity", "value": scores["perplexity"]},
        ], []
    with fp32_forward(model):
        ids = generate_ids(
            model, test["input_ids"], batch_size=training_args.per_device_eval_batch_size,
            progress=not training_args.disable_tqdm,
        )  # fmt: skip
    hyps = decode(tokenizer, ids)
    return seq2seq_test_results(task, hyps, raw_test, m2_file), hyps


def _splits_to_use(raw: DatasetDict, args: tuple) -> dict:
    """The raw splits the run needs: train (``--do_train``), validation (training or ``--do_eval``), test
    (``--do_predict``); a clear error names a missing one."""
    _, data_args, _, training_args = args
    flags = {"train": "--do_train", "validation": "--do_eval", "test": "--do_predict"}
    for name, flag in flags.items():
        needed = getattr(training_args, flag.removeprefix("--"))
        if needed and name not in raw and not (name == "train" and data_args.streaming):
            raise ValueError(
                f"{flag} needs a {name} split: give --dataset, --hub_dataset or --{name}_file, or {flag} false"
            )
    splits = {}
    if training_args.do_train:
        splits["train"] = (
            streaming_train_split(data_args, raw, training_args.world_size)
            if data_args.streaming
            else _slice(raw["train"], data_args.max_train_samples)
        )
    if "validation" in raw and (training_args.do_train or training_args.do_eval):
        splits["validation"] = _slice(raw["validation"], data_args.max_eval_samples)
    if training_args.do_predict:
        splits["test"] = _slice(raw["test"], data_args.max_test_samples)
    return splits


def _train(trainer, run_args: RunArguments, resume: str | None) -> tuple[dict, TrainerState]:
    """Train, optionally average the last checkpoints, save the model; the train metrics and the trainer state
    to save as the run's last file (as training left it: later evaluations are not training's).

    Resumed from the run's last step (a kill hit its end phases), nothing is trained: the end phases are redone
    from the checkpoint, whose weights are the trained ones bit for bit, so the final model is the one the
    uninterrupted run saves.
    """
    if resume and trained_to_the_end(resume, trainer.args.max_steps):
        metrics = _restore_trained(trainer, resume)
    else:
        result = trainer.train(resume_from_checkpoint=resume)
        metrics = {**result.metrics, "global_step": trainer.state.global_step}
        trainer.save_metrics("train", metrics)  # before the end phases, for a run resumed in them
    trainer.log_metrics("train", metrics)
    if run_args.average_last_checkpoints > 1:
        _load_average(trainer, run_args.average_last_checkpoints)
    save_final_model(trainer)
    return metrics, copy.deepcopy(trainer.state)


def _restore_trained(trainer, checkpoint: str) -> dict:
    """The trainer state and weights of the run's last checkpoint (the best one with ``--load_best_model_at_end``,
    as training ends); the train metrics the run saved, if it got that far."""
    logger.warning("%s is the run's last step: nothing to train, finishing the run from it", checkpoint)
    trainer.state = TrainerState.load_from_json(str(Path(checkpoint) / TRAINER_STATE))
    weights = checkpoint
    if trainer.args.load_best_model_at_end and trainer.state.best_model_checkpoint:
        weights = trainer.state.best_model_checkpoint
    _load_state(trainer.model, load_file(str(Path(weights) / WEIGHTS)), weights)
    saved = _read_json(Path(trainer.args.output_dir) / "train_results.json") or {}
    step = trainer.state.global_step
    return saved if saved.get("global_step") == step else {"global_step": step}


def save_final_model(trainer) -> None:
    """``trainer.save_model`` (weights, config, tokenizer), refusing a model with non-finite weights: it would
    only translate to empty lines.

    The files are written into ``OUTPUT_DIR/.staging/final_model`` and each is then renamed over its namesake in
    ``OUTPUT_DIR``: a kill or a full disk during the save leaves the old files (or none), never a cut-off
    ``model.safetensors`` (``--resume_from_checkpoint last`` redoes the save; the staging folder is removed).
    """
    bad = non_finite_tensors(trainer.model)
    if bad:
        raise FloatingPointError(
            f"the final model has non-finite weights ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}): "
            f"not saved; train again with a lower --learning_rate (was {trainer.args.learning_rate:g})."
        )
    out = Path(trainer.args.output_dir)
    staged = out / STAGING / FINAL_MODEL_STAGING
    if trainer.args.should_save:
        shutil.rmtree(staged, ignore_errors=True)  # left by a save that was interrupted
    trainer.accelerator.wait_for_everyone()
    with saving(out):
        trainer.save_model(str(staged))  # every process takes part (FSDP gathers the weights)
    trainer.accelerator.wait_for_everyone()
    if trainer.args.should_save:
        for file in sorted(staged.iterdir()):
            os.replace(file, out / file.name)  # one rename per file: each is whole, old or new
        staged.rmdir()
        with contextlib.suppress(OSError):  # not empty: a checkpoint's staging, the next save clears it
            staged.parent.rmdir()
    trainer.accelerator.wait_for_everyone()


def run(args: tuple) -> dict:
    """Train (``--do_train``), evaluate on the validation split (``--do_eval``) and test (``--do_predict``) as
    described in the module docstring; returns the metrics document (empty without ``--do_predict`` and on
    processes other than the main one).

    A training run holds the output folder's lock throughout (:func:`train.checkpoints.lock_output_dir`): a
    second run started into it at the same time is refused.
    """
    training_args = args[3]
    try:
        if not (training_args.do_train and training_args.should_save):
            return _run(args)
        with lock_output_dir(training_args.output_dir):
            return _run(args)
    except (
        KeyboardInterrupt
    ):  # Ctrl-C: where the run stands, and how to go on (ode_transformer.cli prints it)
        raise KeyboardInterrupt(resume_advice(training_args)) from None


def resume_advice(training_args: Seq2SeqTrainingArguments) -> str:
    """How to go on after an interrupted run, from what its folder holds: resume from its newest complete
    checkpoint, test the model it saved, or start again."""
    out = Path(training_args.output_dir)
    if not training_args.do_train:
        return "nothing was written; run the command again"
    if checkpoints := complete_checkpoints(out):
        return (
            f"{out} keeps {checkpoints[-1].name}: continue the run with the same command and "
            "--resume_from_checkpoint last"
        )
    if not out.is_dir() or not any(out.iterdir()):
        return "nothing was written; run the command again"
    if (out / WEIGHTS).is_file() and (out / "config.json").is_file():
        return (
            f"the trained model is saved in {out}, but no checkpoint to resume from: test it with "
            f"--do_train false --model_name_or_path {out}, or train again with --overwrite_output_dir true"
        )
    return (
        "no checkpoint was saved yet (--save_strategy steps --save_steps N saves them): start again with the same "
        "command and --overwrite_output_dir true"
    )


def _run(args: tuple) -> dict:
    model_args, data_args, run_args, training_args = args
    set_seed(training_args.seed)
    # What can be refused is checked before --overwrite_output_dir deletes anything: the data, the M2 file, a
    # saved model's tokenizer and lengths.
    raw, m2_file = load_raw_data(data_args, run_args.task)
    raw_splits = _splits_to_use(raw, args)
    check_splits_not_empty(raw_splits, data_args)
    own_tokenizer = _saved_model_tokenizer(model_args)
    saved_model = None
    if model_args.model_name_or_path:
        check_saved_model_task(model_args.model_name_or_path, run_args.task)
        if training_args.do_train:  # its weights checked before --overwrite_output_dir deletes anything
            saved_model = load_trainable_model(model_args, run_args.task)
    if own_tokenizer is not None:
        resolve_lengths(data_args, own_tokenizer, model_args.model_name_or_path)
    # One run per output folder; evaluation alone writes only hypotheses and metrics, so it may use any folder.
    resume = (
        prepare_output_dir(training_args, run_args.overwrite_output_dir) if training_args.do_train else None
    )
    if resume and run_finished(training_args.output_dir, resume, training_args.max_steps):
        logger.warning(
            "%s holds a finished run (its last step is %s): nothing to resume, nothing changed; pass a larger "
            "--max_steps to train on, or choose another --output_dir for a new run",
            training_args.output_dir, resume,
        )  # fmt: skip
        return {}
    tokenizer = own_tokenizer or _prepare_tokenizer(
        model_args, training_args, raw_splits.get("train"), run_args.task
    )
    if model_args.model_name_or_path and own_tokenizer is None:  # a model with another --tokenizer_name
        resolve_lengths(data_args, tokenizer, model_args.model_name_or_path)
    with training_args.main_process_first(desc="tokenize"):
        splits = tokenize_splits(raw_splits, tokenizer, run_args.task, data_args)
        splits = drop_long_training_pairs(splits, data_args.max_train_tokens)
    model = build_model(model_args, data_args, run_args.task, tokenizer, saved_model)
    fit_tokenizer_to_model(tokenizer, model.config, data_args.max_source_length)  # saved with the model
    if resume:
        check_resume_config(resume, model.config)
    decoding = set_decoding_defaults(model, run_args, data_args, saved=bool(model_args.model_name_or_path))
    # with the model, the collator adds decoder_input_ids: the Trainer's label smoother takes the labels away
    collator = PadCollator(tokenizer, model=model, word_dropout=data_args.word_dropout)
    trainer = _make_trainer(args, model, tokenizer, splits, collator)
    trainer.run_id = read_run_id(resume) if resume else None  # a resumed run continues the checkpoint's run
    train_metrics, final_state = _train(trainer, run_args, resume) if training_args.do_train else ({}, None)
    if training_args.do_eval:
        eval_metrics = trainer.evaluate()
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)
    document = {}
    if training_args.do_predict:
        results, hyps = _test(
            run_args.task, trainer, tokenizer, splits["test"], raw_splits["test"], m2_file, collator
        )
        if trainer.is_world_process_zero():
            document = metrics_document(
                args, results, decoding, m2_file, train_metrics, model, raw_splits["test"]
            )
            _write_outputs(training_args.output_dir, trainer, document, hyps)
    if final_state is not None and trainer.is_world_process_zero():
        with replacing(Path(training_args.output_dir) / TRAINER_STATE) as path:
            final_state.save_to_json(str(path))  # last of all: it marks the run finished (run_finished)
    return document


def _load_state(model, state: dict, source) -> None:
    """Load ``state`` (a safetensors file's tensors, tied weights stored once) into ``model``."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded = {params[key].data_ptr() for key in state if key in params}
    untied = [key for key in missing if key not in params or params[key].data_ptr() not in loaded]
    if unexpected or untied:  # keys left out of the safetensors file must be tied to loaded ones
        raise ValueError(f"{source} does not fit the model: missing {untied}, unexpected {unexpected}")


def _load_average(trainer, last: int) -> None:
    """Replace the trained weights by the average of the last ``last`` checkpoints."""
    from .averaging import average_checkpoints, last_checkpoints

    paths = last_checkpoints(trainer.args.output_dir, last)
    _load_state(trainer.model, average_checkpoints(paths), "averaged checkpoint")
    logger.info("averaged %d checkpoints: %s", len(paths), ", ".join(str(p) for p in paths))


def _write_outputs(output_dir: str, trainer, document: dict, hyps: list[str]) -> None:
    """Hypotheses and metrics JSON; after training also the loss curves and the model card."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if hyps:
        write_atomic(out / "test_hypotheses.txt", "".join(h + "\n" for h in hyps))
    write_atomic(out / "hub_metrics.json", json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    scores = {record.get("name", record["metric"]): record["value"] for record in document["results"]}
    trainer.log_metrics("test", scores)
    trainer.save_metrics("test", scores)
    if "training" not in document:
        logger.info("model card: python -m hub.model_card MODEL_DIR %s", out / "hub_metrics.json")
        return
    from .plots import plot_loss_curves

    plot_loss_curves(trainer.state.log_history, out / "loss_curves.png")
    write_card(output_dir, document)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    datasets.disable_progress_bars()
    try:
        args = parse_arguments(argv)
        run(args)
    except (MissingCorpusError, RecipeNotFoundError, RecipeError) as error:  # a user's setting: one line
        raise SystemExit(report_user_error(__spec__.name, error)) from None
    except KeyboardInterrupt as interrupt:  # Ctrl-C: one line saying how to resume (resume_advice)
        raise SystemExit(report_interrupt(__spec__.name, interrupt)) from None
    # Under `accelerate launch` / torchrun: left to interpreter shutdown, the gloo process group's threads can
    # abort a worker after a successful run ("terminate called without an active exception", exit code -6).
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
