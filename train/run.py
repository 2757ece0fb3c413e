"""Train and evaluate an ODE Transformer: ``python -m ode_transformer.train.run [RECIPE.yaml] [--flag value ...]``.

One entry point for the four tasks of the paper (``--task translation|summarization|gec|lm``) on
:class:`~transformers.Seq2SeqTrainer` / :class:`~transformers.Trainer`. Arguments are the fields of
:class:`ModelArguments`, :class:`DataArguments`, :class:`RunArguments` and
:class:`~transformers.Seq2SeqTrainingArguments`, read by :class:`~transformers.HfArgumentParser`;
a YAML/JSON recipe given first supplies defaults that flags on the command line override::

    python -m ode_transformer.train.run train/recipes/multi30k_en_de_cpu.yaml --max_steps 200
    accelerate launch -m ode_transformer.train.run train/recipes/wmt14_en_de_base.yaml   # GPUs; FSDP/DeepSpeed via accelerate config
    accelerate launch --multi_gpu --num_processes 2 -m ode_transformer.train.run RECIPE --use_cpu true  # 2 CPU processes, gloo

A run: load the data (a shared corpus, local files or a Hub dataset, optionally streamed), train
or reuse a joint BPE tokenizer, tokenise, build the model from a preset plus overrides, train
with token-budget batches (resumable: ``--resume_from_checkpoint last``), optionally average the
last checkpoints, then on the test split write the hypotheses, ``hub_metrics.json`` (the schema of
:mod:`ode_transformer.card_metrics`), ``loss_curves.png`` and the model card. Everything lands in
``--output_dir``: the model with its tokenizer and generation config (the paper's decoding
defaults), checkpoints, TensorBoard logs (``runs/``).

``--do_train/--do_eval/--do_predict`` select the steps as in transformers' ``run_translation.py``
(default: train and test); ``--do_train false --model_name_or_path MODEL --test_file ...`` evaluates a
saved model and writes only the hypotheses and metrics. The test split is decoded by
:mod:`ode_transformer.translate` in fp32 on the plain model, so the reported score is that of ``python -m
ode_transformer.translate`` and of plain ``model.generate`` on the saved folder.
"""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path

import datasets
import torch
from transformers import (
    EarlyStoppingCallback,
    TrainerCallback,
    TrainerState,
    set_seed,
)

from ode_transformer.checkpoints import TRAINER_STATE, lock_output_dir, read_run_id
from ode_transformer.cli import report_interrupt, report_user_error
from ode_transformer.files import replacing
from ode_transformer.tokenizer import drop_foreign_tokenizer_code

from .arguments import (
    RunArguments,
    Settings,
    parse_arguments,
    resolve_lengths,
)
from .card import metrics_document
from .checks import check_settings
from .data import MissingCorpusError
from .evaluation import keep_training_record, test_results, write_outputs
from .output_folder import (
    load_average,
    prepare_output_dir,
    refuse_to_replace_results,
    restore_trained,
    resume_advice,
    run_finished,
    save_final_model,
    trained_to_the_end,
)
from .preparation import (
    build_model,
    check_splits_not_empty,
    drop_long_training_pairs,
    fit_tokenizer_to_run,
    load_raw_data,
    note_gated_rk2,
    prepare_tokenizer,
    refit_trained_tokenizer,
    set_decoding_defaults,
    splits_to_use,
    tokenize_splits,
)
from .recipe_files import RecipeError, RecipeNotFoundError
from .saved_model import (
    cache_on,
    check_fresh_model_tokenizer,
    check_resume_config,
    check_resume_tokenizer,
    check_saved_model_task,
    load_trainable_model,
    named_tokenizer_for_saved_model,
    saved_model_tokenizer,
)
from .tasks import get_task
from .trainer import (
    PadCollator,
    TokenBudgetSeq2SeqTrainer,
    TokenBudgetTrainer,
    build_seq2seq_compute_metrics,
)

logger = logging.getLogger(__name__)


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


