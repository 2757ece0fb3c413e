"""The studies' sentences, generated from their tests, and the one rule for the prose around them.

``python -m experiments.report --write-docs`` fills each marker in README.md, docs/, hub/README.md, the notebooks'
markdown and results/README.md (from docs/templates/results.md) with text generated from ``summary.json``::

    <!-- claim: results/ptb/cpu@1 rk4 rk2_gated -->...<!-- /claim -->

The first word is a batch folder (``@DEPTH`` where its table has several), then one item per comparison:
``VARIANT`` against its baseline, ``VARIANT/OTHER`` a test the study declares (``Study.pairwise``),
``VARIANT/reference`` against its reference study's row, ``:chrF`` for a secondary metric. A claim reads "RK4
worse than residual: +14.33 (p 0.008, beyond noise; ...)" where its Holm p is below ALPHA, else "RK2 against
residual, not measured: ...". Other markers: ``means``, ``spread`` (Pitman-Morgan test of paired variances),
``seeds``, ``detectable`` and ``power`` (experiments.power_text).

The rule (:func:`problems`), on every hand-written sentence (outside markers, code and HTML comments): a sentence
that names two rows of one study compares them unless it quotes a marker whose text names that study's rows; with
no figure in it, such a sentence fails. A row's names are the studies' own (:func:`_vocabulary`: each variant's id,
its label's head, its :data:`NAMES` name), in any case and with "-", "_" and spaces alike. No verdict's figure (a
p-value, an interval, "beyond/within noise", a power figure) stands outside a marker, and no sentence says work is
running. ``python -m experiments.claims`` prints what :func:`check` finds in every document.
"""

from __future__ import annotations

import ast
import math
import re
import statistics
from pathlib import Path
from typing import Any

from experiments.significance import ALPHA, holm
from experiments.studies import STUDIES
from experiments.summary_tables import ROOT, Table, fmt, name, parse

COMMENT = re.compile(r"<!--.*?-->")
MARKER = re.compile(r"<!-- (claim|means|spread|seeds|detectable|power): ([^>]*?) -->(.*?)<!-- /\1 -->")


def claim(table: Table, depth: int, item: str) -> str:
    """One comparison's sentence: its direction only where its Holm p is below ALPHA, else "not measured"."""
    variant, _, metric_name = item.partition(":")
    variant, _, other = variant.partition("/")
    metric = table.metric(metric_name or None)
    row = table.row(variant, depth)
    if not other:
        comparison, other_name = row[metric.name]["paired"], name(table.study, row["baseline"])
        other_row = table.row(row["baseline"], depth)
    elif other == "reference":
        comparison = row["reference"]
        other_name, other_row = f"{comparison['variant']} of {comparison['study']}", None
    else:
        comparison = next(c for c in row.get("pairwise", []) if c["variant"] == other)
        other_name, other_row = name(table.study, other), table.row(other, depth)
    if other and metric != table.study.metrics[0]:
        raise ValueError(f"{item}: tests between rows are of the primary metric only")
    where = "" if metric == table.study.metrics[0] else f" in {metric.name}"
    subject = f"{name(table.study, variant)}"
    if comparison["gap"] is None:
        unpaired = ""
        if other_row is not None:
            gap = row[metric.name]["mean"] - other_row[metric.name]["mean"]
            unpaired = f" (unpaired means {gap:+.{metric.digits}f} apart)"
        return f"{subject} against {other_name}{where}, not measured: no comparable pair{unpaired}"
    p_holm = comparison.get("p_holm")
    if p_holm is not None and p_holm < ALPHA:
        better = (comparison["gap"] < 0) == metric.lower_is_better
        return (
            f"{subject} {'better' if better else 'worse'} than {other_name}{where}: {comparison['verdict']}"
        )
    return f"{subject} against {other_name}{where}, not measured: {comparison['verdict']}"


def means(table: Table, depth: int, variants: list[str]) -> str:
    """``residual 167.78 -> RK4 182.11, RK2 175.02 (3 seeds each)``: the first row, then the others; a derived
    per-word metric after ``/``; the seeds of each row."""
    metrics = [table.study.metrics[0], *(m for m in table.study.metrics if m.per_word_of)]
    rows = [table.row(variant, depth) for variant in variants]
    parts = [
        f"{name(table.study, row['variant'])} "
        + " / ".join(fmt(row[m.name]["mean"], m.digits) for m in metrics)
        for row in rows
    ]
    counts = [len(row["seeds"]) for row in rows]
    if len(set(counts)) > 1:
        parts = [f"{part} ({n} seed{'s' if n != 1 else ''})" for part, n in zip(parts, counts)]
        seeds = ""
    else:
        seeds = f" ({counts[0]} seed{'s' if counts[0] != 1 else ''}{' each' if len(rows) > 1 else ''})"
    text = parts[0] + (" -> " + ", ".join(parts[1:]) if len(parts) > 1 else "")
    return text + seeds


