"""Evaluation metrics used in the ODE Transformer paper (Li et al., ACL 2022).

* Machine translation: SacreBLEU (13a by default, with its signature), chrF, and the
  "tokenized BLEU with compound splitting" that the paper reports for WMT En-De
  (:func:`tokenized_bleu`).
* Summarization (CNN/DailyMail): ROUGE-1/2/L/Lsum F1 via the ``rouge_score`` package.
* Grammatical error correction: the MaxMatch (M2) scorer of Dahlmeier & Ng (2012)
  (:func:`m2_score`, written from the paper's description, not copied from the official
  scorer) and the JFLEG GLEU (:func:`gleu_score`).
* Language modelling: :func:`perplexity` from a mean negative log-likelihood.

All BLEU-like scores are on a 0-100 scale; M2 precision/recall/F are in [0, 1] as printed
by the official m2scorer.
"""

from __future__ import annotations

import functools
import math
import random
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from sacrebleu.metrics import BLEU, CHRF

# rouge_score (which imports nltk) and sacremoses are imported by the functions that score with them, so that
# importing this module, as every run does, costs neither: a run that needs ROUGE imports it at its start
# (`Task.scoring_packages`).
if TYPE_CHECKING:
    from sacremoses import MosesTokenizer

__all__ = [
    "GoldEdit",
    "ROUGE_TYPES",
    "M2Sentence",
    "chrf_score",
    "empty_hypotheses_warning",
    "exact_match",
    "gleu_score",
    "m2_score",
    "parse_m2",
    "perplexity",
    "rouge_scores",
    "sacrebleu_score",
    "split_compounds",
    "split_sentences",
    "tokenized_bleu",
]

References = Sequence[str] | Sequence[Sequence[str]]


def _as_streams(refs: References) -> list[list[str]]:
    """Normalise references to sacrebleu's layout: a list of streams, each aligned with the hypotheses.

    A flat list of strings is taken as a single reference stream.
    """
    if refs and isinstance(refs[0], str):
        return [list(refs)]
    return [list(stream) for stream in refs]


# ----------------------------------------------------------------------------------------------
# Machine translation
# ----------------------------------------------------------------------------------------------


def sacrebleu_score(
    hyps: Sequence[str], refs_list: References, tokenize: str = "13a", lowercase: bool = False
) -> dict:
    """Corpus SacreBLEU with its signature.

    Args:
        hyps: detokenized system outputs, one per segment.
        refs_list: reference streams (``[[ref_a_1, ref_a_2, ...], [ref_b_1, ...]]``) or one flat
            list of references.
        tokenize: sacrebleu tokenizer (``13a``, ``intl``, ``zh``, ``none``, ...).
        lowercase: case-insensitive BLEU.

    Returns:
        ``score`` (0-100), ``signature`` (e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|
        version:2.6.0``), n-gram ``precisions``, brevity penalty ``bp``, ``sys_len``, ``ref_len``.
    """
    metric = BLEU(tokenize=tokenize, lowercase=lowercase)
    result = metric.corpus_score(list(hyps), _as_streams(refs_list))
    return {
        "score": result.score,
        "signature": metric.get_signature().format(),
        "precisions": list(result.precisions),
        "bp": result.bp,
        "sys_len": result.sys_len,
        "ref_len": result.ref_len,
    }


def chrf_score(hyps: Sequence[str], refs_list: References, word_order: int = 0) -> dict:
    """Corpus chrF (``word_order=0``, sacrebleu's default) or chrF++ (``word_order=2``), with signature."""
    metric = CHRF(word_order=word_order)
    result = metric.corpus_score(list(hyps), _as_streams(refs_list))
    return {"score": result.score, "signature": metric.get_signature().format()}


_COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(text: str) -> str:
    """Put hyphenated compounds in "ATAT" format: ``rich-text`` -> ``rich ##AT##-##AT## text``.

    Same regular expression as ``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`` in
    tensor2tensor's ``get_ende_bleu.sh`` / fairseq's ``compound_split_bleu.sh``, including its
    non-overlapping-match quirk: ``a-b-c`` becomes ``a ##AT##-##AT## b-c``.
    """
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