def _make_trainer(settings: Settings, model, tokenizer, splits: dict, collator: PadCollator):
    data_args, run_args, training_args = settings.data, settings.run, settings.training
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
    if get_task(run_args.task).is_lm:
        return TokenBudgetTrainer(**common)
    compute = (
        build_seq2seq_compute_metrics(tokenizer, run_args.task)
        if training_args.predict_with_generate
        else None
    )
    return TokenBudgetSeq2SeqTrainer(**common, compute_metrics=compute)


def _train(trainer, run_args: RunArguments, resume: str | None) -> tuple[dict, TrainerState]:
    """Train, optionally average the last checkpoints, save the model; the train metrics and the trainer state
    to save as the run's last file (as training left it: later evaluations are not training's).

    Resumed from the run's last step (a kill hit its end phases), nothing is trained: the end phases are redone
    from the checkpoint, whose weights are the trained ones bit for bit, so the final model is the one the
    uninterrupted run saves.
    """
    if resume and trained_to_the_end(resume, trainer.args.max_steps):
        metrics = restore_trained(trainer, resume)
    else:
        result = trainer.train(resume_from_checkpoint=resume)
        metrics = {**result.metrics, "global_step": trainer.state.global_step}
        trainer.save_metrics("train", metrics)  # before the end phases, for a run resumed in them
    trainer.log_metrics("train", metrics)
    if run_args.average_last_checkpoints > 1:
        load_average(trainer, run_args.average_last_checkpoints)
    with cache_on(trainer.model):  # the saved config keeps the class default, not training's setting
        save_final_model(trainer)
    return metrics, copy.deepcopy(trainer.state)


def run(settings: Settings) -> dict:
    """Train (``--do_train``), evaluate on the validation split (``--do_eval``) and test (``--do_predict``) as
    described in the module docstring; returns the metrics document (empty without ``--do_predict`` and on
    processes other than the main one).

    Every run that writes into the output folder (training, evaluation, test) holds its lock throughout
    (:func:`ode_transformer.checkpoints.lock_output_dir`): a second run started into it at the same time is refused. An
    evaluation alone (``--do_train false``) does not replace a run's results unless ``--overwrite_output_dir``
    (:func:`ode_transformer.train.output_folder.refuse_to_replace_results`).
    """
    check_settings(settings)
    training_args = settings.training
    writes = training_args.do_train or training_args.do_eval or training_args.do_predict
    try:
        if not (writes and training_args.should_save):
            return _run(settings)
        with lock_output_dir(training_args.output_dir):
            if not training_args.do_train:
                refuse_to_replace_results(training_args, settings.run.overwrite_output_dir)
            return _run(settings)
    except KeyboardInterrupt:
        # Ctrl-C: where the run stands, and how to go on (ode_transformer.cli prints it)
        raise KeyboardInterrupt(resume_advice(training_args)) from None


