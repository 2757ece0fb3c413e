"""The output folder's lifecycle: one run per folder (refused when occupied, unless resumed or overwritten), resume
from its newest complete checkpoint, the final model written whole, checkpoint averaging, and the advice given
when a run is interrupted."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors.torch import load_file
from transformers import Seq2SeqTrainingArguments, TrainerState

from modeling_ode import non_finite_message, non_finite_tensors
from ode_transformer.checkpoints import (
    FINAL_MODEL_STAGING,
    LOCK_FILES,
    STAGING,
    TRAINER_STATE,
    WEIGHTS,
    check_checkpoint_pickles,
    complete_checkpoints,
    missing_part,
    remove_staging,
)
from ode_transformer.files import clear_folder, match_umask, refuse_occupied, saving

from .saved_model import load_state

if TYPE_CHECKING:  # the arguments module imports this one
    from .arguments import DataArguments, ModelArguments

logger = logging.getLogger(__name__)


def refuse_to_delete_inputs(
    model_args: ModelArguments, data_args: DataArguments, training_args: Seq2SeqTrainingArguments
) -> None:
    """``--overwrite_output_dir`` deletes what the output folder holds: never the run's own inputs (data, model,
    tokenizer, M2 file) or the folder the command runs in."""
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
            out,
            overwrite,
            "--overwrite_output_dir",
            "--output_dir",
            what="a run",
            advice="continue it with --resume_from_checkpoint last, " if resumable else "",
            ignore=LOCK_FILES,
        )
    if resume and run_finished(out, resume, training_args.max_steps):
        return resume  # nothing to clean: the run changes nothing
    with training_args.main_process_first(desc="output dir"):
        if training_args.should_save and overwrite:
            clear_folder(out, keep=LOCK_FILES)
        if training_args.should_save and resume:
            remove_staging(out)
    return resume


EVALUATION_RESULTS = {
    "do_predict": ("hub_metrics.json", "test_hypotheses.txt", "test_results.json"),
    "do_eval": ("eval_results.json",),
}
"""The files an evaluation (``--do_train false``) writes into ``--output_dir`` (and ``all_results.json``, whose keys
of the same splits it updates), by the flag that writes them."""


def refuse_to_replace_results(training_args: Seq2SeqTrainingArguments, overwrite: bool) -> None:
    """An evaluation (``--do_train false``) writes into a folder without replacing a run's results: pointed at a
    finished run's own folder, it refuses to replace its ``hub_metrics.json``, hypotheses and scores, which the
    folder's model card shows. ``overwrite`` (``--overwrite_output_dir true``) replaces them; with ``--do_train
    false`` nothing else in the folder is deleted. Called with the folder's lock held.

    Raises:
        FileExistsError: the files it would replace, and the two fixes.
    """
    out = Path(training_args.output_dir)
    names = [
        name for flag, files in EVALUATION_RESULTS.items() if getattr(training_args, flag) for name in files
    ]
    found = [name for name in names if (out / name).exists()]
    if found and not overwrite:
        whose = " of a training run" if (out / TRAINER_STATE).is_file() else ""
        raise FileExistsError(
            f"{out} already holds the results{whose} that this evaluation would replace ({', '.join(found)}); "
            "write the evaluation into a fresh --output_dir, or pass --overwrite_output_dir true to replace them"
        )


def read_json(path: Path) -> dict | None:
    """A JSON file's object, or ``None`` when it is missing or cut off (a kill while it was written)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None


def trained_to_the_end(checkpoint: str | Path, max_steps: int) -> bool:
    """Whether ``checkpoint`` is the run's last step (``--max_steps``, else the step count the run planned)."""
    state = read_json(Path(checkpoint) / TRAINER_STATE) or {}
    last = max_steps if max_steps > 0 else state.get("max_steps", 0)
    return state.get("global_step", -1) >= last > 0


def run_finished(output_dir: str | Path, checkpoint: str | Path, max_steps: int) -> bool:
    """Whether the run of ``output_dir`` finished after ``checkpoint``, its last step: the run's own
    ``trainer_state.json``, written last of all, is complete and at that step."""
    if not trained_to_the_end(checkpoint, max_steps):
        return False
    final = read_json(Path(output_dir) / TRAINER_STATE) or {}
    return final.get("global_step") == (read_json(Path(checkpoint) / TRAINER_STATE) or {}).get("global_step")


def restore_trained(trainer, checkpoint: str) -> dict:
    """The trainer state and weights of the run's last checkpoint (the best one with ``--load_best_model_at_end``,
    as training ends); the train metrics the run saved, if it got that far."""
    logger.warning("%s is the run's last step: nothing to train, finishing the run from it", checkpoint)
    trainer.state = TrainerState.load_from_json(str(Path(checkpoint) / TRAINER_STATE))
    weights = checkpoint
    if trainer.args.load_best_model_at_end and trainer.state.best_model_checkpoint:
        weights = trainer.state.best_model_checkpoint
    load_state(trainer.model, load_file(str(Path(weights) / WEIGHTS)), weights)
    saved = read_json(Path(trainer.args.output_dir) / "train_results.json") or {}
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
            f"{non_finite_message('the final model', bad)}: not saved; train again with a lower --learning_rate "
            f"(was {trainer.args.learning_rate:g})."
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
        match_umask(staged)  # safetensors writes its file 0600; the folder's other files are the umask's
        for file in sorted(staged.iterdir()):
            os.replace(file, out / file.name)  # one rename per file: each is whole, old or new
        staged.rmdir()
        with contextlib.suppress(OSError):  # not empty: a checkpoint's staging, the next save clears it
            staged.parent.rmdir()
    trainer.accelerator.wait_for_everyone()


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


def load_average(trainer, last: int) -> None:
    """Replace the trained weights by the average of the last ``last`` checkpoints."""
    from .averaging import average_checkpoints, last_checkpoints

    paths = last_checkpoints(trainer.args.output_dir, last)
    load_state(trainer.model, average_checkpoints(paths), "averaged checkpoint")
    logger.info("averaged %d checkpoints: %s", len(paths), ", ".join(str(p) for p in paths))
