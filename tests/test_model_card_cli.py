"""ode-model-card without a metrics JSON, and the card's name for the paper's gated RK2 block."""

from __future__ import annotations

import json

from tiny_folder import save_tiny_folder

from modeling_ode import ODETransformerConfig
from ode_transformer.config_in_words import describe_ode
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


def test_the_gated_rk2_block_is_named_by_the_paper_s_eq_learnable_first():
    """The gated block is the paper's RK2-block (learnable gamma), Eq. (learnable): the card says so before it says
    whose stages it has (Eq. (rk2)); an RK2 block with the tableau's weights is Eq. (rk2) alone."""
    gated = describe_ode(ODETransformerConfig.from_preset("tiny"))[0]
    assert gated.index("the paper's RK2-block (learnable gamma), Eq. (learnable)") < gated.index("Eq. (rk2)")
    tableau = describe_ode(ODETransformerConfig.from_preset("tiny", encoder_ode_coefficients="tableau"))[0]
    assert "improved Euler / Heun, Eq. (rk2)" in tableau and "Eq. (learnable)" not in tableau
