"""Model cards for trained ODE Transformer folders.

One entry point, :func:`write_model_card`, builds ``README.md`` in a model folder from the folder's
``config.json`` and a metrics JSON written by the training/evaluation scripts. It is shared ground
of the two tools: a training run writes its folder's card (``ode_transformer.train.card``), ``ode-export`` the
export's, and ``ode-model-card`` (``ode_transformer.hub.model_card``) any folder's. The card's YAML
metadata (`ModelCardData` with a ``model-index`` built from `EvalResult`s) is what the Hub indexes; the body
describes the ODE configuration in words, the results with their sacreBLEU signatures, the training data and
recipe, intended use and limitations, how to load and generate, and the paper's citation.

The metrics JSON's schema is a dataclass, :class:`~ode_transformer.card_metrics.CardMetrics`; the configuration
in words comes from :mod:`ode_transformer.config_in_words`; the card's text is the template
``model_card_template.md`` (shipped beside this module), whose ``${fields}`` :func:`build_model_card` fills.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from string import Template
from typing import Any

import yaml
from huggingface_hub import ModelCard, ModelCardData
from huggingface_hub.repocard_data import model_index_to_eval_results

from .card_metrics import CardMetrics, load_metrics
from .config_in_words import card_title, count_parameters, default_task, describe_ode, human_count
from .files import replacing

__all__ = [
    "CITATION",
    "usage_snippets",
    "trained_length",
    "onnx_graphs",
    "onnx_section",
    "validate_card_locally",
    "write_model_card",
]

# The card's text, with the `${field}`s `build_model_card` fills (string.Template).
CARD_TEMPLATE = Path(__file__).with_name("model_card_template.md")

# Title and authors as in the paper's .tex (tests/test_hub.py checks them against it).
PAPER_TITLE = "ODE Transformer: An Ordinary Differential Equation-Inspired Model for Sequence Generation"
PAPER_AUTHORS = (
    "Bei Li",
    "Quan Du",
    "Tao Zhou",
    "Yi Jing",
    "Shuhan Zhou",
    "Xin Zeng",
    "Tong Xiao",
    "Jingbo Zhu",
    "Xuebo Liu",
    "Min Zhang",
)


def _bibtex_author(name: str) -> str:
    first, last = name.rsplit(" ", 1)
    return f"{last}, {first}"


CITATION = f"""@inproceedings{{li-etal-2022-ode,
    title = "{{ODE}} Transformer: An Ordinary Differential Equation-Inspired Model for Sequence Generation",
    author = "{" and ".join(_bibtex_author(a) for a in PAPER_AUTHORS)}",
    booktitle = "Proceedings of the 60th Annual Meeting of the Association for Computational Linguistics (Volume 1: Long Papers)",
    month = may,
    year = "2022",
    address = "Dublin, Ireland",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/2022.acl-long.571",
    doi = "10.18653/v1/2022.acl-long.571",
    pages = "8335--8351",
}}"""

_PIPELINE_TAGS = {
    "translation": "translation",
    "summarization": "summarization",
    "text2text-generation": "text2text-generation",
    "text-generation": "text-generation",
    "grammatical-error-correction": "text2text-generation",
}


# ----------------------------------------------------------------------------------------------------------
# The card
# ----------------------------------------------------------------------------------------------------------


def _results_table(metrics: CardMetrics) -> str:
    rows = ["| Dataset | Split | Metric | Value | Signature |", "|---|---|---|---|---|"]
    for result, dataset in zip(metrics.results, metrics.scored_datasets()):
        name = dataset["name"] + (f" ({dataset['config']})" if dataset.get("config") else "")
        # A "|" inside a table cell must be escaped, even inside a code span (GitHub-flavoured Markdown).
        signature = f"`{result['signature'].replace('|', chr(92) + '|')}`" if result.get("signature") else "-"
        rows.append(
            f"| {name} | {dataset['split']} | {result.get('name', result['metric'])} | "
            f"{float(result['value']):.2f} | {signature} |"
        )
    if scored := metrics.dataset.get("rows"):
        rows.append(f"\n{metrics.dataset['name']} {metrics.dataset['split']}: {scored:,} examples scored.")
    decoding = metrics.decoding
    if decoding:
        settings = [f"{key.replace('_', ' ')} {value}" for key, value in decoding.items()]
        rows.append(f"\nDecoding: {', '.join(settings)}.")
    return "\n".join(rows)


def _training_section(metrics: CardMetrics | None) -> str:
    training = (metrics.training if metrics is not None else None) or {}
    if not training:
        return "Not recorded for this model."
    parts = []
    if training.get("data"):
        parts.append(f"**Data**: {training['data']}")
    recipe = training.get("recipe") or {}
    if recipe:
        parts.append(
            "| Setting | Value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in recipe.items())
        )
    if training.get("notes"):
        parts.append(str(training["notes"]))
    return "\n\n".join(parts)


# Usage examples when the metrics JSON has none: neutral, in the source language of most trained models.
_EXAMPLES = {
    "summarization": "The city council approved the new budget on Tuesday after a long debate. It includes more "
    "money for schools and public transport, and the mayor said it would be balanced by the end of the year.",
    "text2text-generation": "She go to school every days .",
    "grammatical-error-correction": "She go to school every days .",
    "text-generation": "The",
}
_DEFAULT_EXAMPLE = "The weather is nice today."


EXCERPT_CHARS = 300  # a card's example input is an excerpt, not a whole article


def _excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """``text`` cut at a word boundary before ``limit`` characters (with " ..."), if it is longer."""
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


def usage_snippets(
    config,
    repo: str,
    metrics: CardMetrics | None,
    generation: dict[str, Any],
    trained_length: int | None = None,
) -> list[str]:
    """The card's code: transformers alone with remote code (runs where this package is not installed), then
    the package's one-call helper. tests/test_hub.py runs both as written. ``trained_length``: the folder's
    (:func:`trained_length`), the length its tokenizer truncates to."""
    task = (metrics and metrics.task) or default_task(config)
    example = json.dumps(
        _excerpt((metrics and metrics.example) or _EXAMPLES.get(task, _DEFAULT_EXAMPLE)), ensure_ascii=False
    )
    if config.is_encoder_decoder:
        decoding = {**generation, **((metrics and metrics.decoding) or {})}
        settings = (
            f"beam {decoding.get('num_beams', 1)}, length penalty {decoding.get('length_penalty', 1.0)}"
        )
        auto_class, generate, extra = "AutoModelForSeq2SeqLM", "model.generate(**inputs)", ""
        comment = f"  # {settings}: generation_config.json"
    else:
        auto_class, generate, extra = (
            "AutoModelForCausalLM",
            "model.generate(**inputs, max_new_tokens=20)",
            ", max_new_tokens=20",
        )
        comment = "  # <s> + prompt: the model continues it"
    cut = (
        f"  # truncation=True cuts inputs to {trained_length} tokens, the trained length"
        if trained_length
        else ""
    )
    plain = f"""from transformers import {auto_class}, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{repo}", trust_remote_code=True){cut}
