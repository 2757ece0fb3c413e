"""Model cards for trained ODE Transformer folders.

One entry point, :func:`write_model_card`, builds ``README.md`` in a model folder from the folder's
``config.json`` and a metrics JSON written by the training/evaluation scripts (schema below). It is shared ground
of the two tools: a training run writes its folder's card (``ode_transformer.train.card``), ``ode-export`` the
export's, and ``ode-model-card`` (``ode_transformer.hub.model_card``) any folder's. The card's YAML
metadata (`ModelCardData` with a ``model-index`` built from `EvalResult`s) is what the Hub indexes; the body
describes the ODE configuration in words, the results with their sacreBLEU signatures, the training data and
recipe, intended use and limitations, how to load and generate, and the paper's citation.

Metrics JSON schema (file name by convention ``hub_metrics.json`` next to the weights)::

    {
      "task": "translation",              # required: Hub task id (translation, summarization,
                                          #   text2text-generation, text-generation, ...)
      "task_name": "Machine translation", # optional: human-readable task name
      "language": ["en", "de"],           # optional: ISO 639-1 codes (source first)
      "base_model": "USER/NAME",          # optional: the Hub model this one was fine-tuned from
      "license": "apache-2.0",            # optional, default apache-2.0
      "model_name": "ode-transformer-rk2-base-wmt14-en-de",  # optional, default repo name / folder name
      "title": "ODE Transformer ...",     # optional: the card's heading (default: built from the config)
      "example": "A sentence.",           # optional: input of the usage snippet (ode_transformer.train.run: the first test
                                          #   source); default a neutral one for the task
      "dataset": {                        # required: the default evaluation dataset of every result
        "name": "WMT14 English-German",   #   required: human-readable name
        "id": "wmt/wmt14",                #   required: Hub dataset id (model-index dataset.type)
        "config": "de-en",                #   optional
        "split": "test",                  #   required
        "rows": 3003,                     #   optional: how many examples were scored
        "revision": null                  #   optional
      },
      "results": [                        # required, at least one
        {"metric": "sacrebleu",           #   required: metric id (model-index metrics.type)
         "name": "BLEU",                  #   optional: display name (default: the metric id)
         "value": 29.03,                  #   required: a number
         "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0",  # optional (sacrebleu)
         "dataset": {"name": "newstest2013", "split": "validation"}}  # optional: overrides keys of "dataset"
      ],
      "training": {                       # optional
        "data": "WMT14 En-De, 4.5M sentence pairs, joint BPE (32k)",  # free text
        "datasets": ["wmt/wmt14"],        # optional: Hub dataset ids of the training data (card metadata)
        "recipe": {"optimizer": "Adam (0.9, 0.997)", "lr": 0.002, "warmup_updates": 16000},  # any key: value
        "notes": "average of the last 5 checkpoints"  # optional free text
      },
      "decoding": {"num_beams": 4, "length_penalty": 0.6, "precision": "fp32"}  # optional: the decoding
                                          #   of the results (precision: fp32, bf16, ...)
    }

A signature is kept in the model-index as ``metrics[].args.signature`` and shown in the results table.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.repocard_data import model_index_to_eval_results

from .files import replacing
from .wording import GATED_RK2_FINDING, counted, gated_rk2_sides

__all__ = [
    "CITATION",
    "METRICS_FILENAME",
    "card_title",
    "usage_snippets",
    "count_parameters",
    "describe_ode",
    "trained_length",
    "load_metrics",
    "onnx_graphs",
    "onnx_section",
    "validate_card_locally",
    "write_model_card",
]

METRICS_FILENAME = "hub_metrics.json"

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
# Metrics JSON
# ----------------------------------------------------------------------------------------------------------


SCHEMA_ERROR = (
    "metrics JSON{source} does not follow the schema in ode_transformer/model_card.py; missing or malformed: "
)


def _read_metrics_file(path: Path) -> Any:
    """The parsed JSON of ``path``; a missing file or invalid JSON is an error naming the file (json's own
    message names only a line and column)."""
    if not path.is_file():
        raise FileNotFoundError(
            f"metrics JSON {path} does not exist{' (it is a folder)' if path.is_dir() else ''}; pass the "
            f"metrics file ({METRICS_FILENAME}, schema in ode_transformer/model_card.py)."
        )
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(
            f"metrics JSON {path} is not valid JSON ({error}); fix the file: it must hold one object following "
            "the schema in ode_transformer/model_card.py."
        ) from None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _dataset_problems(dataset: Mapping[str, Any], field: str) -> list[str]:
    """Malformed optional keys of a dataset object (the card formats them: a string ``rows`` would crash it)."""
    rows = dataset.get("rows")
    if rows is not None and not _is_count(rows):
        return [f"'{field}.rows' (a whole number of examples scored, got {rows!r})"]
    return []


def _result_problems(i: int, result: Any, dataset: Any) -> list[str]:
    """What is missing or malformed in ``results[i]`` (``dataset``: the top-level default, if an object)."""
    if not isinstance(result, Mapping):
        return [f"'results[{i}]' (an object)"]
    problems = []
    if not isinstance(result.get("metric"), str):
        problems.append(f"'results[{i}].metric'")
    value = result.get("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        problems.append(f"'results[{i}].value' (a number)")
    if "signature" in result and not isinstance(result["signature"], (str, type(None))):
        problems.append(f"'results[{i}].signature' (a string)")
    override = result.get("dataset", {})
    if not isinstance(override, Mapping):
        return [
            *problems,
            f"'results[{i}].dataset' (an object overriding keys of 'dataset', got {override!r})",
        ]
    problems += _dataset_problems(override, f"results[{i}].dataset")
    merged = {**(dataset if isinstance(dataset, Mapping) else {}), **override}
    missing = [key for key in ("name", "id", "split") if not merged.get(key)]
    if missing:
        problems.append(f"'results[{i}]' dataset fields {missing}")
    return problems


def load_metrics(metrics: str | Path | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Read (if a path) and check a metrics JSON; a ValueError names the file and every missing or malformed
    field, so a bad file fails here rather than as a TypeError deep inside the card's formatting."""
    if metrics is None:
        return None
    source = ""
    if isinstance(metrics, (str, Path)):
        source = f" {metrics}"
        data = _read_metrics_file(Path(metrics))
    else:
        data = copy.deepcopy(metrics)
    if not isinstance(data, Mapping):
        raise ValueError(
            SCHEMA_ERROR.format(source=source)
            + f"the top level (an object with 'task', 'dataset', 'results'; got a {type(data).__name__})"
        )
    data = dict(data)
    problems = []
    if not isinstance(data.get("task"), str):
        problems.append("'task' (a string such as 'translation')")
    dataset = data.get("dataset")
    if not isinstance(dataset, Mapping):
        problems.append("'dataset' (an object with 'name', 'id', 'split')")
    else:
        problems += _dataset_problems(dataset, "dataset")
    results = data.get("results")
    if not isinstance(results, list) or not results:
        problems.append("'results' (a non-empty list)")
    else:
        for i, result in enumerate(results):
            problems += _result_problems(i, result, dataset)
    for key in ("training", "decoding"):
        if data.get(key) is not None and not isinstance(data[key], Mapping):
            problems.append(f"'{key}' (an object)")
    if problems:
        raise ValueError(SCHEMA_ERROR.format(source=source) + "; ".join(problems))
    return data


