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
a row's observed gap, or ``gap=paper``, at ``alpha=A``, ``alpha=holm`` for Holm's first step over its table),
``detectable`` (the gap it detects with ``n=N``) and ``power`` (the rows' sd of the per-seed differences, the gaps
they detect and the seeds gaps need: :func:`power`).

:func:`unsupported_comparisons` reads prose for the words that claim an order, a gain or its absence: beside a
figure, such a word needs a generated verdict beside it that says as much, for the rows its sentence names and in
its direction (beyond noise; nothing says "no gain"); :func:`running_claims` for sentences that say work is running.
``python -m experiments.claims`` prints what :func:`check` finds in every document.
"""

from __future__ import annotations

import ast
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

from experiments.significance import ALPHA, MAX_SEEDS, POWER, detectable_gap, holm, seeds_needed
from experiments.studies import STUDIES, Metric, Study, size_and_batch

ROOT = Path(__file__).resolve().parents[1]
COMMENT = re.compile(r"<!--.*?-->")
MARKER = re.compile(r"<!-- (claim|means|spread|seeds|detectable|power): ([^>]*?) -->(.*?)<!-- /\1 -->")

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


def _alpha(option: str, paired: dict[str, Any]) -> float:
    """``alpha=A``: a number, or ``holm`` for the bar of Holm's first step over the row's table."""
    return paired["power"]["holm_first_step_alpha"] if option == "holm" else float(option)


def _count(needed: int | None) -> str:
    return f"more than {MAX_SEEDS}" if needed is None else str(needed)


def seeds(table: Table, depth: int, variants: list[str], options: dict[str, str]) -> str:
    """The seeds the paired t-test needs to detect a row's gap (observed, or ``gap=paper``) with 80% power at
    ``alpha``, from the row's sd of the per-seed differences."""
    (variant,) = variants
    row, paired = _row_power(table, depth, variant)
    gap = row["paper_gap"] if options.get("gap") == "paper" else paired["gap"]
    return _count(seeds_needed(gap, paired["sd"], _alpha(options["alpha"], paired)))


def _span(values: list[str]) -> str:
    """``0.65-1.00`` from several formatted values, one value where they agree."""
    low, high = values[0], values[-1]
    return low if low == high else f"{low}-{high}"


def _gap_of(spec: str, root: Path) -> tuple[str, float]:
    """``FOLDER[@DEPTH]:ROW``: that row's name and its gap to its baseline (the paired one where it has pairs,
    else its unpaired means' difference)."""
    folder, _, variant = spec.partition(":")
    table, depth, _, _ = _parse(folder, root)
    row = table.row(variant, depth)
    metric = table.study.metrics[0].name
    paired = row[metric].get("paired") or {}
    label = f"{name(table.study, variant)}'s gap in {folder.partition('@')[0]}"
    if paired.get("gap") is not None:
        return label, paired["gap"]
    return label, row[metric]["mean"] - table.row(row["baseline"], depth)[metric]["mean"]


