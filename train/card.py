"""What a run of :mod:`ode_transformer.train.run` says about itself on its model card: the metrics document
(``hub_metrics.json``, in the schema of :mod:`ode_transformer.card_metrics`) built from the run's arguments, test
results and trained model, and the card written from it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from datasets import Dataset

from modeling_ode import ODETransformerConfig
from ode_transformer.model_card_writer import write_model_card
from ode_transformer.precision import PrecisionChoice, choose_precision
from ode_transformer.wording import counted

from .tasks import get_task

if TYPE_CHECKING:
    from .arguments import DataArguments, Settings

logger = logging.getLogger(__name__)

# Shared corpora as the model card names them: (display name, Hub id of the public original).
CORPUS_CARDS: dict[str, tuple[str, str]] = {
    "multi30k": ("Multi30k Task 1", "bentrevett/multi30k"),
    "libreoffice": ("LibreOffice help (built locally)", "libreoffice-help"),
    "cnndm": ("CNN/DailyMail (See et al. preprocessing)", "abisee/cnn_dailymail"),
    "wi_locness": ("BEA-2019 Write & Improve", "wi_locness"),
    "fce": ("FCE v2.1", "fce"),
    "ptb": ("Penn Treebank (Mikolov)", "ptb_text_only"),
    "conll2013": ("CoNLL-2013 test", "conll2013"),
}
# The language of the shared corpora that have one language (the card's `language` metadata).
CORPUS_LANGUAGES = {"cnndm": "en", "wi_locness": "en", "fce": "en", "ptb": "en"}


LOCAL_DATA = ("local data", "local")  # the card's name and id of data given as local files


def data_name(data_args: DataArguments) -> tuple[str, str]:
    """(name, id) of the data for the card: ``--dataset_name``, else the shared corpus's card, else the Hub id.
    Local files and folders are never named by their path (ode-push would publish it): "local data"."""
    if data_args.dataset_name:
        return data_args.dataset_name, data_args.dataset_name
    if data_args.dataset:
        first = data_args.dataset.split("+")[0]
        return CORPUS_CARDS.get(first, (first, first))
    if data_args.hub_dataset and not Path(data_args.hub_dataset).expanduser().exists():
        return data_args.hub_dataset, data_args.hub_dataset
    return LOCAL_DATA


def dataset_card(data_args: DataArguments, task: str, m2_file: str | None, rows: int) -> dict:
    """The ``dataset`` entry of the metrics JSON for the test split, of which ``rows`` were scored (the first
    ``--max_test_samples``, named ``test[:N]`` as a datasets slice, or all of it); the split is named as what was
    scored, ``validation`` where the data has no test split (``data_args.scored_split``)."""
    if data_args.test_file:  # scored on the user's own file, whatever corpus trained the model
        name, hub_id = (data_args.dataset_name,) * 2 if data_args.dataset_name else LOCAL_DATA
    elif get_task(task).m2_scored and m2_file:
        name, hub_id = CORPUS_CARDS["conll2013"]
    else:
        name, hub_id = data_name(data_args)
    sliced = data_args.max_test_samples is not None and rows == data_args.max_test_samples
    split = data_args.scored_split
    card = {"name": name, "id": hub_id, "split": f"{split}[:{rows}]" if sliced else split, "rows": rows}
    if data_args.hub_config and not data_args.test_file and not data_args.dataset:  # the Hub dataset's own
        card["config"] = data_args.hub_config  # config (a recipe's names the Hub copy of its shared corpus)
    return card


SHAPE_FIELDS = (
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "encoder_attention_heads",
    "decoder_attention_heads",
)


def model_shape(config: ODETransformerConfig) -> str:
    """The trained model's dimensions in words, e.g. ``3-3 layers, d_model 256, FFN 1024, 4 heads``."""
    if not config.is_encoder_decoder:
        return f"{counted(config.decoder_layers, 'layer')}, d_model {config.d_model}, FFN {config.decoder_ffn_dim}, {config.decoder_attention_heads} heads"
    return (
        f"{config.encoder_layers}-{config.decoder_layers} layers, d_model {config.d_model}, "
        f"FFN {config.encoder_ffn_dim}/{config.decoder_ffn_dim}, "
        f"{config.encoder_attention_heads}/{config.decoder_attention_heads} heads"
    )