def _eval_results(metrics: dict[str, Any]) -> list[EvalResult]:
    out = []
    for result in metrics["results"]:
        dataset = {**metrics["dataset"], **result.get("dataset", {})}
        signature = result.get("signature")
        out.append(
            EvalResult(
                task_type=metrics["task"],
                task_name=metrics.get("task_name"),
                dataset_type=dataset["id"],
                dataset_name=dataset["name"],
                dataset_config=dataset.get("config"),
                dataset_split=dataset["split"],
                dataset_revision=dataset.get("revision"),
                metric_type=result["metric"],
                metric_name=result.get("name", result["metric"]),
                metric_value=float(result["value"]),
                metric_args={"signature": signature} if signature else None,
            )
        )
    return out


# ----------------------------------------------------------------------------------------------------------
# The configuration in words
# ----------------------------------------------------------------------------------------------------------


def _fraction(x: float) -> str:
    from fractions import Fraction

    f = Fraction(x).limit_denominator(12)
    return str(f) if abs(float(f) - x) < 1e-9 else f"{x:g}"


def _method_in_words(method: str | dict, tableau, mode: str, step_size: float) -> str:
    """The method and the block it builds with `mode`'s coefficients: the formula is generated from the config
    (`block_equation`), never the method's own equation, which holds for its tableau weights only."""
    from modeling_ode.ode import block_equation

    equation = f"y_{{t+1}} = {block_equation(tableau, mode, step_size)}"
    if not isinstance(method, str):
        return f"a user Butcher tableau {tableau.to_dict()}, {equation}"
    stages = f"{tableau.num_stages} stage{'s' if tableau.num_stages > 1 else ''}"
    if method == "rk2" and mode == "gated":  # the paper's own block, by the paper's name first
        return (
            "the paper's RK2-block (learnable gamma), Eq. (learnable): a second-order Runge-Kutta block gating the 2 "
            f"stages of improved Euler / Heun (Eq. (rk2)), {equation}"
        )
    return f"{tableau.description} with {stages}, {equation}"


