"""Sentences about the studies that come from their tests (issue 62), and the check that the prose makes no other.

Every sentence that compares runs is written here, from the test it rests on, into markers that
``python -m experiments.report --write-docs`` fills in place (in README.md, docs/, hub/README.md, the notebooks'
markdown cells, and results/README.md from its template)::

    <!-- claim: results/ptb/cpu@1 rk4 rk2_gated -->...<!-- /claim -->

The first word is a study's batch folder (``@DEPTH`` where the table has several depths), then one item per
comparison: ``VARIANT`` against its baseline, ``VARIANT/OTHER`` a test the study declares between two rows
(``Study.pairwise``), ``VARIANT/reference`` against the row of the study's reference study; ``:chrF`` for a
secondary metric's verdict. Each reads ``summary.json``, which ``python -m experiments.report STUDY`` writes from
the result files, so a new result changes the sentence with no hand edit:

* beyond noise (Holm p < 0.05): ``RK4 worse than residual: +14.33 (p 0.008, beyond noise; 95% CI [...])``;
* otherwise: ``RK2 against residual, not measured: -0.66 (p 0.096, within noise; 95% CI [...])``, the same with
  ``(1 pair: untested)``, or ``no comparable pair`` with the unpaired means' gap.

Other markers: ``means`` (``residual 167.78 -> RK4 182.11 (3 seeds each)``), ``spread`` (the Pitman-Morgan test
of two paired variances, Holm-corrected across the table's rows), ``seeds`` (the seeds the paired t-test needs for
a row's observed gap, or ``gap=paper``, at ``alpha=A``) and ``detectable`` (the gap it detects with ``n=N``).

:func:`unsupported_comparisons` reads prose for the words that claim an order, a gain or its absence: beside a
figure, such a word needs a generated verdict beside it that says as much (beyond noise; nothing says "no gain").
"""

from __future__ import annotations

import ast
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

from experiments.significance import ALPHA, MAX_SEEDS, detectable_gap, holm, seeds_needed
from experiments.studies import STUDIES, Metric, Study, size_and_batch

ROOT = Path(__file__).resolve().parents[1]
COMMENT = re.compile(r"<!--.*?-->")
MARKER = re.compile(r"<!-- (claim|means|spread|seeds|detectable): ([^>]*?) -->(.*?)<!-- /\1 -->")

# The names sentences give the rows (a table's labels are too long for a sentence); a variant not named here is
# called by its label. ``_codeF`` adds ", code F", a ``.FACTOR`` the factor.
NAMES = {
    "residual": "residual",
    "rk2": "RK2",
    "rk2_ones": "RK2 gamma=1",
    "rk2_gated": "RK2-gated",
    "rk4": "RK4",
    "pc_rk2": "PC-RK2",
    "pc_rk4": "PC-RK4",
    "rk2_gated_authors": "authors' gate",
    "rk2_learnable_authors": "authors' scalars",
    "rk2_gated_norm": "LN gate",
    "rk2_gated_tableau": "gate started at g = 1/2",
    "residual_x2": "6 residual layers",
    "residual_x4": "12 residual layers",
    "residual_ft": "residual fine-tuned",
    "rk2_up": "RK2 upcycled",
    "rk4_up": "RK4 upcycled",
}


def name(study: Study, variant: str) -> str:
    """What a sentence calls a row: :data:`NAMES`, else the study's label."""
    block, _, factor = variant.partition(".")
    base = block.removesuffix("_codeF")
    if base not in NAMES:
        return study.variants[variant].label
    return NAMES[base] + (", code F" if block != base else "") + (f" ({factor})" if factor else "")