@functools.lru_cache(maxsize=8)
def _moses(lang: str) -> MosesTokenizer:
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang=lang)


def _pretokenize(text: str, tokenize: str, lang: str) -> str:
    if tokenize == "moses":
        return _moses(lang).tokenize(text, return_str=True)
    if tokenize == "13a":
        return " ".join(BLEU(tokenize="13a").tokenizer(text).split())
    if tokenize == "none":
        return " ".join(text.split())
    raise ValueError(f"tokenize must be 'moses', '13a' or 'none', got {tokenize!r}")


def tokenized_bleu(
    hyps: Sequence[str],
    refs: References,
    compound_split: bool = True,
    tokenize: str = "moses",
    lang: str = "de",
) -> dict:
    """Tokenized BLEU as reported for WMT En-De by the paper (the fairseq / tensor2tensor convention).

    Convention, step by step (``get_ende_bleu.sh``):

    1. hypotheses and references are tokenized with the Moses tokenizer
       (``tokenizer.perl -l de``, default options, i.e. no ``-a`` hyphen splitting; here
       sacremoses). Use ``tokenize="none"`` for text that is already tokenized, e.g. the
       BPE-merged output of a model trained on Moses-tokenized data (fairseq's
       ``compound_split_bleu.sh``), or ``"13a"`` for sacrebleu's 13a tokenizer;
    2. if ``compound_split``, hyphenated compounds are split with :func:`split_compounds`;
    3. case-sensitive corpus BLEU-4 on whitespace tokens with no smoothing and the closest
       reference length for the brevity penalty, which is what ``multi-bleu.perl`` computes
       (sacrebleu with ``tokenize="none"``, ``smooth_method="none"``).

    The ``replace-unicode-punctuation.perl`` step of ``get_ende_bleu.sh`` is not applied.

    Returns:
        ``score`` (0-100), ``precisions``, ``bp``, ``sys_len``, ``ref_len`` and ``signature``,
        a description of the convention (this is not a sacrebleu signature).
    """

    def prepare(text: str) -> str:
        text = _pretokenize(text, tokenize, lang)
        return split_compounds(text) if compound_split else text

    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    streams = [[prepare(ref) for ref in stream] for stream in _as_streams(refs)]
    result = metric.corpus_score([prepare(hyp) for hyp in hyps], streams)
    tok = f"moses-{lang}" if tokenize == "moses" else tokenize
    return {
        "score": result.score,
        "precisions": list(result.precisions),
        "bp": result.bp,
        "sys_len": result.sys_len,
        "ref_len": result.ref_len,
        "signature": f"tokenized-bleu|nrefs:{len(streams)}|tok:{tok}|compound-split:"
        f"{'atat' if compound_split else 'no'}|case:mixed|smooth:none",
    }


# ----------------------------------------------------------------------------------------------
# Summarization
# ----------------------------------------------------------------------------------------------

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_sentences(text: str) -> str:
    """One sentence per line, as ROUGE-Lsum expects.

    Text that already contains newlines is returned as is; otherwise it is split after ``.``,
    ``!`` or ``?`` followed by whitespace (a light stand-in for ``nltk.sent_tokenize``, whose
    punkt model cannot be downloaded at run time here).
    """
    if "\n" in text:
        return text
    return "\n".join(_SENTENCE_END.split(text.strip()))


def rouge_scores(
    preds: Sequence[str], refs: Sequence[str], use_stemmer: bool = True, sentence_split: bool = True
) -> dict[str, float]:
    """Mean ROUGE-1/2/L/Lsum F1 (x 100) over the pairs, computed by ``rouge_score``.

    Porter stemming is on by default, as in the standard CNN/DailyMail setup. ROUGE-Lsum
    (summary-level LCS) treats newlines as sentence boundaries; with ``sentence_split`` the
    texts go through :func:`split_sentences` first (ROUGE-1/2/L ignore newlines either way).
    """
    from rouge_score import rouge_scorer

    if len(preds) != len(refs):
        raise ValueError(f"{len(preds)} predictions but {len(refs)} references")
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=use_stemmer)
    prepare = split_sentences if sentence_split else str
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for pred, ref in zip(preds, refs):
        scores = scorer.score(prepare(ref), prepare(pred))
        for key in ROUGE_TYPES:
            totals[key] += scores[key].fmeasure
    return {key: 100.0 * total / max(len(preds), 1) for key, total in totals.items()}