def pitman_morgan(ours: list[float], theirs: list[float]) -> float | None:
    """Two-sided p-value of the Pitman-Morgan test that two paired samples have equal variances: the correlation of
    their sums with their differences, t = r sqrt((n - 2) / (1 - r^2)) with n - 2 degrees of freedom; None below
    three pairs (or with no spread to correlate)."""
    from scipy.stats import t

    n = len(ours)
    sums = [a + b for a, b in zip(ours, theirs)]
    differences = [a - b for a, b in zip(ours, theirs)]
    if n < 3 or min(statistics.pstdev(sums), statistics.pstdev(differences)) == 0:
        return None
    r = statistics.correlation(sums, differences)
    if abs(r) >= 1:
        return 0.0
    return float(2 * t.sf(abs(r) * math.sqrt((n - 2) / (1 - r * r)), n - 2))


def _spread_tests(table: Table, depth: int) -> dict[str, dict[str, Any]]:
    """For each row of the table at ``depth`` with a baseline: the sd of its paired seeds and of the baseline's
    same seeds and the Pitman-Morgan p, Holm-corrected across the rows tested."""
    metric = table.study.metrics[0].name
    tests = {}
    for row in table.rows:
        paired = row[metric].get("paired")
        if row["depth"] != depth or not paired or paired["pairs"] < 3:
            continue
        seeds = [int(seed) for seed in paired["differences"]]
        ours_by_seed = dict(zip(row["seeds"], row[metric]["values"]))
        base = table.row(row["baseline"], depth)
        theirs_by_seed = dict(zip(base["seeds"], base[metric]["values"]))
        ours, theirs = [ours_by_seed[s] for s in seeds], [theirs_by_seed[s] for s in seeds]
        tests[row["variant"]] = {
            "sd": (statistics.stdev(ours), statistics.stdev(theirs)),
            "seeds": len(seeds),
            "p": pitman_morgan(ours, theirs),
        }
    for test, p_holm in zip(tests.values(), holm([t["p"] for t in tests.values()])):
        test["p_holm"] = p_holm
    return tests


def spread(table: Table, depth: int, variants: list[str]) -> str:
    """Whether rows vary less (or more) across seeds than their baseline: the paired variances' test."""
    tests = _spread_tests(table, depth)
    metric = table.study.metrics[0]
    sentences = []
    for variant in variants:
        test = tests[variant]
        ours, theirs = (fmt(sd, metric.digits) for sd in test["sd"])
        base = name(table.study, table.row(variant, depth)["baseline"])
        subject = name(table.study, variant)
        if test["p"] is None:
            sentences.append(f"{subject}'s sd across seeds {ours} against {base}'s {theirs}: untested")
            continue
        beyond = test["p_holm"] < ALPHA
        relation = (
            f"{subject} varies {'less' if test['sd'][0] < test['sd'][1] else 'more'} across seeds than {base}"
            if beyond
            else f"{subject}'s spread against {base}'s, not measured"
        )
        sentences.append(
            f"{relation}: sd {ours} against {theirs} over the same {test['seeds']} seeds (Pitman-Morgan test of "
            f"paired variances, p {test['p']:.3f}, {test['p_holm']:.3f} after Holm over the table's {len(tests)} "
            f"rows, {'beyond' if beyond else 'within'} noise)"
        )
    return "; ".join(sentences)


def generate(kind: str, spec: str, root: Path = ROOT) -> str:
    """The text of one marker, from the ``summary.json`` files under ``root``."""
    from experiments import power_text  # which reads this module's tables

    table, depth, items, options = parse(spec, root)
    if kind == "claim":
        return "; ".join(claim(table, depth, item) for item in items)
    if kind == "means":
        return means(table, depth, items)
    if kind == "spread":
        return spread(table, depth, items)
    if kind == "power":
        return power_text.power(table, depth, items, options, root)
    return (power_text.seeds if kind == "seeds" else power_text.detectable)(table, depth, items, options)


def fill(text: str, root: Path = ROOT) -> str:
    """``text`` with every marker's text generated afresh (from the results under ``root``)."""
    return MARKER.sub(
        lambda m: (
            f"<!-- {m.group(1)}: {m.group(2)} -->{generate(m.group(1), m.group(2), root)}<!-- /{m.group(1)} -->"
        ),
        text,
    )


