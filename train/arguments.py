"""The run's arguments: the model, data and run dataclasses beside transformers' ``Seq2SeqTrainingArguments``, and
recipes (a YAML/JSON file of flag defaults, given first).

:func:`parse_arguments` turns ``[RECIPE] [--flag value ...]`` into one :class:`Settings`. What it refuses, it refuses
in words naming the flag: a recipe's bad values as the recipe is read, and each dataclass's bad fields as the
dataclass is built (``__post_init__``). The checks that compare several dataclasses or read the disk are
:func:`ode_transformer.train.checks.check_settings`'s, which ``run`` makes first, with one exception made here:
``--precision`` against ``--bf16``/``--fp16``, as parsing resolves the precision (``--precision auto`` becomes
``--bf16 true`` or not) and two flags that disagree leave none to resolve.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

from transformers import (
    GenerationConfig,
    HfArgumentParser,
    PreTrainedTokenizerFast,
    Seq2SeqTrainingArguments,
)

from modeling_ode import PAPER_LABEL_SMOOTHING
from modeling_ode.compat import order_argument_groups, parser_actions
from modeling_ode.tokenizer_limits import NO_LENGTH_LIMIT
from ode_transformer.cli import program_name
from ode_transformer.loading import target_length
from ode_transformer.precision import PRECISIONS, accelerator_present, choose_precision, emulated_bf16_warning

from .recipe_files import RecipeError, find_recipe, list_recipes, read_recipe
from .tasks import DEFAULT_TASK, TASKS, get_task

logger = logging.getLogger(__name__)


# the command these arguments are for (python -m ode_transformer.train.run)
RUN_MODULE = f"{__spec__.parent}.run"


DEFAULT_LENGTH = 256  # --max_source_length / --max_target_length of a new model


def _paper_decoding(setting: str) -> str:
    """The paper's ``num_beams`` or ``length_penalty`` of each seq2seq task, for the flag's help."""
    return " / ".join(str(task.paper_decoding[setting]) for task in TASKS.values() if not task.is_lm)


SAMPLE_LIMITS = ("max_train_samples", "max_eval_samples", "max_test_samples")

# The paper's optimiser (Appendix "dataset": Adam 0.9/0.997, inverse-sqrt schedule, lr 0.002, no weight decay or
# clipping), the values of the translation recipes, as the defaults of a run without a recipe: transformers' own
# (lr 5e-5, no warm-up) leave a short run on one's own files with empty hypotheses. The warm-up is a ratio of the
# run's steps (transformers takes a float below 1 as one), since a run on one's own files has no known length:
# the paper's 16k of 50k steps, the CPU recipe's 300 of 1500.
PAPER_OPTIMISER = {
    "adam_beta1": 0.9,
    "adam_beta2": 0.997,
    "weight_decay": 0.0,
    "max_grad_norm": 0.0,
    "learning_rate": 0.002,
    "lr_scheduler_type": "inverse_sqrt",
    "warmup_steps": 0.2,
}


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
    # Whether --preset was given (on the command line or in the recipe): not a flag, set by parse_arguments for
    # check_settings, which compares a given preset with a saved model's config.
    preset_given: bool = field(default=False, init=False, repr=False)
    upcycle: bool = field(
        default=False,
        metadata={
            "help": "convert the --model_name_or_path model (a residual ODE Transformer) to this run's ODE blocks "
            "(--encoder_ode_method, --config_overrides, ...) before training; RK blocks start as its residual "
            "blocks (ODETransformerForConditionalGeneration.from_residual; ode_transformer.hub.upcycle converts M2M100/NLLB-200)"
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
            "preset_given",
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
        """:meth:`overrides` with what a task fixes (a language model: decoder-only)."""
        if get_task(task).is_lm:
            return {"is_encoder_decoder": False, **self.overrides()}
        return self.overrides()


@dataclass
class DataArguments:
    """Where the data comes from and how it is cut into batches."""

    _argument_group_name = "data"

    dataset: str | None = field(
        default=None,
        metadata={
            "help": "shared corpus: multi30k, tatoeba_de_en, libreoffice, cnndm, wi_locness, fce, ptb; '+' joins training sets"
        },
    )
    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "folder of the shared corpora (default: $ODE_DATA_DIR, else ../shared/data of a clone)"
        },
    )
    hub_dataset: str | None = field(
        default=None,
        metadata={
            "help": "Hub id or local dataset folder; with --dataset, where that corpus comes from when it has no "
            "local copy and --data_dir is not given (the recipes name it)"
        },
    )
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
    scored_split: str = field(default="test", init=False)
    """Not a flag: the split the test scores come from, "validation" where the data has no test split
    (:func:`ode_transformer.train.preparation.load_raw_data`), named wherever they are reported."""

    def __post_init__(self) -> None:
        for flag in ("max_source_length", "max_target_length"):
            length = getattr(self, flag)
            if length is not None and length <= 0:
                raise ValueError(f"--{flag} must be a positive number of tokens, got {length}")
        # a stream ignores --max_train_samples and --max_tokens (parse_arguments says so)
        limits = ("max_eval_samples", "max_test_samples") if self.streaming else SAMPLE_LIMITS
        for flag in limits:
            value = getattr(self, flag)
            if value is not None and value < 1:  # a slice [:-1] or [:0], not a limit
                raise ValueError(
                    f"--{flag} must be a positive number of examples, got {value}; leave it out for all"
                )
        if self.max_tokens is not None and self.max_tokens <= 0 and not self.streaming:
            raise ValueError(f"--max_tokens must be a positive token budget per batch, got {self.max_tokens}")


@dataclass
class RunArguments:
    """The task and what happens around training."""

    _argument_group_name = "run"

    task: str = field(default=DEFAULT_TASK, metadata={"help": ", ".join(TASKS)})
    num_beams: int | None = field(
        default=None, metadata={"help": f"default per task (paper): {_paper_decoding('num_beams')}"}
    )
    length_penalty: float | None = field(
        default=None, metadata={"help": f"default per task (paper): {_paper_decoding('length_penalty')}"}
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
            "help": "delete what --output_dir holds first (else a non-empty one is refused unless resuming); "
            "with --do_train false, replace the results (hypotheses, scores) a run or evaluation left there"
        },
    )
    precision: str = field(
        default="auto",
        metadata={
            "help": "auto: bf16 autocast where the device computes bf16 natively (CUDA from Ampere on, CPUs with "
            "AVX512_BF16/AMX), else fp32; or bf16, fp32. --bf16 true / --fp16 true are taken as asked"
        },
    )

    def __post_init__(self) -> None:
        get_task(self.task)  # a known task
        if self.num_beams is not None and self.num_beams <= 0:
            raise ValueError(f"--num_beams must be a positive number of beams, got {self.num_beams}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")


ALL_ARGUMENTS = (ModelArguments, DataArguments, RunArguments, Seq2SeqTrainingArguments)


class Settings(NamedTuple):
    """One run's settings, as :func:`parse_arguments` resolved them (each dataclass checked its own fields;
    ``ode_transformer.train.checks.check_settings`` checks the rest): read them by name."""

    model: ModelArguments
    data: DataArguments
    run: RunArguments
    training: Seq2SeqTrainingArguments


GROUP_TITLES = ("model", "data", "run")  # the ``_argument_group_name`` of our three dataclasses


def build_parser() -> HfArgumentParser:
    """The parser: ``[RECIPE.yaml]``, then our model/data/run groups, then transformers' training arguments.

    Without ``--do_train/--do_predict`` a run trains and tests (``--do_train false --do_predict`` evaluates
    ``--model_name_or_path``); ``--do_eval`` (on whenever ``--eval_strategy`` is set) evaluates the
    validation split at the end, as in transformers' ``run_translation.py``.
    """
    parser = HfArgumentParser(
        ALL_ARGUMENTS,
        prog=program_name(RUN_MODULE),
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
    order_argument_groups(
        parser,
        ("positional arguments", *GROUP_TITLES),
        titles={"options": "transformers Seq2SeqTrainingArguments"},
    )
    # the defaults a run uses, shown by --help: the paper's optimiser and label smoothing (set_label_smoothing)
    # and DDP without its search for unused parameters: every parameter of the model takes part in each step
    # (tests/test_modeling.py), so transformers' default True costs an extra pass and warns that it found none
    parser.set_defaults(
        do_train=True,
        do_predict=True,
        label_smoothing_factor=PAPER_LABEL_SMOOTHING,
        ddp_find_unused_parameters=False,
        **PAPER_OPTIMISER,
    )
    actions = {action.dest: action for action in parser_actions(parser)}
    smoothing = actions["label_smoothing_factor"]
    smoothing.help = f"{smoothing.help} ode-train: the paper's {PAPER_LABEL_SMOOTHING}, and 0 with --task lm."
    unused = actions["ddp_find_unused_parameters"]
    unused.help = f"{unused.help} ode-train: false, every parameter takes part in each step."
    return parser


def check_recipe_values(parser: HfArgumentParser, recipe: dict, path: Path) -> None:
    """Refuse a recipe key that is no flag, and a value the flag's type does not take: argparse converts a
    default only when it is a string, so ``learning_rate: [0.1]`` reached transformers as a list (a TypeError
    deep inside it).

    Raises:
        RecipeError: the file, the key, its value and what the flag takes.
    """
    actions = {action.dest: action for action in parser_actions(parser)}
    unknown = sorted(set(recipe) - set(actions))
    if unknown:
        raise RecipeError(
            f"recipe {path}: unknown keys {unknown}; `{program_name(RUN_MODULE)} --help` lists the flags"
        )
    for key, value in recipe.items():
        action = actions[key]
        many = action.nargs in ("+", "*")
        if value is None:
            continue
        # a string too: argparse would convert it as the default of a flag the user never typed, and blame that flag
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


def parse_arguments(argv: list[str] | None = None) -> Settings:
    """Parse ``[RECIPE] [--flag value ...]`` into the run's :class:`Settings`; RECIPE is a YAML/JSON file or
    a packaged recipe's name. ``--list-recipes`` prints the packaged recipes and exits."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if {"--list-recipes", "--list_recipes"} & set(argv):
        list_recipes()
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
    if not model_args.model_name_or_path:  # a saved model's lengths are its own (resolve_lengths)
        for flag in ("max_source_length", "max_target_length"):
            if getattr(data_args, flag) is None:
                setattr(data_args, flag, DEFAULT_LENGTH)
    # both need the whole split: lengths to bucket, rows to count
    for flag in ("max_tokens", "max_train_samples"):
        if data_args.streaming and getattr(data_args, flag) is not None:
            # a warning, not an error: every recipe sets max_tokens, and a flag cannot unset it
            logger.warning(
                "--%s %s does not apply to a stream, which is batched by --per_device_train_batch_size sentences "
                "and read to --max_steps: ignored",
                flag,
                getattr(data_args, flag),
            )
            setattr(data_args, flag, None)
    set_label_smoothing(run_args.task, training_args, argv, recipe)
    model_args.preset_given = given("preset", argv, recipe)
    return Settings(model_args, data_args, run_args, training_args)


