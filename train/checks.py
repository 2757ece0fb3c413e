"""The checks of a run's settings that one dataclass cannot make alone: those that read the disk (the output
folder, a saved model) or compare fields of several dataclasses. :func:`check_settings` runs them all, in one
step, first thing in ``ode_transformer.train.run.run``, before anything is read or written; each dataclass checks
its own fields as it is built (``__post_init__``, in :mod:`ode_transformer.train.arguments`).
"""

from __future__ import annotations

import importlib

from modeling_ode import ODETransformerConfig

from .arguments import Settings, check_max_train_tokens
from .output_folder import refuse_to_delete_inputs
from .saved_model import check_saved_model_flags, check_saved_model_preset
from .tasks import TASKS, get_task

__all__ = ["check_settings"]


def check_settings(settings: Settings) -> None:
    """Refuse settings that cannot run, each with a message that names the flags and the fix.

    Raises:
        ValueError: the first problem found.
        ModuleNotFoundError: a package the task's scores need (``Task.scoring_packages``) is not installed.
    """
    model_args, data_args, run_args, training_args = settings
    task = get_task(run_args.task)
    for package in task.scoring_packages:  # a missing one: ode_transformer.cli names the extra to install
        importlib.import_module(package)
    if not model_args.model_name_or_path:
        check_max_train_tokens(data_args)
    if data_args.streaming and training_args.max_steps <= 0:
        raise ValueError("--streaming needs --max_steps (a stream has no length)")
    # transformers shifts the labels of a smoothed loss only for its own causal LMs
    if task.is_lm and training_args.label_smoothing_factor:
        raise ValueError(
            f"--label_smoothing_factor {training_args.label_smoothing_factor} with --task {task.name}: transformers' "
            "label smoother would not shift a causal LM's labels; leave it out (the paper's language models use none)"
        )
    if model_args.upcycle and (not model_args.model_name_or_path or task.is_lm):
        seq2seq = ", ".join(name for name, other in TASKS.items() if not other.is_lm)
        raise ValueError(
            "--upcycle true converts the seq2seq model of --model_name_or_path to this run's ODE blocks: give that "
            f"folder, and a seq2seq --task ({seq2seq})"
        )
    if not training_args.do_train and not model_args.model_name_or_path:
        raise ValueError(
            "--do_train false evaluates a trained model: give its folder with --model_name_or_path"
        )
    _check_evaluation(settings)
    _check_averaging(settings)
    if run_args.overwrite_output_dir and training_args.do_train:  # only a training run clears its folder
        refuse_to_delete_inputs(model_args, data_args, training_args)
    if model_args.model_name_or_path and model_args.preset_given:
        check_saved_model_preset(model_args, run_args.task)
    # upcycling takes block flags (from_residual)
    if model_args.model_name_or_path and not model_args.upcycle:
        check_saved_model_flags(model_args, run_args.task)
    if not model_args.model_name_or_path:  # a misspelt preset or field, bad sizes: before data and tokenizer
        # the vocabulary as the tokenizer will have it (build_model sets the tokenizer's actual size)
        checked = {"vocab_size": model_args.vocab_size, **model_args.task_overrides(run_args.task)}
        ODETransformerConfig.from_preset(model_args.preset, **checked)


def _check_evaluation(settings: Settings) -> None:
    """``--metric_for_best_model`` is one the evaluations report (transformers would fail at the first evaluation,
    after training up to it), and early stopping has evaluations to compare."""
    run_args, training_args = settings.run, settings.training
    task = get_task(run_args.task)
    metric = (training_args.metric_for_best_model or "loss").removeprefix("eval_")
    evaluated = task.evaluated(training_args.predict_with_generate)
    if metric not in evaluated:
        model = "a language model" if task.is_lm else f"a {task.name} model"
        unlocked = sorted(set(task.evaluated(generate=True)) - set(evaluated))
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


def _check_averaging(settings: Settings) -> None:
    """``--average_last_checkpoints N`` has N saved checkpoints to average."""
    last, training_args = settings.run.average_last_checkpoints, settings.training
    if last <= 1:
        return
    if training_args.do_train and training_args.save_strategy == "no":
        raise ValueError(
            f"--average_last_checkpoints {last} averages saved checkpoints, but --save_strategy no saves none; "
            "give --save_strategy steps --save_steps N, or leave averaging out"
        )
    if training_args.save_total_limit is not None and training_args.save_total_limit < last:
        raise ValueError(
            f"--average_last_checkpoints {last} averages saved checkpoints, but --save_total_limit "
            f"{training_args.save_total_limit} keeps fewer; raise --save_total_limit to at least {last}, or "
            "average fewer"
        )