def filled_documents(root: Path = ROOT) -> dict[Path, str]:
    """Every hand-edited document with markers, as :func:`fill` leaves it: Markdown files, and notebooks (their
    markdown cells; the JSON as nbformat writes it)."""
    import nbformat

    documents = {}
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "hub" / "README.md"]:
        documents[path] = fill(path.read_text(encoding="utf-8"), root)
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        notebook = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
        for cell in notebook.cells:
            if cell.cell_type == "markdown":
                cell.source = fill(cell.source, root)
        documents[path] = nbformat.writes(notebook) + "\n"
    return documents


def _head(text: str) -> str:
    """A label's or a name's first part: ``RK2-block`` of ``RK2-block (learnable gamma), code F``."""
    return re.split(r" \(|, ", text)[0]


def _normal(alias: str) -> str:
    return re.sub(r"[\s_-]+", " ", alias.lower())


def _vocabulary() -> dict[str, set[tuple[str, str]]]:
    """What prose calls each study's rows, lowercased: every variant's id, its label's head, its :func:`name` and
    that name's head (a factor ``.pilot`` dropped: one row to a sentence), each with the (study, row) it names."""
    names: dict[str, set[tuple[str, str]]] = {}
    for key, study in STUDIES.items():
        for variant in study.variants:
            row = variant.partition(".")[0]
            for alias in (row, _head(study.variants[variant].label), name(study, variant)):
                for form in {alias, _head(alias)}:
                    names.setdefault(_normal(form), set()).add((key, row))
    return names


VOCABULARY = _vocabulary()
# An alias matches with "-", "_" and spaces alike ("RK2-gated", "rk2_gated", "RK2 gated"), in any case, longest first
# so that "PC-RK4" is not read as "RK4".
ROW_NAME = re.compile(
    "|".join(
        r"(?<![\w-])" + r"[\s_-]+".join(map(re.escape, alias.split(" "))) + r"(?![\w-])"
        for alias in sorted(VOCABULARY, key=len, reverse=True)
    ),
    re.IGNORECASE,
)
FIGURE = re.compile(r"(?<![\w.])[+-]?\d[\d,]*(?:\.\d+)?%?(?!\w)")
# A verdict's figures, which only the markers write: a p-value, an interval, "beyond/within noise" (quoted, the
# rule's name), the gap the seeds detect, the seeds a gap needs, the sd they rest on.
HAND_VERDICT = re.compile(
    r"\bp 0\.\d{3}|95% CI \[|(?<!\")\b(?:beyond|within) (?:seed )?noise\b(?!\")|"
    r"\bdetects?\b(?: with \d+% power)?(?: only)?(?: a)? gaps? of (?:about )?[+-]?\d+\.\d+|\bdetects? [+-]?\d+\.\d+|"
    r"\bsd of (?:the )?per-seed differences? (?:of )?\(?\d+\.\d+|\bsd \(\d+\.\d+|\bneeds? \d+ (?:/ \d+ )?seeds|"
    r"\b\d+ / \d+ seeds",
    re.IGNORECASE,
)
# Words that say work is under way: nothing keeps such a sentence true once the run ends or the machine goes.
RUNNING = re.compile(
    r"\b(?:(?:is|are|now|still|currently) (?:being )?(?:running|training)|(?:is|are) being (?:run|trained)|"
    r"(?:now|still|currently) (?:being )?(?:run|trained)|in progress|under ?way|currently runs?)\b",
    re.IGNORECASE,
)
STUDY_NAME = re.compile(r"\b(?:" + "|".join(STUDIES) + r")\b", re.IGNORECASE)
CODE = re.compile(r"^```.*?^```|`[^`]+`", re.DOTALL | re.MULTILINE)
# A sentence ends at a full stop, "!" or "?" before a space, but for the abbreviations prose here uses.
SENTENCE_END = re.compile(r"(?<!\bEq\.)(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\bal\.)(?:(?<=[.!?])|(?<=[.!?]\*\*))\s+")
QUOTED = "\x00"  # where a sentence quotes a marker: its generated text stands there, outside the hand's words


def two_rows(text: str) -> set[str]:
    """The studies two of whose rows ``text`` names: two names that stand for no row in common ("RK2-block" may be
    RK2 or the gated RK2 block of a table, "residual" any residual row of it)."""
    named: dict[str, list[set[str]]] = {}
    for match in ROW_NAME.finditer(text):
        rows: dict[str, set[str]] = {}
        for study, row in VOCABULARY[_normal(match.group(0))]:
            rows.setdefault(study, set()).add(row)
        for study, these in rows.items():
            named.setdefault(study, []).append(these)
    return {study for study, sets in named.items() if any(a.isdisjoint(b) for a in sets for b in sets)}


