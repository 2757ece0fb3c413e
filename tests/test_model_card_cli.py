"""ode-model-card without a metrics JSON."""

from __future__ import annotations

import json

from tiny_folder import save_tiny_folder

from ode_transformer.hub.model_card import main

NO_RESULTS = "No evaluation results were recorded for this model."


def test_a_folder_without_metrics_gets_a_card_that_says_none_were_recorded(tmp_path, capsys):
    """A model trained with one's own Seq2SeqTrainer has no hub_metrics.json: `ode-model-card MODEL` writes its card
    all the same; a folder with one (what ode-train writes) has it read without naming it."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    main([str(folder)])
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert NO_RESULTS in card and "model-index" not in card
    assert capsys.readouterr().out.strip() == str(folder / "README.md")
    metrics = {
        "task": "translation",
        "dataset": {"name": "Toy", "id": "user/toy", "split": "test"},
        "results": [{"metric": "sacrebleu", "name": "BLEU", "value": 12.34}],
    }
    (folder / "hub_metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
    main([str(folder)])
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert NO_RESULTS not in card and "12.34" in card