# ----------------------------------------------------------------------------------------------
# Grammatical error correction: M2 files and the MaxMatch scorer
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GoldEdit:
    """One gold edit: replace source tokens ``[start, end)`` by one of ``corrections``.

    Each correction is a space-joined token string; ``""`` means deletion (``-NONE-`` in M2).
    """

    start: int
    end: int
    corrections: tuple[str, ...]


@dataclass
class M2Sentence:
    """A source sentence (tokens) with the gold edits of each annotator.

    An annotator with an empty edit list (``noop`` annotation, or no ``A`` line at all, which is
    read as annotator 0 with no edits) says the sentence needs no correction.
    """

    source: list[str]
    annotators: dict[int, list[GoldEdit]] = field(default_factory=dict)


def _parse_edit(line: str) -> tuple[int, GoldEdit | None]:
    """Parse ``A start end|||type|||corr[||alt...]|||REQUIRED|||-NONE-|||annotator``."""
    fields = line[2:].split("|||")
    start, end = (int(x) for x in fields[0].split())
    annotator = int(fields[5]) if len(fields) > 5 else 0
    if fields[1] == "noop" or start < 0:
        return annotator, None
    corrections = tuple("" if c.strip() == "-NONE-" else " ".join(c.split()) for c in fields[2].split("||"))
    return annotator, GoldEdit(start, end, corrections)


def parse_m2(lines: Iterable[str], source: str = "M2 text") -> list[M2Sentence]:
    """Parse M2 text (``S`` line followed by ``A`` lines, blocks separated by blank lines).

    Raises:
        ValueError: a line that is neither blank nor an ``S``/``A`` line, or an edit before any sentence
            (``source`` and the line number named), so that a plain text file is never read as 0 sentences.
    """
    sentences: list[M2Sentence] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip("\n")
        if line == "S" or line.startswith("S "):
            sentences.append(M2Sentence(line[2:].split()))
        elif line.startswith("A ") and sentences:
            annotator, edit = _parse_edit(line)
            edits = sentences[-1].annotators.setdefault(annotator, [])
            if edit is not None:
                edits.append(edit)
        elif line.strip():
            raise ValueError(
                f"{source}, line {number}: {line[:40]!r} is not M2 (an 'S sentence' line, then its 'A ...' edit "
                "lines); give the gold M2 file of the test set"
            )
    for sentence in sentences:
        sentence.annotators = dict(sorted(sentence.annotators.items())) or {0: []}
    return sentences


Node = tuple[int, int]  # (source position, hypothesis position)
_NOOP, _EDIT = "noop", "edit"


@dataclass(frozen=True)
class _Lattice:
    """Edit lattice: every arc lying on some minimum-cost Levenshtein alignment of source and
    hypothesis tokens, for substitution cost 1 and for substitution cost 2 (union of both, as in
    Dahlmeier & Ng 2012). Arcs are ``noop`` (equal tokens) or ``edit`` (sub, del or ins)."""

    nodes: list[Node]  # topologically sorted
    succ: dict[Node, list[tuple[Node, str]]]


def _forward_costs(diag: np.ndarray) -> np.ndarray:
    """Levenshtein DP table ``(n+1, m+1)`` for insertion/deletion cost 1 and diagonal costs
    ``diag`` ``(n, m)``; each row is vectorised: ``f[i, j] = min_k<=j (g[k] + j - k)``."""
    n, m = diag.shape
    steps = np.arange(m + 1)
    table = np.empty((n + 1, m + 1), dtype=np.int64)
    table[0] = steps
    for i in range(1, n + 1):
        above = table[i - 1] + 1
        above[1:] = np.minimum(above[1:], table[i - 1, :-1] + diag[i - 1])
        table[i] = np.minimum.accumulate(above - steps) + steps
    return table