def given(flag: str, argv: list[str], recipe: dict) -> bool:
    """Whether ``--flag`` was set by the user, on the command line or in the recipe."""
    return flag in recipe or any(arg == f"--{flag}" or arg.startswith(f"--{flag}=") for arg in argv)


def _cpu_only_flags(argv: list[str], recipe: dict) -> list[str]:
    """``--use_cpu true`` on a machine without an accelerator, unless the user set it: the Trainer runs on the CPU
    there anyway, and transformers refuses bf16 without a GPU unless told so (auto picks bf16 on a CPU with native
    bf16, and a recipe or ``--bf16`` may ask for it). An accelerator's path is unchanged."""
    if given("use_cpu", argv, recipe) or accelerator_present():
        return []
    return ["--use_cpu", "true"]


def _resolve_precision(parser: HfArgumentParser, argv: list[str], recipe: dict, parsed: tuple) -> tuple:
    """``--precision auto`` becomes bf16 where the device computes it natively, else fp32 (ode_transformer.precision);
    an explicit ``--bf16``/``--fp16`` is taken as asked, with a warning where bf16 would be emulated. The
    arguments are parsed again with ``--bf16 true`` rather than patched, so transformers derives its mixed
    precision settings from the flag as usual. ``run_args.precision`` ends as what was asked (auto, bf16, fp16,
    fp32): :func:`ode_transformer.precision.choose_precision` gives the same choice from it anywhere later."""
    run_args, training_args = parsed[2], parsed[3]
    if given("bf16", argv, recipe) or given("fp16", argv, recipe):
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