model = {auto_class}.from_pretrained("{repo}", trust_remote_code=True).eval()
inputs = tokenizer([{example}], truncation=True, padding=True, return_tensors="pt"){comment}
print(tokenizer.batch_decode({generate}, skip_special_tokens=True))"""
    helper = f"""from ode_transformer import generate_texts, load_for_generation

model, tokenizer = load_for_generation("{repo}")
print(generate_texts(model, tokenizer, [{example}]{extra}))  # a list of any length, batched by length"""
    return [plain, helper]


def _load_config(model_dir: Path):
    """The folder's config, refused unless it is an ODE Transformer's: the card would otherwise describe another
    model (a BART folder, say) as one."""
    from modeling_ode import ODETransformerConfig
    from ode_transformer.loading import ode_model_config

    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} has no config.json; pass a folder written by save_pretrained.")
    data = ode_model_config(model_dir)
    for key in ("auto_map", "architectures", "transformers_version", "model_type", "dtype", "torch_dtype"):
        data.pop(key, None)
    return ODETransformerConfig(**data)


def trained_length(model_dir: str | Path) -> int | None:
    """The input length the model was trained on, as its tokenizer carries it: ``model_max_length`` in
    ``tokenizer_config.json`` (``ode-train`` saves its ``--max_source_length`` there, a language model's
    ``--max_target_length``), else the ``truncation`` of ``tokenizer.json``; None where the folder has neither.
    Not ``max_position_embeddings``: the sinusoidal positions work at any length, and that field bounds nothing."""
    from modeling_ode.tokenizer_limits import NO_LENGTH_LIMIT

    model_dir = Path(model_dir)
    for name, keys in (
        ("tokenizer_config.json", ("model_max_length",)),
        ("tokenizer.json", ("truncation", "max_length")),
    ):
        try:
            value: Any = json.loads((model_dir / name).read_text(encoding="utf-8"))
            for key in keys:
                value = value.get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value < NO_LENGTH_LIMIT:
            return value
    return None