def _optimal_arcs(equal: np.ndarray, sub_cost: int) -> set[tuple[Node, Node, str]]:
    """Arcs ``(u, v, kind)`` on a minimum-cost alignment: forward(u) + cost + backward(v) == total."""
    diag = np.where(equal, 0, sub_cost)
    fwd = _forward_costs(diag)
    bwd = _forward_costs(diag[::-1, ::-1])[::-1, ::-1]
    total = fwd[-1, -1]
    arcs = set()
    for i, j in np.argwhere(fwd[:-1, :-1] + diag + bwd[1:, 1:] == total).tolist():
        arcs.add(((i, j), (i + 1, j + 1), _NOOP if equal[i, j] else _EDIT))
    for i, j in np.argwhere(fwd[:-1, :] + 1 + bwd[1:, :] == total).tolist():
        arcs.add(((i, j), (i + 1, j), _EDIT))
    for i, j in np.argwhere(fwd[:, :-1] + 1 + bwd[:, 1:] == total).tolist():
        arcs.add(((i, j), (i, j + 1), _EDIT))
    return arcs


def _build_lattice(src: Sequence[str], hyp: Sequence[str]) -> _Lattice:
    vocab: dict[str, int] = {}
    src_ids = np.array([vocab.setdefault(t, len(vocab)) for t in src], dtype=np.int64)
    hyp_ids = np.array([vocab.setdefault(t, len(vocab)) for t in hyp], dtype=np.int64)
    equal = src_ids[:, None] == hyp_ids[None, :]
    succ: dict[Node, list[tuple[Node, str]]] = {(0, 0): []}
    for u, v, kind in sorted(_optimal_arcs(equal, 1) | _optimal_arcs(equal, 2)):
        succ.setdefault(u, []).append((v, kind))
        succ.setdefault(v, [])
    return _Lattice(sorted(succ), succ)


def _min_unchanged(lattice: _Lattice, u: Node, v: Node) -> float:
    """Fewest ``noop`` arcs on a lattice path from ``u`` to ``v`` (inf if none)."""
    best = {u: 0}
    for node in lattice.nodes:
        if node not in best or node[0] > v[0] or node[1] > v[1]:
            continue
        for nxt, kind in lattice.succ[node]:
            cost = best[node] + (kind == _NOOP)
            if cost < best.get(nxt, math.inf):
                best[nxt] = cost
    return best.get(v, math.inf)


def _gold_arcs(
    lattice: _Lattice, src: Sequence[str], hyp: Sequence[str], gold: Sequence[GoldEdit], max_unchanged: int
) -> dict[Node, set[Node]]:
    """Lattice shortcuts ``u -> v`` whose (merged) edit equals a gold edit: same source span,
    hypothesis tokens equal to one of the corrections, at most ``max_unchanged`` unchanged
    tokens inside."""
    arcs: dict[Node, set[Node]] = {}
    for edit in gold:
        for correction in edit.corrections:
            tokens = correction.split()
            if tokens == list(src[edit.start : edit.end]):
                continue  # an identity "edit" (e.g. BEA-2019 UNK) cannot be proposed
            for u in lattice.nodes:
                v = (edit.end, u[1] + len(tokens))
                if (
                    u[0] == edit.start
                    and v in lattice.succ
                    and list(hyp[u[1] : v[1]]) == tokens
                    and _min_unchanged(lattice, u, v) <= max_unchanged
                ):
                    arcs.setdefault(u, set()).add(v)
    return arcs


# DP cost, compared lexicographically: (-gold matches, base arcs outside gold edits,
# non-gold edits, unchanged tokens absorbed into non-gold edits). A DP state is a lattice node
# plus _CLOSED (between edits) or the number of unchanged tokens absorbed by the open edit.
_Cost = tuple[int, int, int, int]
_State = tuple[Node, int]
_Edit = tuple[int, int, str]  # (source start, source end, correction)
_CLOSED = -1


