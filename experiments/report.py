"""Aggregate a study: ``python -m experiments.report STUDY [--size cpu|paper]``; write the study document:
``python -m experiments.report --write-docs``.

Reads every ``results/<study>/<size>/*.json`` (``<size>_<batch>`` for a second batch, ``--batch``) and writes
beside them ``README.md`` (a markdown table: mean +- std over seeds for each variant and depth, the paper's number
beside ours, the gap to the baseline and whether it is more than noise), ``summary.json`` and ``summary.png``.
A folder whose runs mix code commits, devices or precisions is refused, naming the files of each side, as is a
record that is damaged, partial or has a NaN metric (``experiments.records``); ``--mixed`` reports a mixed folder
anyway, pairing only runs that share all three and saying under the table what it mixes.

Noise: a variant's run is paired with the baseline's run of the same seed, and only where both ran at the same
code commit, on the same device (CPU model and capability) and in the same precision; a pair that is not is
dropped and listed under the table. The gap is the mean over the pairs; its p-value is a paired t-test over them,
Holm-corrected over the tests the study declares (``Study.holm_family``: every row against its baseline and every
declared test between rows, run or not), and "beyond noise" means p < 0.05; the gap's 95% confidence interval is
the paired t interval over the same differences (not Holm-adjusted). For translation, sacreBLEU's paired bootstrap
(1,000 resamples) of each pair on the same test set gives a p-value per seed, signed by that seed's gap.

Power: under the table, each tested row's smallest gap that the paired t-test detects with 80% power at the seeds
run, and the seeds it needs to detect the paper's gap and the observed one, at alpha 0.05 and at Holm's first
step (alpha / the number of declared tests), all from the row's observed sd of the per-seed differences.

``--write-docs`` writes ``results/README.md``, the study document the project README links to: the prose of
``docs/templates/results.md`` with each ``<!-- table: results/STUDY/SIZE -->`` marker replaced by the table of
that study's ``README.md`` (written by this module from the committed results), and each
``<!-- gates: results/.../FILE.json -->`` marker by a table of the gate statistics that
``python -m experiments.block_diagnostic ... --json FILE.json`` recorded. It also fills every sentence marker
(``<!-- claim: ... -->``, experiments.claims) there and in README.md, docs/, hub/README.md and the notebooks'
markdown cells, from each study's ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from experiments.records import PROVENANCE, comparable, load_results, mixing, record_files, refuse_bad_records
from experiments.significance import (
    ALPHA,
    MAX_SEEDS,
    POWER,
    confidence_interval,
    detectable_gap,
    holm,
    paired_t_test,
    seeds_needed,
)
from experiments.studies import STUDIES, Study, batch_folder, batch_label, describe_changes, run_id

RESULTS = Path(__file__).resolve().parents[1] / "results"
DOCS_TEMPLATE = RESULTS.parent / "docs" / "templates" / "results.md"
TABLE_MARKER = re.compile(r"^<!-- table: (results/[\w.]+/\w+) -->$", re.MULTILINE)
GATE_MARKER = re.compile(r"^<!-- gates: (results/[\w./]+\.json) -->$", re.MULTILINE)
BOOTSTRAP_SAMPLES = 1000
# Secondary metrics whose verdict stands beside the primary one's: chrF scores the same test set as BLEU, and a
# verdict that holds in one and not the other is worth seeing.
VERDICT_ALSO = ("chrF",)


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for a single value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def describe_mismatch(ours: dict[str, Any], baseline: dict[str, Any], whose: str = "the baseline's") -> str:
    """Why two runs are not paired: the parts of :func:`comparable` that differ (``whose``: the other run's
    owner, as the message names it)."""
    names = PROVENANCE

    def shown(name: str, value: Any) -> str:
        return str(value)[:7] if name == "commit" and value else str(value)

    parts = [
        f"{name} {shown(name, a)} here, {shown(name, b)} in {whose} run"
        for name, a, b in zip(names, comparable(ours), comparable(baseline))
        if a != b
    ]
    return ", ".join(parts)


def paired_comparison(
    runs: list[dict[str, Any]],
    baseline: dict[int, dict[str, Any]],
    metric: str,
    whose: str = "the baseline's",
) -> dict[str, Any]:
    """The variant's runs paired with the baseline's of the same seed, commit, device and precision: the mean
    gap over the pairs, their number, the paired t-test's p-value (Holm-corrected later, across the table) and
    every pair that had to be dropped, with why."""
    pairs, dropped, differences = [], [], {}
    for run in runs:
        other = baseline.get(run["seed"])
        if other is None:
            dropped.append({"seed": run["seed"], "why": f"no run of this seed among {whose} runs"})
        elif comparable(run) != comparable(other):
            dropped.append({"seed": run["seed"], "why": describe_mismatch(run, other, whose)})
        else:
            pairs.append((run["metrics"][metric], other["metrics"][metric]))
            differences[run["seed"]] = pairs[-1][0] - pairs[-1][1]
    ours, theirs = [p[0] for p in pairs], [p[1] for p in pairs]
    p_value = paired_t_test(ours, theirs)
    return {
        "pairs": len(pairs),
        "gap": statistics.fmean(differences.values()) if pairs else None,
        "p": p_value,
        "differences": differences,
        "sd": statistics.stdev(differences.values()) if len(pairs) > 1 else None,
        # only where the t-test ran: identical differences have no spread to make an interval of
        "ci95": None if p_value is None else confidence_interval(list(differences.values())),
        "dropped": dropped,
    }


def compare_with_reference(
    study: Study, rows: list[dict[str, Any]], results: list[dict[str, Any]], reference: list[dict[str, Any]]
) -> None:
    """Add to each row of a study with a ``reference`` its comparison with the reference study's row (the runs of
    ``reference``, from the same batch): paired by seed, commit, device and precision as the baseline is, the
    primary metric only, Holm-corrected across these comparisons."""
    other_study, counterparts = study.reference
    metric = study.metrics[0].name
    ours, reference_cells = runs_by_cell(results), runs_by_cell(reference)
    compared = []
    for row in rows:
        if (counterpart := counterparts.get(row["variant"])) is None:
            continue
        runs = ours[(row["variant"], row["depth"])]
        theirs = {r["seed"]: r for r in reference_cells.get((counterpart, row["depth"]), [])}
        whose = f"{other_study}'s {counterpart}"
        row["reference"] = {
            "study": other_study,
            "variant": counterpart,
            **paired_comparison(runs, theirs, metric, whose),
        }
        compared.append(row["reference"])
    for comparison, p_holm in zip(compared, holm([c["p"] for c in compared])):
        comparison["p_holm"] = p_holm
        comparison["verdict"] = verdict(comparison, study.metrics[0].digits)


def reference_table(study: Study, rows: list[dict[str, Any]]) -> list[str]:
    """The markdown of :func:`compare_with_reference`'s comparisons (none where the study has no reference)."""
    compared = [row for row in rows if "reference" in row]
    if not compared:
        return []
    metric = study.metrics[0].name
    lines = [
        "",
        f"Against the rows of `{study.reference[0]}` in the same batch ({metric}, paired as above, Holm-corrected "
        "across these rows):",
        "",
        f"| variant | compared with | {metric} vs it | dropped pairs |",
        "|---|---|---|---|",
    ]
    for row in compared:
        ref = row["reference"]
        dropped = "; ".join(f"seed {d['seed']}: {d['why']}" for d in ref["dropped"])
        lines.append(f"| {row['label']} | {ref['variant']} | {ref['verdict']} | {dropped} |")
    return [*lines, ""]