def sentences(text: str) -> list[tuple[str, str]]:
    """Each sentence of the hand-written prose (code and HTML comments left out), with the text of the markers it
    quotes; paragraphs, list items and table lines end a sentence too."""
    quoted: list[str] = []

    def quote(match: re.Match) -> str:
        quoted.append(match.group(3))
        return f"{QUOTED}{len(quoted) - 1}{QUOTED}"

    text = COMMENT.sub(" ", MARKER.sub(quote, CODE.sub(" ", text)))
    found = []
    for block in re.split(r"\n\s*\n|\n(?=\s*(?:[-*] |\||#))", text):
        for sentence in SENTENCE_END.split(" ".join(block.split())):
            parts = sentence.split(QUOTED)
            found.append(("".join(parts[0::2]), " ".join(quoted[int(i)] for i in parts[1::2])))
    return found


def problems(text: str, everywhere: bool = True) -> list[str]:
    """What breaks the rule in ``text`` (see the module's docstring), and each sentence that says work is running
    (``everywhere`` False, for a guide: only where it names a row or a study)."""
    found = []
    for hand, quotes in sentences(text):
        pairs = sorted(two_rows(hand))
        quoted = bool(pairs) and bool(ROW_NAME.search(quotes))
        if pairs and not quoted and not FIGURE.search(hand):
            found.append(
                f"two rows of {pairs[0]} named with no marker that quotes their verdict: {hand[:200]}"
            )
        if verdict := HAND_VERDICT.search(hand):
            found.append(f"{verdict.group(0)!r} typed by hand, which a marker writes: {hand[:200]}")
        if (running := RUNNING.search(hand)) and (
            everywhere or ROW_NAME.search(hand) or STUDY_NAME.search(hand)
        ):
            found.append(f"{running.group(0)!r} says work is under way; say what is committed: {hand[:200]}")
    return found


# Files whose text a user reads: the model card's (its template, and the strings of the modules that fill it), and
# the words ode-train's log and the card share. A template is read whole, a module's string constants.
USER_STRINGS = (
    "ode_transformer/model_card_template.md",
    "ode_transformer/model_card_writer.py",
    "ode_transformer/config_in_words.py",
    "ode_transformer/wording.py",
)
# Documents about the studies throughout: a sentence that says work is running is flagged wherever it stands.
STUDY_DOCUMENTS = (
    "docs/templates/results.md",
    "notebooks/truncation_error.ipynb",
    "notebooks/translation_study.ipynb",
)


def _string_constants(path: Path) -> str:
    """The prose a module writes for users: its string constants with a space in them, one paragraph each."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    strings = [
        node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and " " in str(node.value)
    ]
    return "\n\n".join(s for s in strings if isinstance(s, str))


def prose(root: Path = ROOT) -> dict[str, str]:
    """Every hand-written text, by name: README.md, docs/ (results/README.md as its template), hub/README.md, the
    notebooks' markdown cells and the strings of :data:`USER_STRINGS`. What code writes whole (each table's README,
    results/verdict.md) is no one's prose."""
    import nbformat

    paths = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    texts = {str(path.relative_to(root)): path.read_text(encoding="utf-8") for path in paths}
    texts["docs/templates/results.md"] = fill(
        (root / "docs" / "templates" / "results.md").read_text("utf-8"), root
    )
    texts["hub/README.md"] = (root / "hub" / "README.md").read_text(encoding="utf-8")
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        notebook = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type == "markdown":
                texts[f"{path.relative_to(root)} cell {index}"] = cell.source
    for user_file in USER_STRINGS:
        path = root / user_file
        texts[user_file] = (
            path.read_text(encoding="utf-8") if path.suffix == ".md" else _string_constants(path)
        )
    return texts


def check(root: Path = ROOT) -> list[str]:
    """Every problem :func:`problems` finds in :func:`prose`."""
    return [
        f"{key}: {problem}"
        for key, text in prose(root).items()
        for problem in problems(text, everywhere=key.startswith(STUDY_DOCUMENTS))
    ]


def main() -> int:
    """``python -m experiments.claims``: print every problem :func:`check` finds; exit 1 if there is one."""
    found = check()
    print("\n".join(found) or "no sentence compares two rows or states a figure of a study outside a marker")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