def _best_edits(
    lattice: _Lattice, src: Sequence[str], hyp: Sequence[str], gold: Sequence[GoldEdit], max_unchanged: int
) -> list[_Edit]:
    """The hypothesis edit sequence that maximises the gold matches (MaxMatch).

    Shortest path over the lattice where a path is cut into edits: a gold shortcut arc is one
    edit; other arcs are grouped into merged edits that start and end with a changed arc and
    absorb at most ``max_unchanged`` unchanged tokens. Ties between equally matching paths
    prefer fewer aligned-arc steps (substitutions over delete+insert), then fewer edits (so
    adjacent non-gold changes are merged, as the official scorer does), then fewer absorbed
    unchanged tokens. Returns ``(start, end, correction)`` tuples.
    """
    gold_arcs = _gold_arcs(lattice, src, hyp, gold, max_unchanged)
    best: dict[_State, _Cost] = {((0, 0), _CLOSED): (0, 0, 0, 0)}
    back: dict[_State, tuple[_State, str]] = {}

    def relax(state: _State, cost: _Cost, prev: _State, label: str) -> None:
        if cost < best.get(state, (math.inf,)):
            best[state] = cost
            back[state] = (prev, label)

    for u in lattice.nodes:
        for k in [_CLOSED, *range(max_unchanged + 1)]:
            if (u, k) not in best:
                continue
            m, arcs, n_edits, absorbed = best[(u, k)]
            for v in gold_arcs.get(u, ()) if k == _CLOSED else ():
                relax((v, _CLOSED), (m - 1, arcs, n_edits, absorbed), (u, k), "gold")
            for v, kind in lattice.succ[u]:
                if kind == _NOOP and k == _CLOSED:
                    relax((v, _CLOSED), (m, arcs + 1, n_edits, absorbed), (u, k), "skip")
                elif kind == _NOOP and k < max_unchanged:
                    relax((v, k + 1), (m, arcs + 1, n_edits, absorbed + 1), (u, k), "absorb")
                elif kind == _EDIT and k == _CLOSED:
                    cost = (m, arcs + 1, n_edits + 1, absorbed)
                    relax((v, 0), cost, (u, k), "begin")
                    relax((v, _CLOSED), cost, (u, k), "single")
                elif kind == _EDIT:
                    cost = (m, arcs + 1, n_edits, absorbed)
                    relax((v, k), cost, (u, k), "extend")
                    relax((v, _CLOSED), cost, (u, k), "end")
    return _trace_edits(back, lattice.nodes[-1], hyp)


def _trace_edits(back: dict[_State, tuple[_State, str]], end: Node, hyp: Sequence[str]) -> list[_Edit]:
    """Walk the back-pointers from the final closed state and cut the path into edits."""

    def edit(a: Node, b: Node) -> _Edit:
        return a[0], b[0], " ".join(hyp[a[1] : b[1]])

    edits: list[_Edit] = []
    state: _State = (end, _CLOSED)
    edit_end = end
    while state in back:
        prev, label = back[state]
        if label in ("gold", "single"):
            edits.append(edit(prev[0], state[0]))
        elif label == "end":
            edit_end = state[0]
        elif label == "begin":
            edits.append(edit(prev[0], edit_end))
        state = prev
    return edits[::-1]


def _count_matches(edits: Sequence[_Edit], gold: Sequence[GoldEdit]) -> int:
    """Hypothesis edits equal to a gold edit (same span, correction among the alternatives);
    each gold edit is matched at most once."""
    unused = list(gold)
    correct = 0
    for start, end, correction in edits:
        for g in unused:
            if (g.start, g.end) == (start, end) and correction in g.corrections:
                unused.remove(g)
                correct += 1
                break
    return correct


def _f_beta_counts(correct: float, proposed: float, gold: float, beta: float) -> float:
    """F_beta from counts; 0/0 gives 1.0 when nothing is correct, as in the official scorer."""
    denominator = beta * beta * gold + proposed
    if denominator == 0:
        return 1.0 if correct == 0 else 0.0
    return (1 + beta * beta) * correct / denominator


def _lower_sentence(sentence: M2Sentence) -> M2Sentence:
    return M2Sentence(
        [t.lower() for t in sentence.source],
        {
            a: [GoldEdit(e.start, e.end, tuple(c.lower() for c in e.corrections)) for e in edits]
            for a, edits in sentence.annotators.items()
        },
    )