def _coefficients_in_words(
    mode: str, tableau, scope: str, alpha_size: str = "scalar", gate_inputs: str = "stages"
) -> str:
    from modeling_ode.ode import (
        COEFFICIENT_MODES,
        COEFFICIENT_SCOPES,
        EMA_ALPHA_SIZES,
        GATE_INPUTS,
        GATED_MODES,
    )

    text = f"{COEFFICIENT_MODES[mode].description}, {COEFFICIENT_MODES[mode].equation}"
    if mode == "tableau":
        return f"{text} = ({', '.join(_fraction(x) for x in tableau.b)})"
    if mode == "ema":
        return f"{text} ({EMA_ALPHA_SIZES[alpha_size]}, {COEFFICIENT_SCOPES[scope]})"
    if mode in GATED_MODES and gate_inputs != "stages":  # the paper's gate is the mode's own equation
        return f"{text} ({COEFFICIENT_SCOPES[scope]}; {GATE_INPUTS[gate_inputs]})"
    return text if mode == "ones" else f"{text} ({COEFFICIENT_SCOPES[scope]})"


# What the project's own runs show about the block the recipes build by default (issue 61); the figures, generated
# from the results with their tests, are in the repository's results/verdict.md.
DEFAULT_BLOCK_NOTE = f"**About the gated RK2 block**: {GATED_RK2_FINDING}"


