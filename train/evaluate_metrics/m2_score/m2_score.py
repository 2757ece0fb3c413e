"""MaxMatch (M2) precision / recall / F0.5 as a local 🤗 Evaluate metric.

Load it from its folder, with no network: ``evaluate.load("train/evaluate_metrics/m2_score")``
(the repository root must be importable, e.g. the current directory, or the package installed: the folder
is then ``ode_transformer/train/evaluate_metrics/m2_score`` in site-packages). It wraps
:func:`ode_transformer.train.metrics.m2_score`; see there for the conventions.
"""

import datasets
import evaluate

from ode_transformer.train.metrics import m2_score, parse_m2

_DESCRIPTION = """MaxMatch (M2) scorer (Dahlmeier & Ng, 2012) for grammatical error correction:
corpus-level precision, recall and F_beta of the system's edits against gold M2 edits."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: corrected sentences (whitespace-tokenized like the M2 source), one per sentence.
    references: for each sentence, its M2 block: the ``S`` line and its ``A`` lines.
    beta: F weight (default 0.5).
    max_unchanged_words: unchanged tokens a merged edit may contain (default 2).
    ignore_case: compare tokens case-insensitively (default False).
Returns:
    precision, recall, f{beta}, correct, proposed, gold.
Examples:
    >>> m2 = evaluate.load("train/evaluate_metrics/m2_score")
    >>> block = "S She see the cat .\\nA 1 2|||SVA|||sees|||REQUIRED|||-NONE-|||0"
    >>> m2.compute(predictions=["She sees the cat ."], references=[block])["f0.5"]
    1.0
"""

_CITATION = """@inproceedings{dahlmeier-ng-2012-better,
    title = "Better Evaluation for Grammatical Error Correction",
    author = "Dahlmeier, Daniel and Ng, Hwee Tou",
    booktitle = "Proceedings of NAACL-HLT 2012",
    year = "2012",
    pages = "568--572",
}"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class M2Score(evaluate.Metric):
    """M2 scorer over (hypothesis, M2 block) pairs."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
        )

    def _compute(self, predictions, references, beta=0.5, max_unchanged_words=2, ignore_case=False):
        sentences = [parse_m2(block.splitlines())[0] for block in references]
        return m2_score(predictions, sentences, beta, max_unchanged_words, ignore_case)
