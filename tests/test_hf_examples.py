"""The flows of transformers' example scripts run_summarization.py and run_translation.py on an ODE model folder,
step by step as the scripts make them (the scripts are not part of the transformers package): Auto* loading, their
position check for `--max_source_length`, DataCollatorForSeq2Seq with the model, Seq2SeqTrainer with
`--label_smoothing_factor`, `--predict_with_generate`, `--generation_max_length` and `--val_max_target_length`."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from tiny_folder import save_tiny_folder
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

import modeling_ode  # noqa: F401  (registers the model with the Auto classes)

LONG_SOURCE = " ".join(["the dog runs in the park and a cat sleeps on the warm mat"] * 30)
PAIRS = [("the dog runs in the park", "zwei Hunde spielen im Schnee"), (LONG_SOURCE, "a cat sleeps")] * 4


def load_as_the_scripts_do(folder, max_source_length: int):
    """run_summarization.py / run_translation.py: Auto* from the folder, then their position check."""
    config = AutoConfig.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, config=config)
    if model.config.max_position_embeddings < max_source_length:  # --resize_position_embeddings unset: resize
        model.resize_position_embeddings(max_source_length)
    return model, tokenizer


def tokenized(tokenizer, max_source_length: int, max_target_length: int) -> Dataset:
    """The scripts' preprocess_function (padding False; labels from text_target)."""
    sources, targets = zip(*PAIRS)
    inputs = tokenizer(list(sources), max_length=max_source_length, truncation=True)
    labels = tokenizer(text_target=list(targets), max_length=max_target_length, truncation=True)
    return Dataset.from_dict({**inputs, "labels": labels["input_ids"]})


def trainer_for(model, tokenizer, dataset, tmp_path, **args) -> Seq2SeqTrainer:
    arguments = Seq2SeqTrainingArguments(
        tmp_path / "out", max_steps=2, per_device_train_batch_size=4, per_device_eval_batch_size=4,
        label_smoothing_factor=0.1, predict_with_generate=True, use_cpu=True, report_to="none", **args,
    )  # fmt: skip
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    return Seq2SeqTrainer(
        model=model, args=arguments, train_dataset=dataset, eval_dataset=dataset,
        data_collator=collator, processing_class=tokenizer,
    )  # fmt: skip


def test_run_summarization_with_its_default_max_source_length_1024(tmp_path):
    """The folder was trained for 128 positions; `--max_source_length 1024` (the script's default) resizes, then a
    source of more than 128 tokens trains, evaluates and predicts. Within the trained length nothing changed."""
    save_tiny_folder(tmp_path / "model")
    model, tokenizer = load_as_the_scripts_do(tmp_path / "model", 1024)
    assert model.config.max_position_embeddings == 1024
    dataset = tokenized(tokenizer, 1024, 128)
    assert max(map(len, dataset["input_ids"])) > 128
    trainer = trainer_for(model, tokenizer, dataset, tmp_path)
    assert torch.isfinite(torch.tensor(trainer.train().training_loss))
    assert torch.isfinite(torch.tensor(trainer.evaluate(max_length=9, num_beams=2)["eval_loss"]))
    assert trainer.predict(dataset, max_length=9, num_beams=2).predictions.shape[0] == len(PAIRS)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "model").eval()
    trained_for = tokenizer(PAIRS[0][0], return_tensors="pt")
    with torch.no_grad():
        fresh = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "model").eval()
        fresh.resize_position_embeddings(1024)
        torch.testing.assert_close(fresh(**trained_for, labels=trained_for["input_ids"]).logits,
                                   reloaded(**trained_for, labels=trained_for["input_ids"]).logits)  # fmt: skip


def output_lengths(predictions, pad_token_id: int) -> list[int]:
    """Tokens of each prediction (Seq2SeqTrainer pads them to the generation config's max_length, as for BART)."""
    return (torch.as_tensor(predictions) != pad_token_id).sum(1).tolist()


@pytest.mark.parametrize("flag", ["generation_max_length", "val_max_target_length"])
def test_the_users_output_length_caps_the_predictions(tmp_path, flag):
    """A folder saved as ode_transformer.train.run saves it decodes up to 8 tokens (generation config max_length 9); the user's
    `--generation_max_length` (Seq2SeqTrainingArguments) or `--val_max_target_length` (which run_translation.py
    passes to predict() as max_length) caps the predictions, as for BART; so do generate()'s max_length and
    max_new_tokens, each giving the prefix of the uncapped greedy output."""
    save_tiny_folder(tmp_path / "model", weight_scale=3)
    model, tokenizer = load_as_the_scripts_do(tmp_path / "model", 128)
    dataset = tokenized(tokenizer, 128, 128)
    pad = tokenizer.pad_token_id
    uncapped = output_lengths(
        trainer_for(model, tokenizer, dataset, tmp_path).predict(dataset).predictions, pad
    )
    assert max(uncapped) > 4  # this model writes more than 3 tokens (and a start token) for some source
    if flag == "generation_max_length":
        trainer = trainer_for(model, tokenizer, dataset, tmp_path, generation_max_length=4)
        predictions = trainer.predict(dataset).predictions
    else:
        predictions = (
            trainer_for(model, tokenizer, dataset, tmp_path).predict(dataset, max_length=4).predictions
        )
    assert max(output_lengths(predictions, pad)) == 4  # capped: not the folder's up to 9
    source = tokenizer([PAIRS[uncapped.index(max(uncapped))][0]], return_tensors="pt")
    with torch.no_grad():
        greedy = model.generate(**source, num_beams=1)
        assert greedy.shape[1] > 4
        assert torch.equal(model.generate(**source, num_beams=1, max_length=4), greedy[:, :4])
        assert torch.equal(model.generate(**source, num_beams=1, max_new_tokens=3), greedy[:, :4])


def test_every_preset_takes_the_scripts_default_source_length():
    """docs/training.md: `max_position_embeddings` bounds nothing and is the preset's 1024 (or more), the tiny
    preset's included, so that run_translation.py's position check accepts a tiny run's folder at its default
    `--max_source_length 1024`."""
    from modeling_ode.configuration_ode_transformer import PRESETS, ODETransformerConfig

    for preset in PRESETS:
        assert ODETransformerConfig.from_preset(preset).max_position_embeddings >= 1024, preset