def describe_ode(config) -> list[str]:
    """The ODE configuration of `config` as a list of Markdown bullet lines, in the words of the catalogue
    (`modeling_ode/ode.py`)."""
    from modeling_ode.ode import LAYER_CONNECTIONS, ODE_FUNCTIONS

    lines = []
    sides = ("encoder", "decoder") if config.is_encoder_decoder else ("decoder",)
    for side in sides:
        method = getattr(config, f"{side}_ode_method")
        tableau = config.tableau(side)
        mode = getattr(config, f"{side}_ode_coefficients") if tableau.num_stages > 1 else "tableau"
        name = _method_in_words(method, tableau, mode, float(config.ode_step_size))
        layers = getattr(config, f"{side}_layers")
        label = side.capitalize() if config.is_encoder_decoder else "Decoder (causal LM)"
        text = f"**{label}**: {counted(layers, 'layer')}; each layer is {name}"
        if tableau.num_stages > 1:
            coefficients = _coefficients_in_words(
                mode,
                tableau,
                config.ode_coefficient_scope,
                config.ode_ema_alpha,
                config.ode_gate_inputs,
            )
            text += f", combining its stages with {coefficients}"
            text += f"; F is {ODE_FUNCTIONS[getattr(config, f'{side}_ode_function')]}"
            text += (
                "; F includes the layer's residual connections (the authors' code: F(y) = L(y))"
                if config.ode_function_includes_residual
                else "; F(y) = G(LN(y)) without the residual (the paper's reading)"
            )
            if float(config.ode_step_size) != 1.0:
                text += f"; step size h = {config.ode_step_size:g}"
        connections = LAYER_CONNECTIONS[getattr(config, f"{side}_layer_connections")]
        text += f"; blocks are stacked with {connections}."
        lines.append(f"- {text}")
        if side in gated_rk2_sides(config):
            lines.append(f"- {DEFAULT_BLOCK_NOTE}")
    width = (
        f"- **Width**: d_model {config.d_model}, feed-forward {config.encoder_ffn_dim}/{config.decoder_ffn_dim} "
        f"(encoder/decoder), {config.encoder_attention_heads}/{config.decoder_attention_heads} attention heads, "
        f"pre-norm, {config.activation_function} activation."
        if config.is_encoder_decoder
        else f"- **Width**: d_model {config.d_model}, feed-forward {config.decoder_ffn_dim}, "
        f"{config.decoder_attention_heads} attention heads, pre-norm, {config.activation_function} activation."
    )
    lines.append(width)
    positions = []
    if config.use_absolute_positions:
        positions.append("sinusoidal absolute positions, computed for any length (no weights, no limit)")
    if config.max_relative_position > 0:
        kind = "keys and values" if config.relative_position_values else "keys"
        positions.append(
            f"relative position representations (Shaw et al. 2018) on {kind}, clipping distance "
            f"k = {config.max_relative_position}"
        )
    lines.append(f"- **Positions**: {'; '.join(positions) or 'none'}.")
    vocab = f"{config.vocab_size} tokens"
    if config.is_encoder_decoder:
        vocab += (
            ", shared by source and target"
            if config.share_encoder_decoder_embeddings
            else f" (target), {config.encoder_vocab_size} (source)"
        )
    if config.tie_word_embeddings:
        vocab += "; output projection tied to the embeddings"
    lines.append(f"- **Vocabulary**: {vocab}.")
    return lines


def count_parameters(config) -> dict[str, int]:
    """Parameter counts of the model ``config`` describes (built on the meta device; tied weights counted once)."""
    import torch

    from modeling_ode import ODETransformerForCausalLM, ODETransformerForConditionalGeneration

    cls = ODETransformerForConditionalGeneration if config.is_encoder_decoder else ODETransformerForCausalLM
    with torch.device("meta"):
        model = cls(config)
    return {"total": model.num_parameters(), "non_embedding": model.num_parameters(exclude_embeddings=True)}