class Table:
    """One batch folder's ``summary.json`` (what experiments.report wrote): its study and rows."""

    def __init__(self, folder: str, root: Path = ROOT) -> None:
        path = root / folder / "summary.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{folder}: no summary.json; run `python -m experiments.report` for it first"
            )
        self.folder = folder
        self.study = STUDIES[Path(folder).parent.name]
        self.size, self.batch = size_and_batch(Path(folder).name)
        self.rows = json.loads(path.read_text(encoding="utf-8"))

    def depth(self, depth: int | None) -> int:
        depths = sorted({row["depth"] for row in self.rows})
        if depth is None and len(depths) > 1:
            raise ValueError(f"{self.folder} has depths {depths}: name one, {self.folder}@DEPTH")
        return depths[0] if depth is None else depth

    def row(self, variant: str, depth: int) -> dict[str, Any]:
        found = [r for r in self.rows if r["variant"] == variant and r["depth"] == depth]
        if not found:
            raise ValueError(f"{self.folder}: no row {variant!r} at depth {depth}")
        return found[0]

    def metric(self, metric_name: str | None) -> Metric:
        metrics = {m.name: m for m in self.study.metrics}
        return self.study.metrics[0] if metric_name is None else metrics[metric_name]


def _parse(spec: str, root: Path) -> tuple[Table, int, list[str], dict[str, str]]:
    folder, *words = spec.split()
    folder, _, depth = folder.partition("@")
    table = Table(folder, root)
    options = dict(word.split("=", 1) for word in words if "=" in word)
    return table, table.depth(int(depth) if depth else None), [w for w in words if "=" not in w], options


def _fmt(value: float, digits: int) -> str:
    return f"{value:.{digits}f}"


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
        + " / ".join(_fmt(row[m.name]["mean"], m.digits) for m in metrics)
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
        ours, theirs = (_fmt(sd, metric.digits) for sd in test["sd"])
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


def _row_power(table: Table, depth: int, variant: str) -> tuple[dict[str, Any], dict[str, Any]]:
    row = table.row(variant, depth)
    return row, row[table.study.metrics[0].name]["paired"]


def seeds(table: Table, depth: int, variants: list[str], options: dict[str, str]) -> str:
    """The seeds the paired t-test needs to detect a row's gap (observed, or ``gap=paper``) with 80% power at
    ``alpha``, from the row's sd of the per-seed differences."""
    (variant,) = variants
    row, paired = _row_power(table, depth, variant)
    gap = row["paper_gap"] if options.get("gap") == "paper" else paired["gap"]
    needed = seeds_needed(gap, paired["sd"], float(options["alpha"]))
    return f"more than {MAX_SEEDS}" if needed is None else str(needed)


def detectable(table: Table, depth: int, variants: list[str], options: dict[str, str]) -> str:
    """The smallest gap the paired t-test over ``n`` seeds detects with 80% power at ``alpha``, from the row's sd of
    the per-seed differences."""
    (variant,) = variants
    _, paired = _row_power(table, depth, variant)
    gap = detectable_gap(paired["sd"], int(options["n"]), float(options["alpha"]))
    return _fmt(gap, table.study.metrics[0].digits)


def generate(kind: str, spec: str, root: Path = ROOT) -> str:
    """The text of one marker, from the ``summary.json`` files under ``root``."""
    table, depth, items, options = _parse(spec, root)
    if kind == "claim":
        return "; ".join(claim(table, depth, item) for item in items)
    if kind == "means":
        return means(table, depth, items)
    if kind == "spread":
        return spread(table, depth, items)
    return (seeds if kind == "seeds" else detectable)(table, depth, items, options)


def fill(text: str, root: Path = ROOT) -> str:
    """``text`` with every marker's text generated afresh (from the results under ``root``)."""
    return MARKER.sub(
        lambda m: (
            f"<!-- {m.group(1)}: {m.group(2)} -->{generate(m.group(1), m.group(2), root)}<!-- /{m.group(1)} -->"
        ),
        text,
    )


# --------------------------------------------------------------------------------------------
# The documents that carry markers, filled in place (results/README.md is written from its template instead).


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


# --------------------------------------------------------------------------------------------
# The check: a word that claims an order, a gain or its absence, near a figure, needs a generated verdict beside it
# that says as much.

