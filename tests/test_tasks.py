"""A task is one record (train/tasks.py): a toy task, added from this file alone, trains, tests and writes its card;
every module reads the record, and the records say what the paper does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ode_transformer.train import tasks
from ode_transformer.train.arguments import parse_arguments
from ode_transformer.train.metrics import exact_match
from ode_transformer.train.run import run
from ode_transformer.train.tasks import TASKS, Task, get_task

TINY = [
    "--preset", "tiny", "--vocab_size", "300", "--learning_rate", "0.004", "--warmup_steps", "2",
    "--use_cpu", "true", "--disable_tqdm", "true", "--report_to", "none", "--save_strategy", "no", "--seed", "3",
    "--max_source_length", "16", "--max_target_length", "16", "--max_tokens", "256", "--max_steps", "4",
    "--logging_steps", "2", "--per_device_eval_batch_size", "8",
]  # fmt: skip


def _exact(hyps: list[str], refs: list[str]) -> dict[str, float]:
    return {"exact_match": exact_match(hyps, refs)}


def _exact_records(hyps: list[str], refs: list[str]) -> list[dict]:
    return [{"metric": "exact_match", "name": "Exact match", "value": exact_match(hyps, refs)}]


# What adding a task takes: its record.
PARAPHRASE = Task(
    "paraphrase",
    "seq2seq",
    hub_tag="text2text-generation",
    metric_names=("exact_match",),
    validation_metrics=_exact,
    test_records=_exact_records,
    num_beams=3,
    length_penalty=1.0,
)


@pytest.fixture
def paraphrase(monkeypatch) -> Task:
    monkeypatch.setitem(TASKS, PARAPHRASE.name, PARAPHRASE)
    return PARAPHRASE


def _pairs(folder: Path, split: str, rows: int) -> str:
    lines = [f"the cat {'sat ' * (i % 4)}on mat {i}" for i in range(rows)]
    source, target = folder / f"{split}.src", folder / f"{split}.tgt"
    source.write_text("".join(line + "\n" for line in lines))
    target.write_text("".join(line.replace("cat", "feline") + "\n" for line in lines))
    return f"{source},{target}"


def test_a_toy_task_added_from_a_test_file_trains_tests_and_writes_its_card(paraphrase, tmp_path):
    data = ["--train_file", _pairs(tmp_path, "train", 48), "--validation_file", _pairs(tmp_path, "dev", 8)]
    data += ["--test_file", _pairs(tmp_path, "test", 6)]
    out = tmp_path / "out"
    flags = [*TINY, *data, "--task", "paraphrase", "--output_dir", str(out)]
    flags += ["--eval_strategy", "steps", "--eval_steps", "4", "--predict_with_generate", "true"]
    flags += ["--metric_for_best_model", "exact_match"]
    run(parse_arguments(flags))
    document = json.loads((out / "hub_metrics.json").read_text())
    assert document["task"] == "text2text-generation"
    assert [(r["metric"], r["name"]) for r in document["results"]] == [("exact_match", "Exact match")]
    assert document["decoding"] == {"num_beams": 3, "length_penalty": 1.0, "precision": "fp32"}
    assert len((out / "test_hypotheses.txt").read_text().splitlines()) == 6
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert any("eval_exact_match" in entry for entry in history)
    card = (out / "README.md").read_text()
    assert "text2text-generation" in card and "Exact match" in card


def test_an_unknown_task_is_refused_with_the_known_ones(tmp_path):
    with pytest.raises(
        ValueError, match=r"--task must be one of \('translation', 'summarization', 'gec', 'lm'\)"
    ):
        parse_arguments([*TINY, "--task", "parsing", "--output_dir", str(tmp_path)])


def test_the_records_hold_the_papers_decoding_and_the_hub_tags():
    """Appendix, table "dataset": beam 4 / length penalty 0.6 for WMT En-De, 4 / 2.0 for CNN/DM, 6 / 0.6 for GEC."""
    assert {name: task.paper_decoding for name, task in TASKS.items()} == {
        "translation": {"num_beams": 4, "length_penalty": 0.6},
        "summarization": {"num_beams": 4, "length_penalty": 2.0},
        "gec": {"num_beams": 6, "length_penalty": 0.6},
        "lm": {},
    }
    assert {name: task.hub_tag for name, task in TASKS.items()} == {
        "translation": "translation",
        "summarization": "summarization",
        "gec": "text2text-generation",
        "lm": "text-generation",
    }
    assert [name for name, task in TASKS.items() if task.is_lm] == ["lm"]
    assert get_task("lm").columns == ("text",) and get_task("gec").columns == ("source", "target")


def test_an_export_without_decoding_of_its_own_decodes_as_the_translation_task():
    from ode_transformer.hub.export import PAPER_GENERATION_DEFAULTS

    assert {**get_task("translation").paper_decoding, "early_stopping": True} == PAPER_GENERATION_DEFAULTS


def task_names_used(source: str, names: set[str]) -> list[int]:
    """The lines of ``source`` where a task's name is data of the module's own: a dict's key, a side of a
    comparison with a task, or the default of a field, argument or keyword named for a task."""
    import ast

    def named(node: ast.AST) -> list[int]:
        return [
            found.lineno
            for found in ast.walk(node)
            if isinstance(found, ast.Constant) and isinstance(found.value, str) and found.value in names
        ]

    def about_a_task(name: str | None) -> bool:
        return name is not None and "task" in name.lower()

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            lines += [line for key in node.keys if key is not None for line in named(key)]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(about_a_task(ast.unparse(side)) for side in sides):
                lines += [line for side in sides for line in named(side)]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            positional = [*arguments.posonlyargs, *arguments.args]
            defaults = [
                *zip(positional[len(positional) - len(arguments.defaults) :], arguments.defaults),
                *zip(arguments.kwonlyargs, arguments.kw_defaults),
            ]
            lines += [
                line
                for arg, default in defaults
                if default and about_a_task(arg.arg)
                for line in named(default)
            ]
        elif isinstance(node, ast.keyword) and about_a_task(node.arg):
            lines += named(node.value)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(about_a_task(ast.unparse(target)) for target in targets):
                lines += named(node.value)
    return sorted(set(lines))


def test_the_task_name_check_catches_a_second_table_and_passes_other_words():
    names = {"translation", "gec", "lm"}
    caught = """SCORERS = {"translation": a, "gec": b}
