"""The metrics of a model card: the metrics JSON a training run writes (``hub_metrics.json``) as the
:class:`CardMetrics` dataclass, which checks its own fields, and :func:`load_metrics`, which reads a file or a
dict into it.

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
A metrics JSON of the wrong shape is refused here, naming the file and every missing or malformed field, rather
than failing as a TypeError deep inside the card's formatting.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult

__all__ = ["METRICS_FILENAME", "CardMetrics", "MetricsSchemaError", "load_metrics"]

METRICS_FILENAME = "hub_metrics.json"

SCHEMA_ERROR = "metrics JSON{source} does not follow the schema in ode_transformer/card_metrics.py; missing or malformed: "


class MetricsSchemaError(ValueError):
    """A metrics JSON that does not follow the schema: every problem found, and the file it came from."""

    def __init__(self, problems: Sequence[str], source: str | Path | None = None):
        self.problems = list(problems)
        super().__init__(
            SCHEMA_ERROR.format(source=f" {source}" if source is not None else "") + "; ".join(self.problems)
        )


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


@dataclass(frozen=True)
class CardMetrics:
    """A metrics JSON (schema in this module's docstring), checked whole when it is built: a
    :class:`MetricsSchemaError` names every missing or malformed field. ``dataset`` is the default evaluation
    dataset of every result; a result's own ``dataset`` overrides keys of it (:meth:`scored_datasets`)."""

    task: str
    dataset: Mapping[str, Any]
    results: Sequence[Mapping[str, Any]]
    task_name: str | None = None
    language: Sequence[str] | None = None
    base_model: str | None = None
    license: str | None = "apache-2.0"
    model_name: str | None = None
    title: str | None = None
    example: str | None = None
    training: Mapping[str, Any] | None = None
    decoding: Mapping[str, Any] | None = None

    def __post_init__(self):
        problems = []
        if not isinstance(self.task, str):
            problems.append("'task' (a string such as 'translation')")
        if not isinstance(self.dataset, Mapping):
            problems.append("'dataset' (an object with 'name', 'id', 'split')")
        else:
            problems += _dataset_problems(self.dataset, "dataset")
        if not isinstance(self.results, list) or not self.results:
            problems.append("'results' (a non-empty list)")
        else:
            for i, result in enumerate(self.results):
                problems += _result_problems(i, result, self.dataset)
        for key in ("training", "decoding"):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), Mapping):
                problems.append(f"'{key}' (an object)")
        if problems:
            raise MetricsSchemaError(problems)

    @classmethod
    def from_json(cls, data: Any, source: str | Path | None = None) -> CardMetrics:
        """The metrics of the parsed JSON ``data`` (copied; keys outside the schema are left out); ``source``, the
        file it was read from, is named by a refusal."""
        if not isinstance(data, Mapping):
            raise MetricsSchemaError(
                [f"the top level (an object with 'task', 'dataset', 'results'; got a {type(data).__name__})"],
                source,
            )
        data = copy.deepcopy(dict(data))
        names = {field.name for field in dataclasses.fields(cls)}
        required = {"task", "dataset", "results"}
        try:
            return cls(
                **{name: data.get(name) for name in required},
                **{name: data[name] for name in names - required if name in data},
            )
        except MetricsSchemaError as error:
            raise MetricsSchemaError(error.problems, source) from None

    def scored_datasets(self) -> list[dict[str, Any]]:
        """The dataset of each result: the default ``dataset`` with the result's own keys over it."""
        return [{**self.dataset, **result.get("dataset", {})} for result in self.results]

    def eval_results(self) -> list[EvalResult]:
        """The results as huggingface_hub's `EvalResult`s, the card's model-index."""
        out = []
        for result, dataset in zip(self.results, self.scored_datasets()):
            signature = result.get("signature")
            out.append(
                EvalResult(
                    task_type=self.task,
                    task_name=self.task_name,
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


def _read_metrics_file(path: Path) -> Any:
    """The parsed JSON of ``path``; a missing file or invalid JSON is an error naming the file (json's own
    message names only a line and column)."""
    if not path.is_file():
        raise FileNotFoundError(
            f"metrics JSON {path} does not exist{' (it is a folder)' if path.is_dir() else ''}; pass the "
            f"metrics file ({METRICS_FILENAME}, schema in ode_transformer/card_metrics.py)."
        )
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(
            f"metrics JSON {path} is not valid JSON ({error}); fix the file: it must hold one object following "
            "the schema in ode_transformer/card_metrics.py."
        ) from None


def load_metrics(metrics: str | Path | Mapping[str, Any] | CardMetrics | None) -> CardMetrics | None:
    """The metrics of a metrics JSON file (a path) or its parsed dict, checked (:class:`CardMetrics`); None for
    None. A missing file, invalid JSON or a schema problem is refused naming the file."""
    if metrics is None or isinstance(metrics, CardMetrics):
        return metrics
    if isinstance(metrics, (str, Path)):
        return CardMetrics.from_json(_read_metrics_file(Path(metrics)), metrics)
    return CardMetrics.from_json(metrics)