# What a generated sentence says when its test orders the rows.
ORDERED = re.compile(r"\b(?:better|worse) than\b|\bvaries (?:less|more)\b")
# Words that order runs; a generated verdict beyond noise supports them.
ORDER = (
    r"trail(?:s|ed|ing)?|lead(?:s|ing)?(?!-3| of)|behind|ahead|"
    # "below" and "above" as positions in the text (see below; the table above) order nothing
    r"(?<!see )(?<!table )(?<!chosen )(?<!shown )(?<!listed )(?<!described )(?<!defined )(?<!rows )(?:below|above)(?!\s*[.,;:)(\"]|$)|"
    r"beat(?:s|ing)?|better|worse|"
    r"outperform(?:s|ed|ing)?|improve(?:s|d|ment)?|recover(?:s|ed|ing)?|rank(?:s|ed|ing)?|"
    r"(?<!new )best(?! (?:validation|epoch|at epoch|checkpoint))|worst|lowest|highest|exceed(?:s|ed)?|"
    r"steadier|more stable|less variable|var(?:y|ies) (?:less|more)|"
    r"the paper's order|in the paper's order|order[^.;]*\bis the paper's"
)
# Words that claim no difference: nothing here tests an equivalence, so none is ever supported beside a figure (a
# gap short of Holm p < 0.05 is "not measured", with its interval).
ABSENCE = (
    r"no gain|gains? nothing|no better|not better|(?:is|are|stays?|was|were) level|level with|"
    r"comparable (?:with|to)|no measurable difference|no difference|makes? no difference|"
    r"(?:does|do|did) not help|doesn't help|no loss|costs? nothing|on par"
)
COMPARISON = re.compile(rf"\b(?:(?P<order>{ORDER})|(?P<absence>{ABSENCE}))\b", re.IGNORECASE)
# A figure in any format: 5.72, -12.24, +0.35, 79, a percentage, 1,500; and fractions written out.
FIGURE = re.compile(
    r"(?<![\w.])[+-]?\d[\d,]*(?:\.\d+)?%?(?![\w])|\b(?:half|third|quarter|fifth|sixth|twice|double)s?\b",
    re.IGNORECASE,
)
# A section's number in a heading is no figure.
SECTION_NUMBER = re.compile(r"^#+ \d+[a-z]?\.", re.MULTILINE)
# Which blocks of the guides are about the studies (every block of results/ and the study notebooks is): those that
# name a study, a results folder or seeds.
STUDY_CONTEXT = re.compile(
    r"\b(?:" + "|".join(STUDIES) + r")\b|results/|\bstud(?:y|ies)\b|\bseeds?\b", re.IGNORECASE
)
NEAR = 200  # characters either side of a word in which a figure makes it a claim about a measured gap
# Conventions, not claims: a metric's direction.
CONVENTION = re.compile(r"\b(?:lower|higher) is better\b", re.IGNORECASE)
QUOTED = re.compile(r'"[^"\n]{1,40}"')
# A verdict typed by hand rather than generated: a p-value, an interval, "beyond/within noise".
# (Quoted, "beyond noise" is the rule's name, not a verdict.)
HAND_VERDICT = re.compile(
    r"\bp 0\.\d{3}|95% CI \[|(?<!\")\b(?:beyond|within) (?:seed )?noise\b(?!\")", re.IGNORECASE
)


def blocks(text: str) -> list[str]:
    """The prose in the units a claim belongs to: paragraphs, each list item, each table line; a heading together
    with the block that follows it (its figures sit there)."""
    found: list[str] = []
    current: list[str] = []
    heading = ""
    for line in [*text.splitlines(), ""]:
        starts = line.startswith(("- ", "* ", "|", "#")) or not line.strip()
        if starts and current:
            found.append((heading + " " + " ".join(current)).strip())
            current, heading = [], ""
        if line.startswith("#"):
            heading = line
        elif line.startswith("|"):
            found.append((heading + " " + line).strip())
            heading = ""
        elif line.strip():
            current.append(line.strip())
    return found + ([heading] if heading else [])


def _generated(block: str) -> tuple[str, list[tuple[int, bool]]]:
    """The block with generated text blanked out (same length, so positions hold), and each generated claim's
    position and whether it orders its rows: every comparison of the marker beyond noise (a marker that also says
    "not measured" supports no word of order)."""
    claims = [
        (
            (m.start() + m.end()) // 2,
            "not measured" not in m.group(3) and ORDERED.search(m.group(3)) is not None,
        )
        for m in MARKER.finditer(block)
        if m.group(1) in ("claim", "spread")
    ]
    hand = MARKER.sub(lambda m: " " * (m.end() - m.start()), block)
    # a convention (lower is better), or a word quoted as a word ("better than", "no gain"), claims nothing
    hand = QUOTED.sub(lambda m: " " * len(m.group(0)), CONVENTION.sub(lambda m: " " * len(m.group(0)), hand))
    return hand, claims