if flags["task"] != "translation":
    pass
def split(task: str = "translation"): ...
run(task="gec")
task: str = field(default="lm", metadata={})
if settings.task in ("gec", "lm"):
    pass
"""
    assert task_names_used(caught, names) == [1, 2, 4, 5, 6, 7]
    passed = """if kind == "lm":
    pass
if "translation" in columns:
    pass
FOLDERS = {"cnndm": "translation"}
study = {"task": "gec"}
kind: Literal["seq2seq", "lm"] = "lm"
"""
    assert task_names_used(passed, names) == []


def test_no_module_but_the_records_names_a_task():
    """Every task-specific choice is in the records: no other module of train/ or experiments/ keys a table by a
    task's name, compares a task with one, or defaults a task to one (a study's flags name their task, as a command
    line does)."""
    repo = Path(tasks.__file__).parents[1]
    found = [
        f"{path.relative_to(repo)}:{line}"
        for folder in ("train", "experiments")
        for path in sorted((repo / folder).rglob("*.py"))
        if path != Path(tasks.__file__)
        for line in task_names_used(path.read_text(encoding="utf-8"), set(TASKS))
    ]
    assert found == []


def test_every_task_that_generates_is_scored_by_ode_evaluate_as_its_record_says():
    from ode_transformer.train.evaluate_predictions import SCORERS, scorers

    assert {task.scorer for task in TASKS.values()} - {None} <= set(SCORERS)
    assert list(scorers()) == [*(name for name, task in TASKS.items() if not task.is_lm), "gleu"]


def test_a_toy_task_is_scored_by_ode_evaluate(paraphrase, tmp_path, capsys):
    """ode-evaluate scores a task added as one record by the record's validation metrics, against one --ref."""
    from ode_transformer.train.evaluate_predictions import main

    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("the feline sat\non mat\n")
    ref.write_text("the feline sat\non the mat\n")
    assert main(["--task", "paraphrase", "--hyp", str(hyp), "--ref", str(ref)]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "exact_match": exact_match(["the feline sat", "on mat"], ["the feline sat", "on the mat"])
    }
    assert main(["--task", "paraphrase", "--hyp", str(hyp), "--ref", str(ref), "--ref", str(ref)]) == 2
    assert "--task paraphrase takes exactly one --ref" in capsys.readouterr().err