def _human(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K" if n >= 1e3 else str(n)


# ----------------------------------------------------------------------------------------------------------
# The card
# ----------------------------------------------------------------------------------------------------------


def _results_table(metrics: dict[str, Any]) -> str:
    rows = ["| Dataset | Split | Metric | Value | Signature |", "|---|---|---|---|---|"]
    for result in metrics["results"]:
        dataset = {**metrics["dataset"], **result.get("dataset", {})}
        name = dataset["name"] + (f" ({dataset['config']})" if dataset.get("config") else "")
        # A "|" inside a table cell must be escaped, even inside a code span (GitHub-flavoured Markdown).
        signature = f"`{result['signature'].replace('|', chr(92) + '|')}`" if result.get("signature") else "-"
        rows.append(
            f"| {name} | {dataset['split']} | {result.get('name', result['metric'])} | "
            f"{float(result['value']):.2f} | {signature} |"
        )
    if scored := metrics["dataset"].get("rows"):
        rows.append(
            f"\n{metrics['dataset']['name']} {metrics['dataset']['split']}: {scored:,} examples scored."
        )
    decoding = metrics.get("decoding")
    if decoding:
        settings = [f"{key.replace('_', ' ')} {value}" for key, value in decoding.items()]
        rows.append(f"\nDecoding: {', '.join(settings)}.")
    return "\n".join(rows)


def _training_section(metrics: dict[str, Any] | None) -> str:
    training = (metrics or {}).get("training") or {}
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
    metrics: dict[str, Any] | None,
    generation: dict[str, Any],
    trained_length: int | None = None,
) -> list[str]:
    """The card's code: transformers alone with remote code (runs where this package is not installed), then
    the package's one-call helper. tests/test_hub.py runs both as written. ``trained_length``: the folder's
    (:func:`trained_length`), the length its tokenizer truncates to."""
    metrics = metrics or {}
    task = metrics.get("task") or ("translation" if config.is_encoder_decoder else "text-generation")
    example = json.dumps(
        _excerpt(metrics.get("example") or _EXAMPLES.get(task, _DEFAULT_EXAMPLE)), ensure_ascii=False
    )
    if config.is_encoder_decoder:
        decoding = {**generation, **(metrics.get("decoding") or {})}
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


def _usage(
    config, repo: str, metrics: dict[str, Any] | None, generation: dict[str, Any], length: int | None
) -> str:
    plain, helper = usage_snippets(config, repo, metrics, generation, length)
    return f"""```python
{plain}
```

The modeling code ships with the weights (`trust_remote_code=True`). With the `ode-transformer` package
installed (it is not on PyPI: `pip install .` in a clone of its repository, or a wheel built there with
`python -m build`), one call handles a list of texts (length-sorted batches, the decoding
of `generation_config.json`, inputs truncated to its tokenizer's `model_max_length`), and no remote code is needed:

```python
{helper}
```

For whole files: `ode-translate MODEL --input src.txt --output hyp.txt`."""


_LANGUAGES = {
    "en": "English",
    "de": "German",
    "fr": "French",
    "ro": "Romanian",
    "cs": "Czech",
    "ru": "Russian",
}


def _method_name(config, side: str) -> str:
    method = getattr(config, f"{side}_ode_method")
    if not isinstance(method, str):
        return "Runge-Kutta"
    name = "residual" if method == "euler" else method.upper() if method.startswith("rk") else method
    return (
        f"{name}-gated"
        if method != "euler" and "gated" in getattr(config, f"{side}_ode_coefficients")
        else name
    )


def card_title(config, metrics: dict[str, Any] | None) -> str:
    """``metrics["title"]``, else e.g. "ODE Transformer (RK2-gated encoder, residual decoder, 3-3 layers,
    d 256): English-German translation, Multi30k Task 1"."""
    metrics = metrics or {}
    if metrics.get("title"):
        return metrics["title"]
    if config.is_encoder_decoder:
        shape = (
            f"{_method_name(config, 'encoder')} encoder, {_method_name(config, 'decoder')} decoder, "
            f"{config.encoder_layers}-{config.decoder_layers} layers, d {config.d_model}"
        )
    else:
        shape = f"{_method_name(config, 'decoder')} causal LM, {counted(config.decoder_layers, 'layer')}, d {config.d_model}"
    task = (
        metrics.get("task") or ("translation" if config.is_encoder_decoder else "text-generation")
    ).replace("-", " ")
    languages = metrics.get("language") or []
    if len(languages) == 2:
        task = "-".join(_LANGUAGES.get(code, code) for code in languages) + f" {task}"
    dataset = (metrics.get("dataset") or {}).get("name")
    return f"ODE Transformer ({shape}): {task}" + (f", {dataset}" if dataset else "")


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


