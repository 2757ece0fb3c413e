"""The statistics of the studies' verdicts: the paired t-test of a variant's runs against the baseline's of the
same seeds, its confidence interval, its power, the seeds a gap needs, and Holm's correction across the tests of
a table. ``experiments.report`` writes them into the tables; ``experiments.claims``, ``experiments.verdict`` and
``experiments.depth_gate`` read the same ones.
"""

from __future__ import annotations

import math
import statistics

ALPHA = 0.05  # a Holm-corrected paired p below this is "beyond noise"
POWER = 0.8  # the power a study's seeds are sized for
MAX_SEEDS = 1000  # seeds_needed stops here: a gap that needs more is, for these studies, not measurable


def paired_t_test(ours: list[float], baseline: list[float]) -> float | None:
    """Two-sided p-value of a paired t-test of ``ours - baseline`` over seeds (``scipy.stats.ttest_rel``); None
    below two pairs, or when every pair differs by the same amount (no variance to test against)."""
    from scipy.stats import ttest_rel

    differences = [a - b for a, b in zip(ours, baseline)]
    if len(differences) < 2 or max(differences) - min(differences) <= 1e-9 * max(1.0, abs(differences[0])):
        return None
    p_value = float(ttest_rel(ours, baseline).pvalue)
    return None if math.isnan(p_value) else p_value


def confidence_interval(differences: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """The paired t interval of the mean difference: mean +- t(1 - (1 - level) / 2, n - 1) * sd / sqrt(n); None
    below two differences."""
    from scipy.stats import t

    if len(differences) < 2:
        return None
    mean, sd = statistics.fmean(differences), statistics.stdev(differences)
    half = float(t.ppf(1 - (1 - level) / 2, len(differences) - 1)) * sd / math.sqrt(len(differences))
    return mean - half, mean + half


def t_test_power(gap: float, sd: float, n: int, alpha: float, df: int | None = None) -> float:
    """Power of a two-sided paired t-test over ``n`` pairs whose differences have standard deviation ``sd``, for a
    true mean difference ``gap``: exact, from the noncentral t distribution (scipy.stats.nct), df n - 1 (or ``df``:
    n - strata for a test stratified by device), noncentrality gap * sqrt(n) / sd."""
    from scipy.stats import nct, t

    df = n - 1 if df is None else df
    critical = float(t.ppf(1 - alpha / 2, df))
    noncentrality = abs(gap) * math.sqrt(n) / sd
    wrong_side = float(nct.cdf(-critical, df, noncentrality))
    # scipy's nct returns NaN for this far tail once it is below ~1e-20 (a large noncentrality): it is then 0
    return float(nct.sf(critical, df, noncentrality)) + (0.0 if math.isnan(wrong_side) else wrong_side)


def detectable_gap(sd: float, n: int, alpha: float, power: float = POWER) -> float:
    """The smallest gap the paired t-test over ``n`` pairs detects with ``power`` at ``alpha`` (two-sided)."""
    from scipy.optimize import brentq

    high = sd
    while t_test_power(high, sd, n, alpha) < power:  # power grows with the gap: bracket it, then solve
        high *= 2
    return float(brentq(lambda gap: t_test_power(gap, sd, n, alpha) - power, 0.0, high, xtol=1e-9 * sd))


def seeds_needed(gap: float, sd: float, alpha: float, power: float = POWER) -> int | None:
    """The fewest pairs (seeds) with which the paired t-test detects ``gap`` with ``power`` at ``alpha``, given
    differences of standard deviation ``sd``; None when it takes more than MAX_SEEDS."""
    if gap == 0 or t_test_power(gap, sd, MAX_SEEDS, alpha) < power:
        return None
    low, high = 1, MAX_SEEDS  # power grows with n: bisect for the first n that reaches it (low never does)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if t_test_power(gap, sd, middle, alpha) >= power else (middle, high)
    return high


def holm(p_values: list[float | None], family: int | None = None) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values, in the order given (None stays None): the i-th smallest p-value is
    multiplied by m - i + 1 (i from 1), then made non-decreasing, capped at 1. ``m`` is ``family``, the number of
    tests declared before any was read, where given (a declared test that has not run yet still counts, so that
    reading a table early never lowers its bar), else the number of p-values tested."""
    tested = sorted((p, index) for index, p in enumerate(p_values) if p is not None)
    m = len(tested) if family is None else family
    if m < len(tested):
        raise ValueError(f"{len(tested)} tests read from a declared family of {family}")
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(tested):
        running = max(running, min(1.0, p * (m - rank)))
        adjusted[index] = running
    return adjusted