def power(table: Table, depth: int, variants: list[str], options: dict[str, str], root: Path = ROOT) -> str:
    """What the paired t-test can detect from the rows' observed sd of the per-seed differences (a range over
    several rows): the gap it detects with 80% power over ``n`` seeds (default: the pairs run) at alpha 0.05 and at
    ``alpha`` (default: Holm's first step over the table), and the seeds a gap needs at both: for one row its paper's
    gap and its observed one, and ``gap=FOLDER[@DEPTH]:ROW`` that row's gap."""
    metric = table.study.metrics[0]
    digits = metric.digits
    records = [_row_power(table, depth, variant) for variant in variants]
    paired = [record for _, record in records]
    order = sorted(range(len(paired)), key=lambda i: paired[i]["sd"])
    sds = [paired[i]["sd"] for i in order]
    pairs = sorted({record["pairs"] for record in paired})
    n = int(options.get("n", pairs[0]))
    alphas = (ALPHA, _alpha(options.get("alpha", "holm"), paired[0]))
    names = ", ".join(name(table.study, variant) for variant in variants)
    each = " each" if len(variants) > 1 else ""
    count = "/".join(str(p) for p in pairs)
    text = (
        f"sd of the per-seed differences {_span([_fmt(sd, digits) for sd in sds])} {metric.name} ({names}; "
        f"{count} pair{'s' if pairs != [1] else ''}{each}); {n} seeds detect "
        + " and ".join(
            f"{_span([_fmt(detectable_gap(sd, n, alpha), digits) for sd in sds])} at alpha "
            + f"{alpha:.4f}".rstrip("0")
            for alpha in alphas
        )
        + f" with {POWER:.0%} power"
    )
    gaps: list[tuple[str, float]] = []
    if "gap" in options:
        gaps.append(_gap_of(options["gap"], root))
    elif len(variants) == 1:
        row, record = records[0]
        if row["paper_gap"] is not None:
            gaps.append(("the paper's gap", row["paper_gap"]))
        gaps.append(("the observed gap", record["gap"]))
    for label, gap in gaps:
        needed = [_span([_count(seeds_needed(gap, sd, alpha)) for sd in sds]) for alpha in alphas]
        text += f"; {label} {gap:+.{digits}f} needs {needed[0]} / {needed[1]} seeds"
    return text


def detectable(table: Table, depth: int, variants: list[str], options: dict[str, str]) -> str:
    """The smallest gap the paired t-test over ``n`` seeds detects with 80% power at ``alpha``, from the row's sd of
    the per-seed differences."""
    (variant,) = variants
    _, paired = _row_power(table, depth, variant)
    gap = detectable_gap(paired["sd"], int(options["n"]), _alpha(options["alpha"], paired))
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
    if kind == "power":
        return power(table, depth, items, options, root)
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
# that says as much, for the rows the sentence names and in the direction the word says.