def _scores_note(metrics: Mapping[str, Any] | None) -> str:
    """The card's words on what its scores were computed on (the split the results name, a slice such as
    ``test[:100]`` as its split): a validation split where no test split was scored is said to be one; nothing
    without results."""
    if not metrics:
        return ""
    scored = {
        (dataset["name"], str(dataset["split"]).split("[")[0])
        for dataset in ({**metrics["dataset"], **result.get("dataset", {})} for result in metrics["results"])
    }
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
    metrics: str | Path | Mapping[str, Any] | None,
    repo_id: str | None = None,
    graphs: list[str] | None = None,
) -> ModelCard:
    """The card as a `ModelCard` (see :func:`write_model_card`)."""
    model_dir = Path(model_dir)
    graphs = onnx_graphs(model_dir) if graphs is None else graphs
    config = _load_config(model_dir)
    data = load_metrics(metrics)
    model_name = (data or {}).get("model_name") or (
        repo_id.split("/")[-1] if repo_id else model_dir.resolve().name
    )
    task = (data or {}).get("task") or ("translation" if config.is_encoder_decoder else "text-generation")
    training = (data or {}).get("training") or {}
    train_datasets = list(training.get("datasets") or [])
    card_data = ModelCardData(
        model_name=model_name,
        language=(data or {}).get("language"),
        license=(data or {}).get("license", "apache-2.0"),
        library_name="transformers",
        pipeline_tag=_PIPELINE_TAGS.get(
            task, "text2text-generation" if config.is_encoder_decoder else "text-generation"
        ),
        tags=["ode-transformer", "runge-kutta", "custom_code", task],
        datasets=train_datasets or None,
        base_model=(data or {}).get("base_model"),
        metrics=sorted({r["metric"] for r in data["results"]}) if data else None,
        eval_results=_eval_results(data) if data else None,
    )
    params = count_parameters(config)
    length = trained_length(model_dir)
    repo = repo_id or f"path/to/{model_name}"
    results = _results_table(data) if data else "No evaluation results were recorded for this model."
    body = f"""
# {card_title(config, data)}

An **ODE Transformer** (Li et al., ACL 2022): a pre-norm Transformer whose layers are Runge-Kutta solvers of
the ODE dy/dt = F(y), for {task.replace("-", " ")}.

## Model details

{chr(10).join(describe_ode(config))}
- **Parameters**: {params["total"]:,} ({_human(params["total"])}; {params["non_embedding"]:,} without embeddings).

## Evaluation results

{results}

## Training data and recipe

{_training_section(data)}

## Intended use and limitations

Intended for research on ODE-inspired architectures and for {task.replace("-", " ")} in the languages and
domain of its training data. It is not suited to other languages or domains without fine-tuning and inherits
the biases of its training corpus; machine output can be fluent yet wrong, so do not use it unreviewed where
errors matter.{_scores_note(data)}
{_length_limits(length)} Positions come from the attention mask, so padding on either side changes no output; a
causal LM's batched prompts are padded on the left (its saved tokenizer does so).

## How to use

{_usage(config, repo, data, _generation_defaults(model_dir), length)}{onnx_section(graphs, repo)}

## Citation

```bibtex
{CITATION}
```
"""
    return ModelCard(f"---\n{card_data.to_yaml()}\n---\n{body}")


def write_model_card(
    model_dir: str | Path,
    metrics_path_or_dict: str | Path | Mapping[str, Any] | None,
    repo_id: str | None = None,
    graphs: list[str] | None = None,
) -> Path:
    """Write `model_dir/README.md` from the folder's config.json and a metrics JSON (path or dict, schema in
    this module's docstring; None writes a card without results). Returns the card's path. ``graphs``: the ONNX
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