def check_max_train_tokens(data_args: DataArguments) -> None:
    longest = min(data_args.max_source_length, data_args.max_target_length)
    if data_args.max_train_tokens is not None and not 0 < data_args.max_train_tokens < longest:
        raise ValueError(
            f"--max_train_tokens {data_args.max_train_tokens} must be positive and below --max_source_length/"
            f"--max_target_length ({longest}): longer sides are truncated to those before the filter counts them"
        )


def resolve_lengths(data_args: DataArguments, tokenizer: PreTrainedTokenizerFast, saved_model: str) -> None:
    """The lengths a saved model was trained and decodes with, where the flags leave them unset: its tokenizer's
    ``model_max_length`` (the source limit its run saved) and its generation config's output length (:func:`target_length`), so that
    ``--do_train false`` scores the hypotheses ``ode_transformer.translate`` writes."""
    if data_args.max_source_length is None:
        limit = tokenizer.model_max_length  # transformers' 1e30 where none was saved
        data_args.max_source_length = limit if limit < NO_LENGTH_LIMIT else DEFAULT_LENGTH
    if data_args.max_target_length is None:
        try:
            new_tokens = target_length(GenerationConfig.from_pretrained(saved_model))
        except OSError:  # a folder without generation_config.json
            new_tokens = None
        data_args.max_target_length = new_tokens or DEFAULT_LENGTH
    check_max_train_tokens(data_args)


def set_label_smoothing(
    task: str, training_args: Seq2SeqTrainingArguments, argv: list[str], recipe: dict
) -> None:
    """The model returns plain cross entropy (as BART and Marian do); label smoothing is the Trainer's
    ``--label_smoothing_factor``: by default the paper's 0.1, and 0 for ``--task lm`` (check_settings refuses a
    smoothed language model)."""
    if not given("label_smoothing_factor", argv, recipe):
        training_args.label_smoothing_factor = 0.0 if get_task(task).is_lm else PAPER_LABEL_SMOOTHING