_VALIDATION_SPLITS = ("validation", "valid", "dev")


def _scores_note(metrics: CardMetrics | None) -> str:
    """The card's words on what its scores were computed on (the split the results name, a slice such as
    ``test[:100]`` as its split): a validation split where no test split was scored is said to be one; nothing
    without results."""
    if metrics is None:
        return ""
    scored = {(dataset["name"], str(dataset["split"]).split("[")[0]) for dataset in metrics.scored_datasets()}
    if len(scored) > 1:
        sets = f"{len(scored)} evaluation sets (those of the table)"
    else:
        ((_, split),) = scored
        sets = {"test": "one test set"}.get(split) or (
            "one validation set (no test split was scored)"
            if split in _VALIDATION_SPLITS
            else f"one {split} split"
        )
    return f" The scores above are corpus-level metrics on {sets} and say little about single outputs."


def _length_limits(length: int | None) -> str:
    """The card's words on lengths: the trained length and the tokenizer's truncation are one number."""
    positions = "longer inputs run (the sinusoidal positions are computed for any length; `max_position_embeddings`\nbounds nothing)"
    if length is None:
        return f"Its tokenizer records no trained length, so `truncation=True` cuts nothing; {positions}."
    return (
        f"The model was trained on inputs of up to {length} tokens, and its tokenizer truncates to that length with\n"
        f"`truncation=True` (`model_max_length` {length}); {positions} but were never seen in training."
    )


def onnx_graphs(model_dir: str | Path) -> list[str]:
    """The ONNX graphs in ``model_dir/onnx`` (``ode-export --onnx`` writes them), by file name."""
    return sorted(path.name for path in (Path(model_dir) / "onnx").glob("*.onnx"))


def onnx_section(graphs: list[str], repo: str) -> str:
    """The card's words on the ONNX graphs of its folder's ``onnx/`` (nothing where it has none): what they are and
    what decodes them."""
    if not graphs:
        return ""
    search = [name for name in graphs if name.startswith("beam_search_model")]
    loop = [name for name in graphs if name not in search]
    text = (
        f"\n\n### ONNX\n\n`onnx/` holds this model's ONNX graphs (`ode-export --onnx`): "
        f"{', '.join(f'`{name}`' for name in loop)}, named as 🤗 Optimum names a seq2seq model's"
    )
    if search:
        text += (
            f", and `{search[0]}`, the whole beam search in one graph (onnxruntime's `BeamSearch` op: int64 "
            "`input_ids` and `attention_mask` in, `sequences` padded with the pad id out, which "
            "`tokenizer.batch_decode` reads)"
        )
    return (
        f"{text}. With the package's `[onnx]` extra, `ode-translate {repo} --backend onnx --input src.txt` decodes "
        "with them; its ONNX guide (`hub/README.md`, shipped in the package as `ode_transformer/hub/README.md`) "
        "describes their inputs and outputs and how onnxruntime or Optimum loads them."
    )