def m2_score(
    hyps: Sequence[str],
    sentences: Sequence[M2Sentence],
    beta: float = 0.5,
    max_unchanged_words: int = 2,
    ignore_case: bool = False,
) -> dict[str, float]:
    """Corpus-level MaxMatch (M2) precision, recall and F_beta (Dahlmeier & Ng, 2012).

    For each sentence and each annotator the hypothesis edits are extracted from the edit
    lattice (see :func:`_best_edits`) so that they match as many of that annotator's gold edits
    as possible; the annotator kept for the sentence is the one maximising the corpus F_beta of
    the counts accumulated so far plus this sentence's (ties: more correct edits, then smaller
    ``proposed + beta^2 * gold``, then the lowest annotator id), as the official scorer does.
    Counts of correct, proposed and gold edits are summed over the corpus, then
    ``P = correct / proposed`` and ``R = correct / gold``.

    Conventions (all those of the official m2scorer):

    * no proposed edits gives ``P = 1.0`` (0/0), no gold edits gives ``R = 1.0``, and
      ``F = (1 + b^2) P R / (b^2 P + R)`` or 0.0 when that is 0/0. So a system that copies the
      source gets ``P = 1.0, R = 0, F = 0`` on a corpus with gold edits. We keep this for
      comparability with published numbers, although P is then undefined rather than perfect.
    * every gold edit counts, including overlapping alternatives of one annotator (only one of
      them can be matched) and identity "edits" such as BEA-2019 ``UNK`` (never matchable).
    * ``ignore_case`` lower-cases source, hypothesis and corrections, so case-only changes are
      neither proposed nor matchable; case-only gold edits still count as gold (the official
      ``--ignore_whitespace_casing`` behaves the same way).

    Hypotheses are whitespace-tokenized, like the M2 source.
    """
    if len(hyps) != len(sentences):
        raise ValueError(f"{len(hyps)} hypotheses but {len(sentences)} M2 sentences")
    correct = proposed = gold_total = 0
    for hyp_text, sentence in zip(hyps, sentences):
        hyp = hyp_text.lower().split() if ignore_case else hyp_text.split()
        sentence = _lower_sentence(sentence) if ignore_case else sentence
        lattice = _build_lattice(sentence.source, hyp)
        candidates = []
        for gold in sentence.annotators.values():
            edits = _best_edits(lattice, sentence.source, hyp, gold, max_unchanged_words)
            counts = (_count_matches(edits, gold), len(edits), len(gold))
            c, p, g = correct + counts[0], proposed + counts[1], gold_total + counts[2]
            candidates.append(((_f_beta_counts(c, p, g, beta), c, -(p + beta * beta * g)), counts))
        best = max(candidates, key=lambda item: item[0])[1]
        correct, proposed, gold_total = correct + best[0], proposed + best[1], gold_total + best[2]
    precision = correct / proposed if proposed else 1.0
    recall = correct / gold_total if gold_total else 1.0
    denominator = beta * beta * precision + recall
    f = (1 + beta * beta) * precision * recall / denominator if denominator else 0.0
    return {
        "precision": precision,
        "recall": recall,
        f"f{beta:g}": f,
        "correct": correct,
        "proposed": proposed,
        "gold": gold_total,
    }


# ----------------------------------------------------------------------------------------------
# Grammatical error correction: GLEU (JFLEG)
# ----------------------------------------------------------------------------------------------


def _ngram_counts(tokens: Sequence[str], n: int) -> Counter:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) + 1 - n))


def _gleu_stats(src: Sequence[str], hyp: Sequence[str], ref: Sequence[str], order: int) -> list[int]:
    """``[hyp_len, ref_len, match_1, total_1, ..., match_order, total_order]`` for one pair.

    ``match_n`` = n-grams of the hypothesis found in the reference, minus those found in the
    source but in no way in the reference (clipped counts; floored at 0).
    """
    stats = [len(hyp), len(ref)]
    for n in range(1, order + 1):
        h, r, s = _ngram_counts(hyp, n), _ngram_counts(ref, n), _ngram_counts(src, n)
        source_only = Counter({g: c for g, c in s.items() if g not in r})
        match = sum((h & r).values()) - sum((h & source_only).values())
        stats += [max(match, 0), max(len(hyp) + 1 - n, 0)]
    return stats