def _run(settings: Settings) -> dict:
    model_args, data_args, run_args, training_args = (
        settings.model,
        settings.data,
        settings.run,
        settings.training,
    )
    set_seed(training_args.seed)
    # What can be refused is checked before --overwrite_output_dir deletes anything: the data, the M2 file, a
    # saved model's tokenizer and lengths.
    raw, m2_file = load_raw_data(data_args, run_args.task)
    raw_splits = splits_to_use(raw, settings)
    check_splits_not_empty(raw_splits, data_args)
    own_tokenizer = saved_model_tokenizer(model_args)
    saved_model = named_tokenizer = None
    if model_args.model_name_or_path:
        check_saved_model_task(model_args.model_name_or_path, run_args.task)
        # another tokenizer for a saved model must be the one it was trained with: refused before anything is written
        named_tokenizer = named_tokenizer_for_saved_model(model_args, run_args.task)
        if training_args.do_train:  # its weights checked before --overwrite_output_dir deletes anything
            saved_model = load_trainable_model(model_args, run_args.task)
    model_tokenizer = own_tokenizer or named_tokenizer  # a saved model's, checked to fit it
    if model_tokenizer is not None:
        resolve_lengths(data_args, model_tokenizer, model_args.model_name_or_path)
    # One run per output folder; evaluation alone writes only hypotheses and metrics (never over a run's: run()).
    resume = (
        prepare_output_dir(training_args, run_args.overwrite_output_dir) if training_args.do_train else None
    )
    if resume and run_finished(training_args.output_dir, resume, training_args.max_steps):
        logger.warning(
            "%s holds a finished run (its last step is %s): nothing to resume, nothing changed; pass a larger "
            "--max_steps to train on, or choose another --output_dir for a new run",
            training_args.output_dir,
            resume,
        )
        return {}
    tokenizer = model_tokenizer or prepare_tokenizer(
        model_args, training_args, raw_splits.get("train"), run_args.task
    )
    drop_foreign_tokenizer_code(tokenizer, model_args.tokenizer_name or model_args.model_name_or_path)
    if not model_args.model_name_or_path:  # the new model's vocabulary is the tokenizer's
        check_fresh_model_tokenizer(tokenizer, model_args, training_args.output_dir)
    with training_args.main_process_first(desc="tokenize"):
        splits = tokenize_splits(
            raw_splits, tokenizer, run_args.task, data_args, main_process=training_args.process_index == 0
        )
        splits = drop_long_training_pairs(splits, data_args.max_train_tokens)
    model = build_model(model_args, data_args, run_args.task, tokenizer, saved_model)
    if training_args.do_train and training_args.process_index == 0:
        note_gated_rk2(model.config)
    fit_tokenizer_to_run(tokenizer, model.config, run_args.task, data_args)  # saved with the model
    if resume:  # the tokenizer first: an edited one changes the config too, and that message names neither
        folder = model_args.tokenizer_name or (
            model_args.model_name_or_path
            if own_tokenizer is not None
            else f"{training_args.output_dir}/tokenizer"
        )
        check_resume_tokenizer(resume, tokenizer, folder)
        check_resume_config(resume, model.config)
    # and where it was trained: once a resume has accepted it, so that a refused one leaves the folder as it was
    if own_tokenizer is None and not model_args.tokenizer_name and training_args.should_save:
        refit_trained_tokenizer(tokenizer, training_args)
    decoding = set_decoding_defaults(model, run_args, data_args, saved=bool(model_args.model_name_or_path))
    # with the model, the collator adds decoder_input_ids: the Trainer's label smoother takes the labels away
    collator = PadCollator(tokenizer, model=model, word_dropout=data_args.word_dropout)
    trainer = _make_trainer(settings, model, tokenizer, splits, collator)
    trainer.run_id = read_run_id(resume) if resume else None  # a resumed run continues the checkpoint's run
    train_metrics, final_state = _train(trainer, run_args, resume) if training_args.do_train else ({}, None)
    if training_args.do_eval:
        eval_metrics = trainer.evaluate()
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)
    document = {}
    if training_args.do_predict:
        results, hyps = test_results(
            run_args.task, trainer, tokenizer, splits["test"], raw_splits["test"], m2_file, collator
        )
        if trainer.is_world_process_zero():
            document = metrics_document(
                settings, results, decoding, m2_file, train_metrics, model, raw_splits["test"]
            )
            if not training_args.do_train:  # scores of a run's own model, into its folder: its record stays
                document = keep_training_record(
                    document, training_args.output_dir, model_args.model_name_or_path
                )
            write_outputs(training_args.output_dir, trainer, document, hyps)
    if final_state is not None and trainer.is_world_process_zero():
        with replacing(Path(training_args.output_dir) / TRAINER_STATE) as path:
            final_state.save_to_json(str(path))  # last of all: it marks the run finished (run_finished)
    return document


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    datasets.disable_progress_bars()
    try:
        run(parse_arguments(argv))
    except (MissingCorpusError, RecipeNotFoundError, RecipeError) as error:  # a user's setting: one line
        raise SystemExit(report_user_error(__spec__.name, error)) from None
    # training diverged: one line naming the step and the fix, not the trainer's traceback before it
    except FloatingPointError as error:
        raise SystemExit(report_user_error(__spec__.name, error)) from None
    except KeyboardInterrupt as interrupt:  # Ctrl-C: one line saying how to resume (resume_advice)
        raise SystemExit(report_interrupt(__spec__.name, interrupt)) from None
    # Under `accelerate launch` / torchrun: left to interpreter shutdown, the gloo process group's threads can
    # abort a worker after a successful run ("terminate called without an active exception", exit code -6).
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