def unsupported_comparisons(text: str, everywhere: bool = True) -> list[str]:
    """Each word of :data:`COMPARISON` in hand-written text with a figure within :data:`NEAR` characters (in the
    hand-written or the generated text) whose nearest generated verdict is absent or weaker: not beyond noise for a
    word of order, any at all for a word of no difference. ``everywhere`` False: only the blocks that are about the
    studies (:data:`STUDY_CONTEXT`), for the guides, where most figures are of speed or of a demo."""
    found = []
    for block in blocks(text):
        if not everywhere and not STUDY_CONTEXT.search(block):
            continue
        hand, claims = _generated(block)
        visible = COMMENT.sub(lambda m: " " * len(m.group(0)), block)  # a marker's own words are no figures
        visible = SECTION_NUMBER.sub(lambda m: " " * len(m.group(0)), visible)
        for word in COMPARISON.finditer(hand):
            if not FIGURE.search(visible[max(0, word.start() - NEAR) : word.end() + NEAR]):
                continue
            nearest = min(claims, key=lambda c: abs(c[0] - word.start()), default=None)
            if word.group("absence") or nearest is None or not nearest[1]:
                why = "no generated verdict" if nearest is None else "a generated verdict that says less"
                found.append(f"{word.group(0)!r} beside a figure, with {why}: {block[:200]}")
    return found


def hand_typed_verdicts(text: str, everywhere: bool = True) -> list[str]:
    """p-values, intervals and "beyond/within noise" typed by hand: a verdict is generated, never copied
    (``everywhere`` as for :func:`unsupported_comparisons`)."""
    found = []
    for block in blocks(text):
        if not everywhere and not STUDY_CONTEXT.search(block):
            continue
        hand, _ = _generated(block)
        found += [f"{m.group(0)!r} typed by hand: {block[:200]}" for m in HAND_VERDICT.finditer(hand)]
    return found


def _model_card_text(path: Path) -> str:
    """The prose a model card is written from: the string constants of hub/model_card.py, one block each."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    strings = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and " " in node.value
    ]
    return "\n\n".join(strings)


def prose(root: Path = ROOT) -> dict[str, str]:
    """Every text the check reads, by name: README.md, docs/ (its templates are read as the documents they
    become), results/ (the study document and each table's README), the notebooks' markdown cells and the model
    card's text (hub/README.md, hub/model_card.py's strings)."""
    import nbformat

    paths = [
        root / "README.md",
        *sorted((root / "docs").glob("*.md")),
        root / "results" / "README.md",
        *sorted((root / "results").glob("*/*/README.md")),
        root / "hub" / "README.md",
    ]
    texts = {str(path.relative_to(root)): path.read_text(encoding="utf-8") for path in paths}
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        notebook = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type == "markdown":
                texts[f"{path.relative_to(root)} cell {index}"] = cell.source
    texts["hub/model_card.py"] = _model_card_text(root / "hub" / "model_card.py")
    return texts


# Documents about the studies throughout: every block is checked, not only those that name a study.
STUDY_DOCUMENTS = ("results/", "notebooks/truncation_error.ipynb", "notebooks/translation_study.ipynb")


def check(root: Path = ROOT) -> list[str]:
    """Every comparison of :func:`prose` that its generated verdict does not support, and every verdict typed by
    hand outside the tables experiments.report writes (results/*/*/README.md, and their copies in
    results/README.md)."""
    texts = prose(root)
    tables = {
        line
        for name, text in texts.items()
        if name.count("/") == 3
        for line in text.splitlines()
        if line[:1] == "|"
    }
    found = []
    for name, text in texts.items():
        everywhere = name.startswith(STUDY_DOCUMENTS)
        found += [f"{name}: {problem}" for problem in unsupported_comparisons(text, everywhere)]
        if name.count("/") != 3:  # a table's own README is the report's text throughout
            own = "\n".join(line for line in text.splitlines() if line not in tables)
            found += [f"{name}: {problem}" for problem in hand_typed_verdicts(own, everywhere)]
    return found