def training_datasets(data_args: DataArguments) -> list[str]:
    """Hub ids of the training data, for the card's ``datasets`` metadata (none for local files and folders)."""
    if data_args.dataset:
        return [CORPUS_CARDS[name][1] for name in data_args.dataset.split("+") if name in CORPUS_CARDS]
    name, hub_id = data_name(data_args)
    return [hub_id] if data_args.hub_dataset and (name, hub_id) != LOCAL_DATA else []


def card_language(data_args: DataArguments, task: str) -> list[str] | None:
    """ISO 639-1 codes for the card (source first): the translation pair, else the shared corpus's language."""
    if get_task(task).language_pair:
        pair = [data_args.source_lang, data_args.target_lang]
        return pair if all(pair) else None
    first = (data_args.dataset or "").split("+")[0]
    return [CORPUS_LANGUAGES[first]] if first in CORPUS_LANGUAGES else None


def precision_record(choice: PrecisionChoice) -> dict:
    """The recipe's precision rows: what was chosen, and why (read back by experiments.run)."""
    return {"precision": choice.precision, "precision_reason": choice.reason}


def training_card(settings: Settings, train_metrics: dict, config: ODETransformerConfig) -> dict:
    """The ``training`` entry of the metrics JSON: data and recipe of this run (the model's actual shape,
    with the preset named only when nothing overrode its dimensions)."""
    model_args, data_args, run_args, training_args = (
        settings.model,
        settings.data,
        settings.run,
        settings.training,
    )
    overrides = model_args.overrides()
    shape = model_shape(config)
    if not any(key in overrides for key in SHAPE_FIELDS):
        shape += f" (preset {model_args.preset})"
    return {
        "data": data_name(data_args)[0],
        "datasets": training_datasets(data_args),
        "recipe": {
            "model": shape,
            **{key: value for key, value in overrides.items() if key not in SHAPE_FIELDS},
            "optimizer": f"Adam ({training_args.adam_beta1}, {training_args.adam_beta2})",
            "lr": training_args.learning_rate,
            "lr_scheduler": str(training_args.lr_scheduler_type.value),
            "warmup_steps": training_args.warmup_steps,
            "max_tokens": data_args.max_tokens,
            **({"max_train_tokens": data_args.max_train_tokens} if data_args.max_train_tokens else {}),
            "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
            "steps": train_metrics.get("global_step"),
            **(
                {"average_last_checkpoints": averaged}
                if (averaged := run_args.average_last_checkpoints) > 1
                else {}
            ),
            **precision_record(choose_precision(training_args.device, run_args.precision)),
        },
        "notes": f"train_runtime {train_metrics.get('train_runtime', 0):.0f} s",
    }


def usage_example(task: str, raw_test: Dataset) -> str:
    """The model card's usage input: the first test source (a language model: its first three words)."""
    if get_task(task).is_lm:
        return " ".join(raw_test[0]["text"].split()[:3])
    return raw_test[0]["source"].strip()


def metrics_document(
    settings: Settings,
    results: list[dict],
    decoding: dict,
    m2_file: str | None,
    train_metrics: dict,
    model,
    raw_test: Dataset,
) -> dict:
    """The metrics JSON in the schema of :mod:`ode_transformer.card_metrics` (``training`` only when this run trained)."""
    data_args, run_args = settings.data, settings.run
    document = {
        "task": get_task(run_args.task).hub_tag,
        "dataset": dataset_card(data_args, run_args.task, m2_file, raw_test.num_rows),
        "results": results,
        "example": usage_example(run_args.task, raw_test),
    }
    if train_metrics:
        document["training"] = training_card(settings, train_metrics, model.config)
    if language := card_language(data_args, run_args.task):
        document["language"] = language
    base = settings.model.model_name_or_path
    if train_metrics and base and not Path(base).exists():  # fine-tuned from a Hub model
        document["base_model"] = base
    if not get_task(run_args.task).is_lm:
        document["decoding"] = {
            **{k: decoding[k] for k in ("num_beams", "length_penalty")},
            "precision": "fp32",
        }
    return document


def write_card(output_dir: str, document: dict) -> None:
    """The run's model card, ``OUTPUT_DIR/README.md``, written from ``document``."""
    path = write_model_card(output_dir, document)
    logger.info("model card: %s", path)