def _gleu_from_stats(stats: Sequence[float]) -> float:
    if any(s == 0 for s in stats):
        return 0.0
    hyp_len, ref_len = stats[:2]
    log_precisions = [math.log(m / t) for m, t in zip(stats[2::2], stats[3::2])]
    return math.exp(min(0.0, 1 - ref_len / hyp_len) + sum(log_precisions) / len(log_precisions))


def gleu_score(
    sources: Sequence[str],
    hyps: Sequence[str],
    refs_list: References,
    iterations: int = 500,
    order: int = 4,
) -> dict[str, float]:
    """Corpus GLEU as computed by the JFLEG repository (``eval/gleu.py``, the 2016 version).

    This is the "GLEU without tuning" variant of Napoles et al. (2015; updated 2016 for
    multiple references): BLEU-like n-gram precisions (n = 1..4, no smoothing, brevity penalty
    ``exp(min(0, 1 - r/c))``) whose numerators subtract the hypothesis n-grams that occur in the
    source but not in the reference. With several references, each of ``iterations`` rounds
    draws one reference per sentence (``random.Random(101 * round)``, like the JFLEG script's
    ``random.seed(j * 101)``; the draws of the original Python 2 script cannot be reproduced
    in Python 3, so multi-reference scores can differ from it in the last digits), and the
    score is the mean corpus GLEU of the rounds. Text is whitespace-tokenized (JFLEG is
    tokenized).

    Returns ``gleu`` and ``gleu_std`` (standard deviation over the rounds), both x 100.
    """
    streams = _as_streams(refs_list)
    if len({len(sources), len(hyps), *map(len, streams)}) > 1:
        raise ValueError(
            f"{len(sources)} sources, {len(hyps)} hypotheses, references: {[len(s) for s in streams]}"
        )
    stats = np.array(
        [
            [_gleu_stats(s.split(), h.split(), stream[i].split(), order) for stream in streams]
            for i, (s, h) in enumerate(zip(sources, hyps))
        ],
        dtype=float,
    ).reshape(len(hyps), len(streams), 2 + 2 * order)
    rounds = iterations if len(streams) > 1 else 1
    scores = []
    for round_id in range(rounds):
        rng = random.Random(round_id * 101)
        choice = [rng.randint(0, len(streams) - 1) for _ in hyps]
        scores.append(_gleu_from_stats(stats[np.arange(len(hyps)), choice].sum(axis=0)))
    return {"gleu": 100.0 * float(np.mean(scores)), "gleu_std": 100.0 * float(np.std(scores))}


def exact_match(preds: Sequence[str], refs: Sequence[str]) -> float:
    """Percentage of predictions equal to their reference (after stripping outer whitespace)."""
    pairs = list(zip(preds, refs))
    return 100.0 * sum(p.strip() == r.strip() for p, r in pairs) / max(len(pairs), 1)


# ----------------------------------------------------------------------------------------------
# Language modelling
# ----------------------------------------------------------------------------------------------


def perplexity(mean_nll: float) -> float:
    """Perplexity ``exp(mean NLL)``; the NLL is per token, in nats (``inf`` on overflow)."""
    try:
        return math.exp(mean_nll)
    except OverflowError:
        return math.inf


def empty_hypotheses_warning(hyps: Sequence[str], what: str = "hypotheses") -> str | None:
    """One line where at least half of ``hyps`` (and at least one) are empty, else None: such scores are near 0
    (nothing to score when all are) for a reason that is not the metric's, which the line names."""
    empty = sum(not hyp.strip() for hyp in hyps)
    if not empty or 2 * empty < len(hyps):
        return None
    return (
        f"{empty} of {len(hyps)} {what} are empty, so their scores are near 0: usually an untrained or barely "
        "trained model (it ends every output at once), or max_new_tokens / max_length too small"
    )


# ----------------------------------------------------------------------------------------------
# compute_metrics for Seq2SeqTrainer
# ----------------------------------------------------------------------------------------------