def verdict(comparison: dict[str, Any], digits: int = 2) -> str:
    """``+1.23 (p 0.012, beyond noise; 95% CI [+0.40, +2.06])`` / ``(p 0.310, within noise; 95% CI [...])`` /
    ``(1 pair: untested)``, from the Holm-corrected p-value; ``no comparable pair`` when every pair was dropped.
    The interval follows every tested gap, so that "within noise" always says how large a gap it leaves open."""
    if comparison["gap"] is None:
        return "no comparable pair"
    gap = f"{comparison['gap']:+.{digits}f}"
    if comparison.get("p_holm") is None:
        n = comparison["pairs"]
        return f"{gap} ({n} pair{'s' if n != 1 else ''}: untested)"
    beyond = comparison["p_holm"] < ALPHA
    low, high = comparison["ci95"]
    return (
        f"{gap} (p {comparison['p_holm']:.3f}, {'beyond' if beyond else 'within'} noise; "
        f"95% CI [{low:+.{digits}f}, {high:+.{digits}f}])"
    )


def paired_bootstrap(
    systems: dict[Any, list[str]], baseline: list[str], references: list[str]
) -> dict[Any, float]:
    """sacreBLEU's paired bootstrap p-value (BLEU) of each of ``systems`` against ``baseline``, in one test:
    sacreBLEU reseeds the resampling for each system, so each p is what a test of that pair alone gives, and the
    baseline's statistics are computed once."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    test = PairedTest(
        [("baseline", baseline), *((str(index), hyps) for index, hyps in enumerate(systems.values()))],
        {"BLEU": BLEU()},
        [references],
        test_type="bs",
        n_samples=BOOTSTRAP_SAMPLES,
    )
    _, scores = test()
    return {key: float(score.p_value) for key, score in zip(systems, scores["BLEU"][1:])}


def bootstrap_p_values(
    study: Study, by_cell: dict[tuple[str, int], list[dict[str, Any]]], references: list[str]
) -> dict[tuple[str, int], dict[int, float]]:
    """The paired bootstrap p of each run with test hypotheses against its baseline's run of the same seed, by
    (variant, depth), then seed. Pairs by seed (a seed's data order and initialisation move every variant), same
    commit, device and precision (`comparable`), as the paired t-test reads them; the runs that share a baseline
    run are tested together."""
    groups: dict[tuple[str, int, int], dict[str, list[str]]] = defaultdict(dict)  # (baseline, depth, seed)
    base_hypotheses: dict[tuple[str, int, int], list[str]] = {}
    for (variant, depth), runs in by_cell.items():
        base_name = study.baseline_of(variant)
        baseline = {r["seed"]: r for r in by_cell.get((base_name, depth), [])}
        for r in runs:
            base = baseline.get(r["seed"])
            if (
                variant != base_name
                and base
                and comparable(r) == comparable(base)
                and r.get("test_hypotheses")
            ):
                groups[(base_name, depth, r["seed"])][variant] = r["test_hypotheses"]
                base_hypotheses[(base_name, depth, r["seed"])] = base["test_hypotheses"]
    p_values: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    for (base_name, depth, seed), systems in groups.items():
        tested = paired_bootstrap(systems, base_hypotheses[(base_name, depth, seed)], references)
        for variant, p in tested.items():
            p_values[(variant, depth)][seed] = p
    return p_values


def test_references(study: Study, size: str, n: int) -> list[str] | None:
    """The test references of a study whose task sacreBLEU scores (its record's ``scorer``), from the same readers
    ``ode_transformer.train.run`` uses; None for other tasks, whose metrics (M2, ROUGE) are not the BLEU that
    sacreBLEU's paired bootstrap tests."""
    from ode_transformer.train.arguments import DataArguments
    from ode_transformer.train.preparation import load_raw_data
    from ode_transformer.train.tasks import get_task

    flags = study.flags(next(iter(study.variants)), study.depths[0], study.seeds[0], size)
    if get_task(flags["task"]).scorer != "sacrebleu":
        return None
    data_args = DataArguments(
        dataset=flags["dataset"], source_lang=flags.get("source_lang"), target_lang=flags.get("target_lang")
    )
    raw, _ = load_raw_data(data_args, flags["task"])
    references = [text.strip() for text in raw["test"]["target"]]
    return references[:n] if len(references) >= n else None


def lm_test_counts(study: Study, size: str) -> tuple[int, int]:
    """Words and sentences of a language-model study's test split (read as ``ode_transformer.train.run`` reads it)."""
    from ode_transformer.train.arguments import DataArguments
    from ode_transformer.train.preparation import load_raw_data

    flags = study.flags(next(iter(study.variants)), study.depths[0], study.seeds[0], size)
    raw, _ = load_raw_data(DataArguments(dataset=flags["dataset"]), flags["task"])
    texts = raw["test"]["text"]
    return sum(len(text.split()) for text in texts), len(texts)


def add_derived_metrics(study: Study, results: list[dict[str, Any]]) -> None:
    """Fill in the study's derived metrics (``Metric.per_word_of``): a perplexity over words and </s> tokens,
    exp(L / (W + S)), becomes exp(L / W), the same summed loss L per word (W, S: the test split of the results'
    size)."""
    derived = [metric for metric in study.metrics if metric.per_word_of]
    if not derived or not results:
        return
    words, sentences = lm_test_counts(study, results[0]["size"])
    for result in results:
        for metric in derived:
            per_token = result["metrics"][metric.per_word_of]
            result["metrics"][metric.name] = math.exp(math.log(per_token) * (words + sentences) / words)


def runs_by_cell(results: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """The runs of each (variant, depth), in the order given."""
    cells: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for result in results:
        cells[(result["variant"], result["depth"])].append(result)
    return cells


def aggregate(
    study: Study, results: list[dict[str, Any]], references: list[str] | None
) -> list[dict[str, Any]]:
    """One row per (variant, depth) present in ``results``, in the study's order (derived metrics filled in)."""
    add_derived_metrics(study, results)
    by_cell = runs_by_cell(results)
    p_values = bootstrap_p_values(study, by_cell, references) if references else {}
    rows = []
    for depth in study.depths:
        for variant in study.variants:
            runs = sorted(by_cell.get((variant, depth), []), key=lambda r: r["seed"])
            if not runs:
                continue
            base_name = study.baseline_of(variant)
            baseline = {r["seed"]: r for r in by_cell.get((base_name, depth), [])}
            row = {
                "variant": variant,
                "label": study.variants[variant].label,
                "depth": depth,
                "baseline": base_name,
            }
            row["seeds"] = [r["seed"] for r in runs]
            for metric in study.metrics:
                values = [r["metrics"][metric.name] for r in runs]
                mean, std = mean_std(values)
                row[metric.name] = {"values": values, "mean": mean, "std": std}
                if variant != base_name:
                    row[metric.name]["paired"] = paired_comparison(runs, baseline, metric.name)
            row["paper"] = study.paper.get((variant, depth))
            row["paper_gap"] = paper_gap(study, variant, depth)
            row["wall_time_min"] = statistics.fmean(r["wall_time_s"] for r in runs) / 60
            # its wall time misses the earlier attempts
            row["resumed"] = any(r.get("resumed", False) for r in runs)
            row["steps"] = runs[0]["steps"]
            # The last logged training loss (with dropout, as trained): tells slow optimisation from overfitting.
            last_losses = [r["training_curve"][-1]["loss"] for r in runs if r["training_curve"]]
            # None: shorter than a log interval
            row["train_loss"] = statistics.fmean(last_losses) if last_losses else None
            if references and variant != base_name:
                tested = p_values.get((variant, depth), {})
                row["bootstrap_p"] = {seed: tested[seed] for seed in sorted(tested)}
            rows.append(row)
    add_pairwise(study, rows, by_cell)
    for metric in study.metrics:  # Holm over the study's declared tests, metric by metric
        primary = metric == study.metrics[0]
        compared = [row[metric.name]["paired"] for row in rows if "paired" in row[metric.name]]
        if primary:  # the declared tests between rows join the primary metric's family
            compared += [comparison for row in rows for comparison in row.get("pairwise", [])]
        family = study.holm_family(primary)
        for comparison, p_holm in zip(compared, holm([c["p"] for c in compared], family)):
            comparison["p_holm"] = p_holm
            comparison["verdict"] = verdict(comparison, metric.digits)
        for row in rows:
            if "paired" in row[metric.name]:
                row[metric.name]["paired"]["power"] = power_analysis(row[metric.name]["paired"], row, family)
    return rows


def add_pairwise(
    study: Study, rows: list[dict[str, Any]], by_cell: dict[tuple[str, int], list[dict[str, Any]]]
) -> None:
    """Each test the study declares between two rows (``Study.pairwise``), at each depth where both ran: the first
    row's runs paired with the second's as with the baseline (seed, commit, device, precision), primary metric
    only; stored on the first row under ``pairwise`` (Holm-corrected later, with the table's rows)."""
    metric = study.metrics[0].name
    by_key = {(row["variant"], row["depth"]): row for row in rows}
    for variant, other in study.pairwise:
        for depth in study.depths:
            if (variant, depth) not in by_key or (other, depth) not in by_key:
                continue
            runs = sorted(by_cell[(variant, depth)], key=lambda r: r["seed"])
            theirs = {r["seed"]: r for r in by_cell[(other, depth)]}
            comparison = {"variant": other, **paired_comparison(runs, theirs, metric, f"{other}'s")}
            by_key[(variant, depth)].setdefault("pairwise", []).append(comparison)


def pairwise_table(study: Study, rows: list[dict[str, Any]]) -> list[str]:
    """The markdown of :func:`add_pairwise`'s tests (none where the study declares none, or they did not run)."""
    compared = [(row, comparison) for row in rows for comparison in row.get("pairwise", [])]
    if not compared:
        return []
    metric = study.metrics[0].name
    lines = [
        "",
        f"Between rows ({metric}; tests the study declares, paired as above and Holm-corrected together with the "
        "rows of the table):",
        "",
        f"| variant | depth | compared with | {metric} vs it | dropped pairs |",
        "|---|---|---|---|---|",
    ]
    for row, comparison in compared:
        dropped = "; ".join(f"seed {d['seed']}: {d['why']}" for d in comparison["dropped"])
        other = study.variants[comparison["variant"]].label
        lines.append(f"| {row['label']} | {row['depth']} | {other} | {comparison['verdict']} | {dropped} |")
    return [*lines, ""]


def paper_gap(study: Study, variant: str, depth: int) -> float | None:
    """The paper's gap of a variant over its baseline: from the paper's own column where it has both numbers,
    else the gap the study records from the paper's other setting (``Study.paper_gap``)."""
    ours, base = study.paper.get((variant, depth)), study.paper.get((study.baseline_of(variant), depth))
    if ours is not None and base is not None:
        return ours - base
    return study.paper_gap.get(variant)


def power_analysis(comparison: dict[str, Any], row: dict[str, Any], family: int) -> dict[str, Any] | None:
    """What the row's seeds can detect, from its observed sd of the per-seed differences (None for a row that
    was not tested): at alpha 0.05 and at Holm's first step over the ``family`` of declared tests (alpha / family,
    the bar the smallest p must pass), the gap detectable with 80% power at the pairs run, and the seeds needed
    for the paper's gap and for the observed one."""
    if comparison.get("p_holm") is None:
        return None
    sd, n = comparison["sd"], comparison["pairs"]
    alphas = {"alpha": ALPHA, "holm_first_step": ALPHA / family}
    return {
        "holm_first_step_alpha": alphas["holm_first_step"],
        "detectable": {name: detectable_gap(sd, n, alpha) for name, alpha in alphas.items()},
        "seeds_for_paper_gap": None
        if row["paper_gap"] is None
        else {name: seeds_needed(row["paper_gap"], sd, alpha) for name, alpha in alphas.items()},
        "seeds_for_observed_gap": {
            name: seeds_needed(comparison["gap"], sd, alpha) for name, alpha in alphas.items()
        },
    }


def provenance(study: Study, results: list[dict[str, Any]]) -> list[str]:
    """What the runs of one table were made with, printed under it: the code commits, the runs whose flags the
    study has changed since and, where the same tokenizer flags built vocabularies of different sizes (a code
    change), those sizes. Runs on different data files are refused: their numbers do not compare."""
    data = {json.dumps(r["data"]["files"], sort_keys=True) for r in results}
    if len(data) > 1:
        raise ValueError(
            f"the runs in this folder read {len(data)} different versions of the data files (see each result's "
            "`data`); move the runs of the other version elsewhere, or run them again on one version."
        )
    commits = Counter(r["git"]["commit"][:7] + (" (dirty)" if r["git"]["dirty"] else "") for r in results)
    lines = [
        "Code: " + ", ".join(f"commit {commit} ({n} runs)" for commit, n in sorted(commits.items())) + "."
    ]
    changed = defaultdict(list)  # the same changes -> the runs that have them
    for r in results:
        # the model a fine-tuning run started from is its input (--source), not a flag of the study
        if changes := study.flag_changes(r, source=source_template(study, r)):
            changed[describe_changes(changes)].append(run_id(r["variant"], r["depth"], r["seed"]))
    for changes, runs in sorted(changed.items()):
        lines.append(f"Flags the study has changed since {', '.join(runs)} ran: {changes}.")
    asked: dict[tuple, Counter] = defaultdict(Counter)  # the tokenizer the flags asked for -> the sizes built
    for r in results:
        asked[(r["flags"].get("tokenizer_type"), r["flags"].get("vocab_size"))][
            r["config"]["vocab_size"]
        ] += 1
    for (kind, size), built in asked.items():
        if len(built) > 1:
            sizes = ", ".join(f"{n} ({count} runs)" for n, count in sorted(built.items()))
            lines.append(
                f"**The same tokenizer flags ({kind or 'bpe'}, {size}) built different vocabularies**: {sizes}; "
                "their perplexities do not compare."
            )
    return lines


def _cell(stats: dict[str, Any], digits: int) -> str:
    return f"{stats['mean']:.{digits}f}" + (
        f" +- {stats['std']:.{digits}f}" if stats["std"] is not None else ""
    )


def selection(size: str, batch: str | None) -> str:
    """The flags of experiments.run and experiments.report that name one batch: ``--size cpu [--batch h200]``."""
    return f"--size {size}" + ("" if batch is None else f" --batch {batch}")


def source_template(study: Study, result: dict[str, Any]) -> str | None:
    """The ``--source`` a fine-tuning run was given: the model folder it started from, its seed written as
    ``{seed}`` (None for a study that trains from scratch)."""
    if study.source is None:
        return None
    return result["flags"]["model_name_or_path"].replace(f"seed{result['seed']}", "seed{seed}")


def run_options(study: Study, results: list[dict[str, Any]]) -> str:
    """The options of experiments.run, beyond the batch's, that the runs were made with: `` --device cuda`` for
    runs on a GPU, `` --source PATH`` for runs started from models other than the study's own."""
    options = [f"--device {device}" for device in sorted({r["device"]["device"] for r in results} - {"cpu"})]
    options += [
        f"--source {t}" for t in sorted({source_template(study, r) for r in results} - {study.source})
    ]
    return "".join(f" {option}" for option in options)


def markdown(
    study: Study,
    size: str,
    rows: list[dict[str, Any]],
    notes: list[str] = (),
    batch: str | None = None,
    options: str = "",
    mixed: bool = False,
) -> str:
    """The study's table: one line per variant and depth, then ``notes`` (e.g. :func:`provenance`); ``options``:
    the runs' own options of experiments.run (:func:`run_options`); ``mixed``: reported with ``--mixed``."""
    primary = study.metrics[0]
    also = [m for m in study.metrics[1:] if m.name in VERDICT_ALSO]
    head = ["variant", "depth", "seeds", *(m.name for m in study.metrics)]
    head += [f"{m.name} vs baseline" for m in (primary, *also)]
    head += ["paper", "bootstrap p (per seed)"] if any("bootstrap_p" in r for r in rows) else ["paper"]
    head += ["last train loss", "steps", "min/run"]
    lines = [
        f"# {study.name} ({batch_folder(size, batch)})",
        "",
        study.description,
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in rows:
        cells = [row["label"], str(row["depth"]), str(len(row["seeds"]))]
        cells += [_cell(row[m.name], m.digits) for m in study.metrics]
        for metric in (primary, *also):
            paired = row[metric.name].get("paired")
            cells.append(
                paired["verdict"] if paired else "baseline" if row["variant"] == row["baseline"] else ""
            )
        cells.append("" if row["paper"] is None else f"{row['paper']:.2f}")
        if "bootstrap p (per seed)" in head:
            cells.append(signed_bootstrap(row, primary.name))
        minutes = f"{row['wall_time_min']:.1f}" + (" *" if row["resumed"] else "")
        cells += ["" if row["train_loss"] is None else f"{row['train_loss']:.3f}", str(row["steps"]), minutes]
        lines.append("| " + " | ".join(cells) + " |")
    arrow = "lower" if primary.lower_is_better else "higher"
    lines += [
        "",
        f"{primary.name}: {arrow} is better. mean +- sample std over seeds; the gap is to the {study.baseline} block "
        "(under the same factor where variants are BLOCK.FACTOR), the mean over pairs of runs of the same seed, code "
        "commit, device and precision; p: a paired t-test over those seeds, Holm-corrected over the "
        f"{study.holm_family()} tests the study declares (run or not); 'beyond noise': p < {ALPHA}; 95% CI: the "
        "paired t interval of the gap over the same seeds (not "
        "Holm-adjusted, so it can exclude 0 where the Holm p does not)."
        + (
            f" {', '.join(m.name for m in also)}: the same, for that metric (Holm over its own declared tests)."
            if also
            else ""
        )
        + (
            " Bootstrap p: sacreBLEU's paired bootstrap of each seed's pair on the test set, signed by that seed's "
            f"{primary.name} gap (+: the variant scored higher, -: lower)."
            if "bootstrap p (per seed)" in head
            else ""
        ),
        *dropped_pairs(rows, primary.name),
        *power_table(study, rows),
        *pairwise_table(study, rows),
        *reference_table(study, rows),
        f"Produced by `python -m experiments.run {study.name} {selection(size, batch)}{options}` and "
        f"`python -m experiments.report {study.name} {selection(size, batch)}{' --mixed' if mixed else ''}`.",
        *notes,
    ]
    if any(row["resumed"] for row in rows):
        lines.append(
            "min/run *: a run of the row resumed from a checkpoint; its minutes count only the attempt that finished."
        )
    return "\n".join(lines) + "\n"


def signed_bootstrap(row: dict[str, Any], metric: str) -> str:
    """The row's bootstrap p per seed, each signed by its seed's gap: ``+0.010`` a win, ``-0.406`` a loss (a p
    alone reads as a win for a seed that lost)."""
    differences = row[metric].get("paired", {}).get("differences", {})
    cells = []
    for seed, p in row.get("bootstrap_p", {}).items():
        gap = differences[seed]
        cells.append(f"{'+' if gap > 0 else '-' if gap < 0 else ''}{p:.3f}")
    return " / ".join(cells)


def _seeds(needed: dict[str, int | None]) -> str:
    return " / ".join(f"> {MAX_SEEDS}" if n is None else str(n) for n in needed.values())


def power_table(study: Study, rows: list[dict[str, Any]]) -> list[str]:
    """The power lines of the tested rows (:func:`power_analysis`), as a table under the study's; none where no
    row was tested."""
    metric = study.metrics[0]
    tested = [row for row in rows if row[metric.name].get("paired", {}).get("power")]
    if not tested:
        return []
    holm_alpha = tested[0][metric.name]["paired"]["power"]["holm_first_step_alpha"]
    family = round(ALPHA / holm_alpha)
    digits = metric.digits
    lines = [
        "",
        f"Power of the paired t-test ({metric.name}), from each row's observed sd of the per-seed differences: the gap "
        f"it detects with {POWER:.0%} power at the seeds run, and the seeds it needs for the paper's gap and for the "
        f"observed one; each at alpha {ALPHA} / at Holm's first step over the study's {family} declared "
        f"test{'s' if family != 1 else ''} (alpha {holm_alpha:.4f}), {len(tested)} of them tested here.",
        "",
        "| variant | depth | pairs | sd of differences | detectable gap | paper's gap | seeds for it | observed gap "
        "| seeds for it |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in tested:
        paired = row[metric.name]["paired"]
        power = paired["power"]
        detectable = " / ".join(f"{gap:.{digits}f}" for gap in power["detectable"].values())
        paper = "" if row["paper_gap"] is None else f"{row['paper_gap']:+.{digits}f}"
        paper_seeds = "" if power["seeds_for_paper_gap"] is None else _seeds(power["seeds_for_paper_gap"])
        lines.append(
            f"| {row['label']} | {row['depth']} | {paired['pairs']} | {paired['sd']:.{digits}f} | {detectable} | "
            f"{paper} | {paper_seeds} | {paired['gap']:+.{digits}f} | {_seeds(power['seeds_for_observed_gap'])} |"
        )
    return [*lines, ""]


def dropped_pairs(rows: list[dict[str, Any]], metric: str) -> list[str]:
    """A line for every run left out of its row's comparison, and why."""
    lines = []
    for row in rows:
        seeds_by_reason: dict[str, list[int]] = defaultdict(list)
        for pair in row[metric].get("paired", {}).get("dropped", []):
            seeds_by_reason[pair["why"]].append(pair["seed"])
        for why, seeds in seeds_by_reason.items():
            which = f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
            lines.append(
                f"Not paired: {row['label']} (depth {row['depth']}), {which}, with the baseline: {why}."
            )
    return lines


def plot(study: Study, rows: list[dict[str, Any]], results: list[dict[str, Any]], path: Path) -> None:
    """Bars (mean +- std, paper as markers) and, where runs evaluated every epoch, validation curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [r for r in results if len(r.get("validation_curve") or []) > 1]
    fig, axes = plt.subplots(1, 2 if curves else 1, figsize=(13 if curves else 7, 4.5), squeeze=False)
    bars = axes[0][0]
    primary = study.metrics[0].name
    labels = [f"{r['variant']} ({r['depth']})" for r in rows]
    bars.barh(
        labels,
        [r[primary]["mean"] for r in rows],
        xerr=[r[primary]["std"] or 0 for r in rows],
        color="tab:blue",
        label="ours",
    )
    paper = [(i, r["paper"]) for i, r in enumerate(rows) if r["paper"] is not None]
    if paper:
        bars.scatter(
            [p for _, p in paper], [i for i, _ in paper], color="tab:red", marker="x", zorder=3, label="paper"
        )
    values = [r[primary]["mean"] for r in rows] + [p for _, p in paper]
    low, high = min(values), max(values)
    if high > low:  # zoom on the differences
        bars.set_xlim(low - 0.5 * (high - low), high + 0.2 * (high - low))
    bars.invert_yaxis()
    bars.set_xlabel(primary)
    bars.legend()
    if curves:
        ax = axes[0][1]
        for result in curves:
            points = result["validation_curve"]
            ax.plot(
                [p["epoch"] for p in points],
                [math.exp(p["eval_loss"]) for p in points],
                marker=".",
                label=f"{result['variant']} ({result['depth']}) s{result['seed']}",
            )
        ax.set_xlabel("epoch")
        ax.set_ylabel("validation perplexity")
        ax.set_yscale("log")
        ax.legend(fontsize=6, ncol=2)
    fig.suptitle(f"{study.name}: {study.description}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(
    study: Study, size: str, results_dir: Path = RESULTS, batch: str | None = None, mixed: bool = False
) -> list[dict[str, Any]]:
    """Write README.md, summary.json and summary.png for one study and size (and batch); returns the rows. A folder
    that mixes commits, devices or precisions is refused (:func:`experiments.records.load_results`) unless
    ``mixed``; then the table says what it mixes.

    Raises:
        RecordError: a damaged record, or a mixed folder without ``mixed`` (the files named).
    """
    folder = results_dir / study.name / batch_folder(size, batch)
    results = load_results(folder, mixed)
    if not results:
        raise FileNotFoundError(
            f"no results in {folder}: run `python -m experiments.run {study.name} {selection(size, batch)}` first"
        )
    seq2seq = any(r.get("test_hypotheses") for r in results)
    references = test_references(study, size, len(results[0]["test_hypotheses"])) if seq2seq else None
    rows = aggregate(study, results, references)
    if study.reference is not None:
        reference = load_results(results_dir / study.reference[0] / batch_folder(size, batch), mixed)
        compare_with_reference(study, rows, results, reference)
    notes = provenance(study, results)
    named = [(path.name, result) for path, result in zip(record_files(folder), results)]
    if mixed and (what := mixing(named)):
        notes.append(
            f"**This folder mixes runs of {what}** (reported with --mixed): only runs sharing all three pair."
        )
    (folder / "README.md").write_text(
        markdown(study, size, rows, notes, batch, run_options(study, results), mixed),
        encoding="utf-8",
    )
    (folder / "summary.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    plot(study, rows, results, folder / "summary.png")
    return rows


def first_table(markdown_text: str) -> str:
    """The first Markdown table (its ``|`` lines) of ``markdown_text``."""
    lines = markdown_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def gate_table(rows_by_run: dict[str, list[dict[str, Any]]]) -> str:
    """One line per gate of each run (as `experiments.block_diagnostic --json` records them): the mean weight g of
    the first stage, the shares of tokens where the gate is saturated, the size of its logits and what drives
    it (the norms of what the gate reads and of the weights that read each stage)."""
    lines = [
        "| run | block | mean g | g < 0.01 | g > 0.99 | mean abs z (p50 / p99) | gate input norms (per stage) | "
        "weight norms (per stage) | bias |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run, rows in rows_by_run.items():
        for row in (row for row in rows if "logit_abs_mean" in row):
            p50, p99 = row["logit_abs_percentiles"]["p50"], row["logit_abs_percentiles"]["p99"]
            lines.append(
                f"| {run} | {row['block']} | {row['gamma'][0]:.3f} | {row['g_below']:.1%} | {row['g_above']:.1%} | "
                f"{row['logit_abs_mean']:.2f} ({p50:.2f} / {p99:.2f}) | "
                f"{' / '.join(f'{x:.1f}' for x in row['gate_input_norms'])} | "
                f"{' / '.join(f'{x:.2f}' for x in row['gate_weight_norms'])} | "
                f"{' / '.join(f'{x:+.3f}' for x in row['gate_bias'])} |"
            )
    return "\n".join(lines)


def study_document(template: Path = DOCS_TEMPLATE, root: Path = RESULTS.parent) -> str:
    """``results/README.md``: the template's prose with each table marker replaced by that study's table, each
    gate marker by :func:`gate_table` of its file."""
    header = (
        f"<!-- Generated by `python -m experiments.report --write-docs` from {template.relative_to(root)} "
    )
    header += "and the results' tables and gate statistics: edit those, not this file. -->\n\n"
    body = template.read_text(encoding="utf-8")
    body = GATE_MARKER.sub(
        lambda match: gate_table(json.loads((root / match.group(1)).read_text(encoding="utf-8"))), body
    )
    from experiments.claims import fill  # claims reads this module's tables: imported where it is used

    return header + fill(
        TABLE_MARKER.sub(
            lambda match: first_table((root / match.group(1) / "README.md").read_text(encoding="utf-8")), body
        )
    )


@refuse_bad_records("python -m experiments.report")  # a damaged record, a mixed batch: one line
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.report", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("study", nargs="?", choices=sorted(STUDIES))
    parser.add_argument("--size", default="cpu")
    parser.add_argument(
        "--batch",
        type=batch_label,
        metavar="LABEL",
        help="a second batch of the size (experiments.run --batch)",
    )
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--mixed",
        action="store_true",
        help="report a folder whose runs mix commits, devices or precisions (refused without): only runs that share "
        "all three pair, and the table says what it mixes",
    )
    parser.add_argument(
        "--write-docs", action="store_true", help="write results/README.md (the study document)"
    )
    args = parser.parse_args(argv)
    if args.write_docs:
        from experiments.claims import filled_documents

        (RESULTS / "README.md").write_text(study_document(), encoding="utf-8")
        print(RESULTS / "README.md")
        for path, text in filled_documents().items():
            if path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
                print(path)
        return
    if args.study is None:
        parser.error("give a STUDY, or --write-docs")
    report(STUDIES[args.study], args.size, args.results, args.batch, args.mixed)
    folder = args.results / args.study / batch_folder(args.size, args.batch)
    print((folder / "README.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