# Words of order, by what they say of the row they are said of (its subject): "better" and "worse" in the metric's
# own sense, "higher" and "lower" of its value, "rank" an order among the rows named (each pair tested, beyond noise;
# of one row, against its baseline in :data:`RANK_DIRECTION`'s sense), "steadier" and "wider" of the spread across
# seeds.
# "below" and "above" as positions in the text (see below; the table above) order nothing; nor does a word of
# place before a figure, a threshold ("g below 0.01", "exceeds 8.86 x sd"), unless the figure counts layers.
_PLACE = (
    r"(?<!see )(?<!table )(?<!chosen )(?<!shown )(?<!listed )(?<!described )(?<!defined )(?<!rows )"
    r"(?<!runs )(?<!given )(?<!section )(?:{})(?!\s*[.,;:)(\"]|$)"
)
_THRESHOLD = r"(?!\s+[+-]?\d[\d.,]*%?(?!\s*layers?))"
ORDER_WORDS = {
    "better": (
        r"beat(?:s|ing)?|better|ahead|outperform(?:s|ed|ing)?|improve(?:s|d)?|recover(?:s|ed|ing)?|"
        r"lead(?:s|ing)?(?!-3| of| to)|wins?|gains(?! nothing)|gained|(?:shows?|showed|has|had|gives?|gave) an? gain|"
        r"superior|tops(?= the)"
    ),
    "worse": r"trail(?:s|ed|ing)?|behind|worse|lag(?:s|ged|ging)?|loses?|hurts?|inferior",
    "higher": rf"(?:{_PLACE.format('above')}|exceed(?:s|ed)?){_THRESHOLD}|higher",
    # "under" as a comparison: after a figure, or before a row ("0.32 under RK2", "under residual")
    "lower": (
        rf"{_PLACE.format('below')}{_THRESHOLD}|lower|"
        r"reduces?(?= (?:the |its )?(?:perplexity|BLEU|chrF|loss|error|gap))|"
        r"(?<=\d )under|under(?= (?:the )?(?:residual|RK\d|PC-RK|its baseline|the baseline))"
    ),
    "rank": (
        r"rank(?:s|ed|ing)?|(?:ranks?|comes?|came|is|are|places?|finish(?:es)?) first|(?:in )?the paper's order|"
        r"order[^.;]*\bis the paper's|(?<!new )best(?! (?:validation|epoch|at epoch|checkpoint))|worst|lowest|"
        r"highest|smallest|largest"
    ),
    "steadier": r"steadier|more stable|less variable|more consistent|var(?:y|ies) less",
    "wider": r"less stable|more variable|less consistent|var(?:y|ies) more",
}
# What a word of rank says of one row against its baseline.
RANK_DIRECTION = {
    "best": "better",
    "worst": "worse",
    "lowest": "lower",
    "smallest": "lower",
    "highest": "higher",
    "largest": "higher",
}
ORDER = "|".join(f"(?P<{kind}>{words})" for kind, words in ORDER_WORDS.items())
# Words that claim no difference: nothing here tests an equivalence, so none is ever supported beside a figure (a
# gap short of Holm p < 0.05 is "not measured", with its interval).
_ROW_AHEAD = r"(?:(?:the|its|that of) )?(?:[\w-]+ ){0,2}?(?:residual|RK\d|PC-RK|baseline|paper's)"
ABSENCE = (
    r"no gain|gains? nothing|no better|not better|(?:is|are|stays?|was|were) level|level with|"
    r"comparable (?:with|to)|no measurable difference|no difference|makes? no difference|"
    r"(?:does|do|did) not help|doesn't help|no loss|costs? nothing|on par|"
    rf"match(?:es|ed)? {_ROW_AHEAD}|(?:the )?same as|"
    r"indistinguishable|no advantage|no edge"
)
COMPARISON = re.compile(rf"\b(?:(?P<absence>{ABSENCE})|{ORDER})\b", re.IGNORECASE)
# A figure in any format: 5.72, -12.24, +0.35, 79, a percentage, 1,500; and fractions written out.
FIGURE = re.compile(
    r"(?<![\w.])[+-]?\d[\d,]*(?:\.\d+)?%?(?![\w])|\b(?:half|third|quarter|fifth|sixth|twice|double)s?\b",
    re.IGNORECASE,
)
# A section's number in a heading is no figure.
SECTION_NUMBER = re.compile(r"^#+ \d+[a-z]?\.", re.MULTILINE)
# What a sentence calls a row, as hand-written prose does: each alias and the name of :data:`NAMES` it stands for
# (longest first, so that "RK2 gamma=1" is not read as "RK2"; "residual" in either case); a row's id in backticks is
# its name too.
ALIASES = [
    (r"PC-RK2", "PC-RK2"),
    (r"PC-RK4", "PC-RK4"),
    (r"RK2[ -]?(?:block )?\(?gamma ?= ?1\)?|gamma ?= ?1", "RK2 gamma=1"),
    (r"RK2-gated|(?i:gated) RK2|RK2 gated", "RK2-gated"),
    (r"(?i:upcycled)(?: to)? RK2|RK2 upcycled", "RK2 upcycled"),
    (r"(?i:upcycled)(?: to)? RK4|RK4 upcycled", "RK4 upcycled"),
    (r"authors' gate", "authors' gate"),
    (r"authors' (?:learnable )?scalars", "authors' scalars"),
    (r"LN gate", "LN gate"),
    (r"(?:6|six) residual layers|residual with 6", "6 residual layers"),
    (r"(?:12|twelve) residual layers|residual with 12", "12 residual layers"),
    (r"(?i:residual fine-tuned|fine-tuned residual)(?: model)?", "residual fine-tuned"),
    (r"(?<!PC-)RK4(?:-block)?", "RK4"),
    (r"(?<!PC-)RK2(?:-block)?(?![- ]gated| gamma| upcycled)", "RK2"),
    (r"(?i:residual)", "residual"),
]
ROW = re.compile(
    "|".join(f"(?P<a{i}>(?<![\\w-]){alias}(?![\\w-]))" for i, (alias, _) in enumerate(ALIASES))
    + r"|`(?P<id>\w+)`",
)
# The rows a plural or "every" names: all the table's RK rows, or its PC rows.
EVERY = re.compile(
    r"\b(?:(?:every|each|all(?: the)?|both(?: the)?) (?:of the )?(?:(?P<pc>PC)|RK|ODE) blocks?|"
    r"(?:the )?(?:(?P<pc2>PC)|RK|ODE) blocks)\b",
    re.IGNORECASE,
)
# A conditional claims nothing ("beyond noise if the pairs' sd is below 2.39").
CONDITIONAL = re.compile(r"\b(?:if|unless|would|should|whether)\b", re.IGNORECASE)
# Which blocks of the guides are about the studies (every block of results/ and the study notebooks is): those that
# name a study, a results folder, seeds, a row or a study's metric.
STUDY_CONTEXT = re.compile(
    r"\b(?:" + "|".join(STUDIES) + r")\b|results/|\bstud(?:y|ies)\b|\bseeds?\b|"
    r"\b(?:PC-)?RK[24]\b|\bresidual\b|\bBLEU\b|\bchrF\b|\bperplexit(?:y|ies)\b|\bROUGE",
    re.IGNORECASE,
)
# A guide's block about speed or memory (a benchmark's, not a study's figures) where it names no study metric.
SPEED = re.compile(
    r"\b(?:FLOPs?|ms|tokens/s|sentences/s|throughput|faster|slower|speed(?:up)?|latency|wall time|timing|rounds?|"
    r"memory|peak|[GM]i?B)\b|\d(?:\.\d+)?x\b|\bx\d",
    re.IGNORECASE,
)
QUALITY = re.compile(r"\b(?:BLEU|chrF|perplexit(?:y|ies)|ROUGE|F0\.5|seeds?)\b|beyond noise", re.IGNORECASE)
NEAR = 200  # characters either side of a word in which a figure makes it a claim about a measured gap
# Conventions, not claims: a metric's direction, what a sign means.
CONVENTION = re.compile(
    r"\b(?:lower|higher) is better\b|\bthe variant scored (?:higher|lower)\b|(?<=: )(?:higher|lower)(?=\))",
    re.IGNORECASE,
)
QUOTED = re.compile(r'"[^"\n]{1,40}"')
# A verdict typed by hand rather than generated: a p-value, an interval, "beyond/within noise", or a power figure
# (the gap the seeds detect, the seeds a gap needs, the sd they rest on), which the ``power`` and ``seeds`` markers
# write. (Quoted, "beyond noise" is the rule's name, not a verdict.)
HAND_VERDICT = re.compile(
    r"\bp 0\.\d{3}|95% CI \[|(?<!\")\b(?:beyond|within) (?:seed )?noise\b(?!\")|"
    r"\bdetects?\b(?: with \d+% power)?(?: only)?(?: a)? gaps? of (?:about )?[+-]?\d+\.\d+|\bdetects? [+-]?\d+\.\d+|"
    r"\bsd of (?:the )?per-seed differences? (?:of )?\(?\d+\.\d+|\bsd \(\d+\.\d+|\bneeds? \d+ (?:/ \d+ )?seeds|"
    r"\b\d+ / \d+ seeds",
    re.IGNORECASE,
)
# Words that say work is under way: a document says what is committed and what a queue runs next, since nothing
# keeps such a sentence true once the run ends or the machine goes.
RUNNING = re.compile(
    r"\b(?:(?:is|are|now|still|currently) (?:being )?(?:running|training)|(?:is|are) being (?:run|trained)|"
    r"(?:now|still|currently) (?:being )?(?:run|trained)|in progress|under ?way|currently runs?)\b",
    re.IGNORECASE,
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


def _split_top(text: str, separator: str = "; ") -> list[str]:
    """``text`` split at ``separator`` outside parentheses and brackets (a verdict's own "; " stays in it)."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        if depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            start = i + len(separator)
    return [*parts, text[start:]]


GENERATED_CLAIM = re.compile(
    r"^(?P<subject>.+?) (?:(?P<direction>better|worse) than|against) (?P<other>.+?)"
    r"(?: in (?P<metric>\S+))?(?:, not measured)?: (?P<rest>.*)$"
)
GENERATED_SPREAD = re.compile(
    r"^(?P<subject>.+?)(?: varies (?P<direction>less|more) across seeds than |'s spread against |'s sd across "
    r"seeds .*? against )(?P<other>.+?)(?:'s)?(?:, not measured| \S+)?: (?P<rest>.*)$"
)
SIGNED = re.compile(r"[+-]\d+(?:\.\d+)?")


def _base_name(generated_name: str) -> str:
    """A generated row name without its factor: ``RK4 (pilot)`` is RK4 to a sentence."""
    return re.sub(r" \([\w.]+\)$", "", generated_name.strip())


def generated_items(kind: str, text: str) -> list[dict[str, Any]]:
    """The comparisons of one marker's generated text: each item's rows, its direction where its test is beyond
    noise (better / worse; for a spread, less / more) and None otherwise, and the sign of its gap."""
    items = []
    for part in _split_top(text):
        pattern = GENERATED_CLAIM if kind == "claim" else GENERATED_SPREAD
        match = pattern.match(part.strip())
        if match is None:
            continue
        gap = SIGNED.search(match.group("rest"))
        items.append(
            {
                "kind": kind,
                "subject": _base_name(match.group("subject")),
                "other": _base_name(match.group("other")),
                "direction": match.group("direction"),
                "metric": match.groupdict().get("metric"),
                "gap": float(gap.group(0)) if gap and "no comparable pair" not in part else None,
            }
        )
    return items


def _markers(block: str) -> list[dict[str, Any]]:
    """The block's claim and spread markers: position, spec and items."""
    return [
        {
            "at": (m.start() + m.end()) // 2,
            "spec": m.group(2),
            "items": generated_items(m.group(1), m.group(3)),
        }
        for m in MARKER.finditer(block)
        if m.group(1) in ("claim", "spread")
    ]


def _hand(block: str) -> str:
    """The block with generated text blanked out (same length, so positions hold), and the words that claim
    nothing: a convention (lower is better), a word quoted as a word ("better than", "no gain")."""
    hand = MARKER.sub(lambda m: " " * (m.end() - m.start()), block)
    hand = COMMENT.sub(lambda m: " " * len(m.group(0)), hand)
    return QUOTED.sub(lambda m: " " * len(m.group(0)), CONVENTION.sub(lambda m: " " * len(m.group(0)), hand))


def _row_names(clause: str, offset: int) -> list[tuple[int, str]]:
    """The rows a clause names, each with its position: an alias of :data:`ALIASES`, a row id in backticks, or
    "every RK block" (``*RK``, ``*PC``)."""
    names = []
    for m in EVERY.finditer(clause):
        names.append((offset + m.start(), "*PC" if (m.group("pc") or m.group("pc2")) else "*RK"))
    taken = [range(m.start(), m.end()) for m in EVERY.finditer(clause)]
    for m in ROW.finditer(clause):
        if any(m.start() in span for span in taken):
            continue
        if m.group("id"):
            base = m.group("id").removesuffix("_codeF")
            if base in NAMES:
                names.append(
                    (offset + m.start(), NAMES[base] + (", code F" if base != m.group("id") else ""))
                )
            continue
        index = next(int(key[1:]) for key, value in m.groupdict().items() if value and key != "id")
        names.append((offset + m.start(), ALIASES[index][1]))
    return sorted(names)


def _every(spec: str, pc: bool, root: Path) -> list[str] | None:
    """The names of the RK (or PC) rows of a marker's table at its depth, in the reading of F and under the factor
    of the marker's first row; None where the table cannot be read."""
    try:
        table, depth, items, _ = _parse(spec, root)
    except (FileNotFoundError, KeyError, ValueError):
        return None
    first = items[0].partition(":")[0].partition("/")[0] if items else ""
    code_f, factor = first.partition(".")[0].endswith("_codeF"), first.partition(".")[2]
    rows = []
    for row in table.rows:
        block, _, row_factor = row["variant"].partition(".")
        if row["depth"] != depth or row["variant"] == row["baseline"] or row_factor != factor:
            continue
        if block.endswith("_codeF") != code_f or not re.match(r"pc_rk\d" if pc else r"rk\d", block):
            continue
        rows.append(_base_name(name(table.study, row["variant"])))
    return rows


def _find(
    markers: list[dict[str, Any]], at: int, kind: str, row: str, other: str | None, metric: str | None = None
):
    """The item nearest ``at`` that compares ``row`` with ``other`` (with its baseline where ``other`` is None) in
    ``metric`` (None: the study's primary one), and whether it states them the other way round."""
    found = []
    for marker in markers:
        for item in marker["items"]:
            if item["kind"] != kind or item.get("metric") != metric:
                continue
            if item["subject"] == row and other in (None, item["other"]):
                found.append((abs(marker["at"] - at), item, False))
            elif other is not None and item["subject"] == other and item["other"] == row:
                found.append((abs(marker["at"] - at), item, True))
    return min(found, key=lambda f: f[0])[1:] if found else (None, False)


OPPOSITE = {"better": "worse", "worse": "better", "higher": "lower", "lower": "higher", "less": "more"}
OPPOSITE.update({v: k for k, v in OPPOSITE.items()})


def _says(item: dict[str, Any] | None, reversed_: bool, kind: str, direction: str | None) -> bool:
    """Whether a generated item backs a word of ``kind`` (with ``direction``, for a word of rank) said of its
    subject, or of its other row where ``reversed_``: beyond noise, and in the word's direction."""
    if item is None or item["direction"] is None:
        return False
    if kind in ("steadier", "wider"):
        said = "less" if kind == "steadier" else "more"
        return item["kind"] == "spread" and item["direction"] == (OPPOSITE[said] if reversed_ else said)
    wanted = direction if kind == "rank" else kind
    if item["kind"] != "claim":
        return False
    if wanted is None:
        return True
    wanted = OPPOSITE[wanted] if reversed_ else wanted
    if wanted in ("better", "worse"):
        return item["direction"] == wanted
    return item["gap"] is not None and (item["gap"] > 0) == (wanted == "higher")


def _supported(
    at: int,
    word: str,
    kind: str,
    names: list[tuple[int, str]],
    markers: list[dict[str, Any]],
    metric: str | None,
    root: Path,
) -> bool:
    """Whether the block's generated verdicts back a word of order at ``at``. The rows its clause names before the
    word are said to stand so against those named after it, or, where all are named on one side, against their
    baselines; each such comparison needs a generated test beyond noise in the word's direction (the nearest that
    compares those rows). "Every RK block" stands for every RK row of the nearest marker's table; a word of rank
    among several rows needs each pair of them tested; a clause that names no row needs every comparison of the
    nearest marker to back it. All in ``metric`` (None: the study's primary one)."""
    if not markers:
        return False
    nearest = min(markers, key=lambda m: abs(m["at"] - at))
    direction = "better" if word.lower().endswith("first") else RANK_DIRECTION.get(word.lower())
    item_kind = "spread" if kind in ("steadier", "wider") else "claim"
    before: list[str] = []
    after: list[str] = []
    for position, row in names:
        rows = [row]
        if row.startswith("*"):
            rows = _every(nearest["spec"], row == "*PC", root) or []
            if not rows:
                return False
        side = before if position < at else after
        side += [r for r in rows if r not in before + after]
    named = before + after
    if not named or named == ["residual"]:
        items = [i for i in nearest["items"] if i["kind"] == item_kind and i.get("metric") == metric]
        reversed_ = named == ["residual"]
        return bool(items) and all(_says(item, reversed_, kind, direction) for item in items)
    if kind == "rank" and len(named) > 1:
        pairs = [(a, b) for i, a in enumerate(named) for b in named[i + 1 :]]
        return all(_says(*_find(markers, at, item_kind, a, b, metric), kind, None) for a, b in pairs)
    if before and after:
        pairs = [(a, b) for a in before for b in after]
    else:
        pairs = [(row, None) for row in named if row != "residual"]
    return all(_says(*_find(markers, at, item_kind, a, b, metric), kind, direction) for a, b in pairs)


def _clauses(hand: str) -> list[tuple[int, str]]:
    """The hand-written text's clauses, each with its offset: up to each full stop, semicolon or colon."""
    found, start = [], 0
    for m in re.finditer(r"[.;:!?](?=\s|$)", hand):
        found.append((start, hand[start : m.end()]))
        start = m.end()
    return [*found, (start, hand[start:])]


def _about_the_studies(hand: str) -> bool:
    """Whether a guide's block is about the studies (:data:`STUDY_CONTEXT`), not only about speed or memory."""
    return bool(STUDY_CONTEXT.search(hand)) and (not SPEED.search(hand) or bool(QUALITY.search(hand)))


def unsupported_comparisons(text: str, everywhere: bool = True, root: Path = ROOT) -> list[str]:
    """Each word of :data:`COMPARISON` in hand-written text with a figure within :data:`NEAR` characters (in the
    hand-written or the generated text) that the block's generated verdicts do not back (:func:`_supported`); a
    word of no difference is backed by none, and a conditional clause claims nothing. ``everywhere`` False: only
    the blocks that are about the studies (:data:`STUDY_CONTEXT`), for the guides, where most figures are of speed
    or of a demo."""
    found = []
    for block in blocks(text):
        hand = _hand(block)
        if not everywhere and not _about_the_studies(hand):
            continue
        markers = _markers(block)
        if not everywhere and not markers and not _row_names(hand, 0):
            continue  # in a guide, a comparison of the studies names its rows or stands beside a verdict
        visible = COMMENT.sub(lambda m: " " * len(m.group(0)), block)  # a marker's own words are no figures
        visible = SECTION_NUMBER.sub(lambda m: " " * len(m.group(0)), visible)
        for offset, clause in _clauses(hand):
            if CONDITIONAL.search(clause):
                continue
            names = _row_names(clause, offset)
            metric = "chrF" if re.search(r"\bchrF\b", clause) else None  # the secondary metric a clause names
            words = list(COMPARISON.finditer(clause))
            for index, word in enumerate(words):
                start, end = offset + word.start(), offset + word.end()
                if not FIGURE.search(visible[max(0, start - NEAR) : end + NEAR]):
                    continue
                kind = next(k for k, v in word.groupdict().items() if v)
                if kind == "absence":
                    why = "a word of no difference, which no test here backs"
                elif _supported(
                    start, word.group(0), kind, _own(names, words, index, offset), markers, metric, root
                ):
                    continue
                else:
                    why = "no generated verdict beyond noise in its direction for the rows it names"
                found.append(f"{word.group(0)!r} beside a figure, with {why}: {block[:200]}")
    return found


def _own(
    names: list[tuple[int, str]], words: list[re.Match], index: int, offset: int
) -> list[tuple[int, str]]:
    """The rows a clause's ``index``-th word of comparison is said of and against: those between it and its
    neighbours (in "RK4 beats RK2-gated, and RK2-gated trails RK4" each word has its own), the subject it shares
    with the word before where none stands between them."""
    word = words[index]
    low = offset + words[index - 1].end() if index else -1
    high = offset + words[index + 1].start() if index + 1 < len(words) else math.inf
    at = offset + word.start()
    before = [n for n in names if low <= n[0] < at]
    if not before and index:
        before = [n for n in names if n[0] < offset + words[index - 1].start()]
    return before + [n for n in names if offset + word.end() <= n[0] < high]


def hand_typed_verdicts(text: str, everywhere: bool = True) -> list[str]:
    """p-values, intervals and "beyond/within noise" typed by hand: a verdict is generated, never copied
    (``everywhere`` as for :func:`unsupported_comparisons`)."""
    found = []
    for block in blocks(text):
        if not everywhere and not _about_the_studies(_hand(block)):
            continue
        found += [f"{m.group(0)!r} typed by hand: {block[:200]}" for m in HAND_VERDICT.finditer(_hand(block))]
    return found


def running_claims(text: str, everywhere: bool = True) -> list[str]:
    """Sentences that say work is running or in progress (:data:`RUNNING`). ``everywhere`` False: only the blocks
    about the studies, for the guides, whose operations prose says what a tool does while a run is training."""
    return [
        f"{m.group(0)!r} says work is under way; say what is committed and what runs next: {block[:200]}"
        for block in blocks(text)
        if everywhere or _about_the_studies(_hand(block))
        for m in RUNNING.finditer(_hand(block))
    ]


def _string_constants(path: Path) -> str:
    """The prose a module writes for users: its string constants with a space in them, one block each."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    strings = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and " " in node.value
    ]
    return "\n\n".join(strings)


# Modules whose strings a user reads: the model card's text, and the words ode-train's log and the card share.
USER_STRINGS = ("ode_transformer/model_card.py", "ode_transformer/wording.py")


def prose(root: Path = ROOT) -> dict[str, str]:
    """Every text the check reads, by name: README.md, docs/ (its templates are read as the documents they
    become), results/ (the study document, the verdict plan and each table's README), the notebooks' markdown
    cells and the user-facing strings of :data:`USER_STRINGS` (besides hub/README.md)."""
    import nbformat

    paths = [
        root / "README.md",
        *sorted((root / "docs").glob("*.md")),
        root / "results" / "README.md",
        root / "results" / "verdict.md",
        *sorted((root / "results").glob("*/*/README.md")),
        root / "hub" / "README.md",
    ]
    texts = {str(path.relative_to(root)): path.read_text(encoding="utf-8") for path in paths}
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        notebook = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type == "markdown":
                texts[f"{path.relative_to(root)} cell {index}"] = cell.source
    for module in USER_STRINGS:
        texts[module] = _string_constants(root / module)
    return texts


# Documents about the studies throughout: every block is checked, not only those that name a study.
STUDY_DOCUMENTS = ("results/", "notebooks/truncation_error.ipynb", "notebooks/translation_study.ipynb")
# Documents experiments.report or experiments.verdict writes whole: their verdicts are copied from summary.json.
GENERATED_DOCUMENTS = ("results/verdict.md",)


def check(root: Path = ROOT) -> list[str]:
    """Every comparison of :func:`prose` that its generated verdict does not support, every verdict typed by hand
    outside the tables experiments.report writes (results/*/*/README.md, and their copies in results/README.md)
    and the verdict plan experiments.verdict writes, and every sentence that says work is running."""
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
        found += [f"{name}: {problem}" for problem in unsupported_comparisons(text, everywhere, root)]
        found += [f"{name}: {problem}" for problem in running_claims(text, everywhere)]
        if name.count("/") != 3 and name not in GENERATED_DOCUMENTS:  # the report's own text throughout
            own = "\n".join(line for line in text.splitlines() if line not in tables)
            found += [f"{name}: {problem}" for problem in hand_typed_verdicts(own, everywhere)]
    return found


def main() -> int:
    """``python -m experiments.claims``: print every problem :func:`check` finds; exit 1 if there is one."""
    problems = check()
    print("\n".join(problems) or "every comparison has its generated verdict")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