def _generation_defaults(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "generation_config.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def build_model_card(
    model_dir: str | Path,
    metrics: str | Path | Mapping[str, Any] | CardMetrics | None,
    repo_id: str | None = None,
    graphs: list[str] | None = None,
) -> ModelCard:
    """The card as a `ModelCard` (see :func:`write_model_card`): its metadata, and the template filled."""
    model_dir = Path(model_dir)
    graphs = onnx_graphs(model_dir) if graphs is None else graphs
    config = _load_config(model_dir)
    data = load_metrics(metrics)
    model_name = (data and data.model_name) or (
        repo_id.split("/")[-1] if repo_id else model_dir.resolve().name
    )
    task = (data and data.task) or default_task(config)
    training = (data and data.training) or {}
    train_datasets = list(training.get("datasets") or [])
    card_data = ModelCardData(
        model_name=model_name,
        language=data.language if data else None,
        license=data.license if data else "apache-2.0",
        library_name="transformers",
        pipeline_tag=_PIPELINE_TAGS.get(
            task, "text2text-generation" if config.is_encoder_decoder else "text-generation"
        ),
        tags=["ode-transformer", "runge-kutta", "custom_code", task],
        datasets=train_datasets or None,
        base_model=data.base_model if data else None,
        metrics=sorted({r["metric"] for r in data.results}) if data else None,
        eval_results=data.eval_results() if data else None,
    )
    params = count_parameters(config)
    length = trained_length(model_dir)
    repo = repo_id or f"path/to/{model_name}"
    plain, helper = usage_snippets(config, repo, data, _generation_defaults(model_dir), length)
    text = Template(CARD_TEMPLATE.read_text(encoding="utf-8")).substitute(
        metadata=card_data.to_yaml(),
        title=card_title(config, data),
        task=task.replace("-", " "),
        model_details="\n".join(describe_ode(config)),
        parameters=f"{params['total']:,} ({human_count(params['total'])}; {params['non_embedding']:,} without "
        "embeddings)",
        results=_results_table(data) if data else "No evaluation results were recorded for this model.",
        training=_training_section(data),
        scores_note=_scores_note(data),
        length_limits=_length_limits(length),
        plain_usage=plain,
        helper_usage=helper,
        onnx=onnx_section(graphs, repo),
        citation=CITATION,
    )
    return ModelCard(text)


def write_model_card(
    model_dir: str | Path,
    metrics_path_or_dict: str | Path | Mapping[str, Any] | CardMetrics | None,
    repo_id: str | None = None,
    graphs: list[str] | None = None,
) -> Path:
    """Write `model_dir/README.md` from the folder's config.json and a metrics JSON (path, dict or
    :class:`CardMetrics`; None writes a card without results). Returns the card's path. ``graphs``: the ONNX
    graphs the folder's ``onnx/`` holds, which the card names (default: those in it, :func:`onnx_graphs`)."""
    card = build_model_card(model_dir, metrics_path_or_dict, repo_id, graphs)
    path = Path(model_dir) / "README.md"
    with replacing(path) as temporary:  # whole or not at all
        card.save(temporary)
    validate_card_locally(path)
    return path


def validate_card_locally(path: str | Path) -> ModelCard:
    """Offline validation: `ModelCard.validate()` posts to the Hub's /api/validate-yaml and needs the network,
    so this parses the YAML metadata with `ModelCardData` and the model-index with huggingface_hub's own parser
    (which raises on a malformed model-index) and checks every result has a numeric value."""
    card = ModelCard.load(path)
    metadata = yaml.safe_load(card.content.split("---")[1])
    ModelCardData(**metadata)  # the metadata parses as model-card data
    if "model-index" in metadata:
        name, results = model_index_to_eval_results(metadata["model-index"])
        if not name or not results:
            raise ValueError(f"{path}: the model-index has no name or no results.")
        for result in results:
            if isinstance(result.metric_value, bool) or not isinstance(result.metric_value, (int, float)):
                raise ValueError(f"{path}: metric {result.metric_type!r} has a non-numeric value.")
    return card
