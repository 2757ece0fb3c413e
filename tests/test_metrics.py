"""Tests of train/metrics.py and train/evaluate_predictions.py against independent expectations.

Real-data tests read ../shared/data (next to the repository) in place and are skipped when it
is absent.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
from rouge_score import rouge_scorer

from ode_transformer.files import read_lines
from ode_transformer.train.data import data_root
from ode_transformer.train.evaluate_predictions import main
from ode_transformer.train.metrics import (
    GoldEdit,
    M2Sentence,
    chrf_score,
    exact_match,
    gleu_score,
    m2_score,
    parse_m2,
    perplexity,
    rouge_scores,
    sacrebleu_score,
    split_compounds,
    tokenized_bleu,
)
from ode_transformer.train.tasks import TASKS
from ode_transformer.train.trainer import build_seq2seq_compute_metrics

REPO = Path(__file__).resolve().parents[1]


def read_data(relative: str, limit: int | None = None) -> list[str]:
    path = data_root() / relative
    if not path.is_file():
        pytest.skip(f"shared data not available: {path}")
    return read_lines(path)[:limit]


def m2(text: str) -> list[M2Sentence]:
    return parse_m2(text.strip().splitlines())


# ---------------------------------------------------------------------------------------------
# Machine translation
# ---------------------------------------------------------------------------------------------


def perturb(line: str, index: int) -> str:
    """A deterministic, imperfect "system output": drop, swap or duplicate words."""
    words = line.split()
    if index % 3 == 0 and len(words) > 2:
        words = words[:-2] + words[-1:]
    elif index % 3 == 1 and len(words) > 3:
        words[1], words[2] = words[2], words[1]
    else:
        words = words + words[:1]
    return " ".join(words)


def test_sacrebleu_and_chrf_equal_sacrebleu_on_newstest2014():
    refs = read_data("wmt/en-de/newstest2014.de.gz", 300)
    hyps = [perturb(line, i) for i, line in enumerate(refs)]
    result = sacrebleu_score(hyps, [refs])
    expected = sacrebleu.corpus_bleu(hyps, [refs], tokenize="13a")
    assert result["score"] == pytest.approx(expected.score, abs=1e-9)
    assert 20 < result["score"] < 95
    assert result["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert sacrebleu_score(hyps, refs)["score"] == result["score"]  # a flat list is one stream
    assert sacrebleu_score(refs, [refs])["score"] == pytest.approx(100.0)
    chrf = chrf_score(hyps, [refs])
    assert chrf["score"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score, abs=1e-9)
    assert chrf["signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:")


def test_split_compounds_follows_the_perl_regex():
    assert split_compounds("rich-text format") == "rich ##AT##-##AT## text format"
    # non-overlapping matches, like perl's s{(\S)-(\S)}{...}g: the second hyphen stays
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b-c"
    assert split_compounds("x - y") == "x - y"


def test_tokenized_bleu_compound_splitting_by_hand():
    ref = "wir haben das Top-Hotel in der Altstadt gebucht ."
    hyp = "wir haben das Luxus-Hotel in der Altstadt gebucht ."
    # No splitting (9 tokens each; only "Luxus-Hotel" differs): matched / total n-grams
    #   1: 8/9, 2: 6/8, 3: 4/7, 4: 2/6  (n-grams covering position 3 fail), BP = 1
    plain = math.exp((math.log(8 / 9) + math.log(6 / 8) + math.log(4 / 7) + math.log(2 / 6)) / 4)
    # Split: "... das Luxus ##AT##-##AT## Hotel in ..." (11 tokens; only "Luxus" differs)
    #   1: 10/11, 2: 8/10, 3: 6/9, 4: 4/8 -> the shared "-Hotel" part now earns credit
    split = math.exp((math.log(10 / 11) + math.log(8 / 10) + math.log(6 / 9) + math.log(4 / 8)) / 4)
    without = tokenized_bleu([hyp], [ref], compound_split=False, tokenize="none")
    with_split = tokenized_bleu([hyp], [ref], tokenize="none")
    assert without["score"] == pytest.approx(100 * plain)  # 59.70
    assert with_split["score"] == pytest.approx(100 * split)  # 70.17
    assert with_split["score"] > without["score"]
    assert with_split["sys_len"] == 11 and without["sys_len"] == 9
    # Moses tokenization of detokenized text ("gebucht." -> "gebucht .") gives the same counts.
    moses = tokenized_bleu([hyp.replace(" .", ".")], [ref.replace(" .", ".")], lang="de")
    assert moses["score"] == pytest.approx(100 * split)
    assert "tok:moses-de" in moses["signature"] and "compound-split:atat" in moses["signature"]


# ---------------------------------------------------------------------------------------------
# Summarization
# ---------------------------------------------------------------------------------------------


def test_rouge_equals_rouge_score_on_cnndm():
    refs = read_data("summarization/cnndm_cased_val1000/val.target.gz", 60)
    articles = read_data("summarization/cnndm_cased_val1000/val.source.gz", 60)
    preds = [" ".join(article.split()[:50]) for article in articles]  # lead-50-words baseline
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=True)

    def mean_f1(pairs, key):
        return 100 * float(np.mean([scorer.score(r, p)[key].fmeasure for p, r in pairs]))

    raw = rouge_scores(preds, refs, sentence_split=False)
    for key in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
        assert raw[key] == pytest.approx(mean_f1(zip(preds, refs), key), abs=1e-9)
    assert 10 < raw["rouge2"] < raw["rouge1"] < 60

    def lines(text):
        return "\n".join(re.split(r"(?<=[.!?])\s+", text))

    split = rouge_scores(preds, refs)
    assert split["rouge1"] == pytest.approx(raw["rouge1"], abs=1e-9)  # newlines do not matter
    expected_lsum = mean_f1(zip(map(lines, preds), map(lines, refs)), "rougeLsum")
    assert split["rougeLsum"] == pytest.approx(expected_lsum, abs=1e-9)
    assert split["rougeLsum"] > split["rougeL"]  # summary-level LCS on multi-sentence text


# ---------------------------------------------------------------------------------------------
# M2 scorer: hand-made cases (counts worked out in the comments)
# ---------------------------------------------------------------------------------------------


def score(text: str, hyp: str, **kwargs) -> dict:
    return m2_score([hyp], m2(text), **kwargs)


def prf(result: dict) -> tuple:
    return result["correct"], result["proposed"], result["gold"], result["precision"], result["recall"]


def test_parse_m2_fields():
    sentences = m2(
        """
S She see the cat .
A 1 2|||SVA|||sees||saw|||REQUIRED|||-NONE-|||0
A 3 4|||Nn|||-NONE-|||REQUIRED|||-NONE-|||0
A -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||1

S Fine .
"""
    )
    assert sentences[0].source == ["She", "see", "the", "cat", "."]
    assert sentences[0].annotators == {
        0: [GoldEdit(1, 2, ("sees", "saw")), GoldEdit(3, 4, ("",))],
        1: [],  # noop annotation: this annotator makes no correction
    }
    assert sentences[1].annotators == {0: []}  # no A line at all


def test_a_file_that_is_not_m2_is_named(tmp_path, capsys):
    """A plain text file given as --m2 was read as 0 sentences ("has 0 lines"), and an edit before any sentence
    was an error without a line number."""
    with pytest.raises(
        ValueError, match=r"^gold.m2, line 2: 'A 1 2\|\|\|SVA.*' is not M2 \(an 'S sentence' line"
    ):
        parse_m2(["", "A 1 2|||SVA|||sees|||REQUIRED|||-NONE-|||0"], "gold.m2")
    plain = tmp_path / "plain.txt"
    plain.write_text("She sees the cat .\n", encoding="utf-8")
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("She sees the cat .\n", encoding="utf-8")
    assert main(["--task", "gec", "--hyp", str(hyp), "--m2", str(plain)]) == 2
    assert f"{plain}, line 1: 'She sees the cat .' is not M2" in capsys.readouterr().err


def test_m2_insertion_and_extra_edit():
    text = "S I went to store .\nA 3 3|||ArtOrDet|||the|||REQUIRED|||-NONE-|||0"
    # hypothesis inserts "the" before "store": 1 correct / 1 proposed / 1 gold
    assert prf(score(text, "I went to the store .")) == (1, 1, 1, 1.0, 1.0)
    # "the big": the gold insertion plus an extra one: 1 correct / 2 proposed / 1 gold
    # P = 1/2, R = 1, F0.5 = 1.25 * 0.5 * 1 / (0.25 * 0.5 + 1) = 0.625 / 1.125 = 5/9
    result = score(text, "I went to the big store .")
    assert prf(result) == (1, 2, 1, 0.5, 1.0)
    assert result["f0.5"] == pytest.approx(5 / 9)


def test_m2_deletion_of_a_repeated_word():
    # deleting either "very" gives the same text; the lattice holds both alignments and the
    # scorer picks the one matching the gold deletion of token 2. -NONE- means deletion.
    text = "S He is very very tall .\nA 2 3|||Rloc-|||-NONE-|||REQUIRED|||-NONE-|||0"
    assert prf(score(text, "He is very tall .")) == (1, 1, 1, 1.0, 1.0)


def test_m2_merges_adjacent_edits_into_a_multi_token_edit():
    # is -> has and being -> been are two adjacent substitutions in the alignment; merged they
    # give the gold edit [2, 4) "has been": 1 correct / 1 proposed / 1 gold.
    text = "S The convenience is being noticed .\nA 2 4|||Vt|||has been|||REQUIRED|||-NONE-|||0"
    assert prf(score(text, "The convenience has been noticed .")) == (1, 1, 1, 1.0, 1.0)


def test_m2_max_unchanged_words():
    # The gold edit [1, 7) keeps "human beings" (2 unchanged words) inside.
    text = (
        "S He replace human beings for better performances .\n"
        "A 1 7|||Wci|||outperforms human beings|||REQUIRED|||-NONE-|||0"
    )
    hyp = "He outperforms human beings ."
    assert prf(score(text, hyp)) == (1, 1, 1, 1.0, 1.0)  # default limit 2: merged, matches
    # limit 1: "replace -> outperforms" and "for better performances -> ''" stay two wrong
    # edits: 0 correct / 2 proposed / 1 gold, P = R = F = 0
    result = score(text, hyp, max_unchanged_words=1)
    assert prf(result) == (0, 2, 1, 0.0, 0.0) and result["f0.5"] == 0.0


def test_m2_overlapping_gold_edits():
    # one annotator, two overlapping gold edits: at most one can be matched
    text = (
        "S I like an apples .\n"
        "A 2 3|||ArtOrDet||||||REQUIRED|||-NONE-|||0\n"
        "A 2 4|||Nn|||an apple|||REQUIRED|||-NONE-|||0"
    )
    # 1 correct / 1 proposed / 2 gold: P = 1, R = 1/2, F0.5 = 1.25 * 0.5 / (0.25 + 0.5) = 5/6
    for hyp in ("I like apples .", "I like an apple ."):
        result = score(text, hyp)
        assert prf(result) == (1, 1, 2, 1.0, 0.5)
        assert result["f0.5"] == pytest.approx(5 / 6)
    # a hypothesis edit that only partly overlaps a gold edit is wrong: "is" -> "has" alone
    # against gold [1, 3) "has been": 0 correct / 1 proposed / 1 gold
    partial = "S It is being noticed .\nA 1 3|||Vt|||has been|||REQUIRED|||-NONE-|||0"
    assert prf(score(partial, "It has being noticed .")) == (0, 1, 1, 0.0, 0.0)


def test_m2_alternatives_and_annotators():
    two_annotators = "S She see the cat .\nA 1 2|||SVA|||sees|||REQUIRED|||-NONE-|||0\nA 1 2|||Vt|||saw|||REQUIRED|||-NONE-|||1"
    # annotator 0: 0/1/1 (F = 0), annotator 1: 1/1/1 (F = 1) -> annotator 1 is chosen
    assert prf(score(two_annotators, "She saw the cat .")) == (1, 1, 1, 1.0, 1.0)
    assert prf(score(two_annotators, "She sees the cat .")) == (1, 1, 1, 1.0, 1.0)
    alternatives = "S She see the cat .\nA 1 2|||SVA|||sees||saw|||REQUIRED|||-NONE-|||0"
    assert prf(score(alternatives, "She saw the cat .")) == (1, 1, 1, 1.0, 1.0)
    # "He saw a cat": He (wrong), saw (gold), a (wrong): 1 correct / 3 proposed / 1 gold
    # P = 1/3, R = 1, F0.5 = 1.25 * (1/3) / (0.25 * (1/3) + 1) = 5/13
    result = score(alternatives, "He saw a cat .")
    assert prf(result) == (1, 3, 1, pytest.approx(1 / 3), 1.0)
    assert result["f0.5"] == pytest.approx(5 / 13)


def test_m2_noop_annotator():
    text = (
        "S This are good .\n"
        "A -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||0\n"
        "A 1 2|||SVA|||is|||REQUIRED|||-NONE-|||1"
    )
    # unchanged: annotator 0 (no edits) gives 0/0/0 -> F = 1 by the 0/0 convention; annotator 1
    # gives 0/0/1 -> F = 0; annotator 0 is chosen: P = R = 1 (nothing proposed, nothing missed)
    assert prf(score(text, "This are good .")) == (0, 0, 0, 1.0, 1.0)
    # corrected: annotator 0 0/1/0 (F = 0), annotator 1 1/1/1 (F = 1) -> annotator 1
    assert prf(score(text, "This is good .")) == (1, 1, 1, 1.0, 1.0)


def test_m2_unchanged_source_and_corpus_counts():
    corpus = m2(
        """
S I went to store .
A 3 3|||ArtOrDet|||the|||REQUIRED|||-NONE-|||0

S I like an apples .
A 2 3|||ArtOrDet||||||REQUIRED|||-NONE-|||0
A 2 4|||Nn|||an apple|||REQUIRED|||-NONE-|||0

S He go home .
A 1 2|||Vt|||went|||REQUIRED|||-NONE-|||0
"""
    )
    unchanged = m2_score(["I went to store .", "I like an apples .", "He go home ."], corpus)
    # nothing proposed: P = 0/0 = 1.0 (official convention), R = 0/4 = 0, F = 0
    assert prf(unchanged) == (0, 0, 4, 1.0, 0.0) and unchanged["f0.5"] == 0.0
    # counts are summed over sentences: (1+1+0) correct, (2+1+0) proposed, (1+2+1) gold
    # P = 2/3, R = 1/2, F0.5 = 1.25 * (2/3) * (1/2) / (0.25 * (2/3) + 1/2) = 0.625
    result = m2_score(["I went to the big store .", "I like apples .", "He go home ."], corpus)
    assert prf(result) == (2, 3, 4, pytest.approx(2 / 3), 0.5)
    assert result["f0.5"] == pytest.approx(0.625)


def test_m2_ignore_case():
    text = "S i like it .\nA 1 2|||SVA|||likes|||REQUIRED|||-NONE-|||0"
    assert prf(score(text, "i Likes it .")) == (0, 1, 1, 0.0, 0.0)
    assert prf(score(text, "i Likes it .", ignore_case=True)) == (1, 1, 1, 1.0, 1.0)
    # a case-only change is no edit any more, but a case-only gold edit still counts as gold
    capital = "S i like it .\nA 0 1|||Mec|||I|||REQUIRED|||-NONE-|||0"
    assert prf(score(capital, "I like it .", ignore_case=True)) == (0, 0, 1, 1.0, 0.0)


def test_m2_length_mismatch():
    with pytest.raises(ValueError, match="2 hypotheses but 1 M2 sentences"):
        m2_score(["a", "b"], m2("S a"))


# ---------------------------------------------------------------------------------------------
# M2 scorer on CoNLL-2013
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def conll():
    sentences = parse_m2(read_data("gec/conll2013/conll2013.test.m2.gz"))
    sources = read_data("gec/conll2013/conll2013.test.src.gz")
    assert len(sentences) == len(sources) == 1381
    assert all(s.source == line.split() for s, line in zip(sentences, sources))
    return sentences, sources


def apply_edits(sentence: M2Sentence, annotator: int = 0) -> str:
    """The source with the annotator's edits applied (first alternative), right to left;
    an edit overlapping one already applied is skipped."""
    tokens, next_start = list(sentence.source), math.inf
    for edit in sorted(sentence.annotators[annotator], key=lambda e: (e.start, e.end), reverse=True):
        if edit.end > next_start or (edit.start == edit.end == next_start):
            continue
        tokens[edit.start : edit.end] = edit.corrections[0].split()
        next_start = edit.start
    return " ".join(tokens)


def is_simple(sentence: M2Sentence) -> bool:
    """Annotator-0 edits that each replace at most one token by at most one other token and
    do not touch each other."""
    edits = sorted(sentence.annotators[0], key=lambda e: (e.start, e.end))
    for a, b in zip(edits, edits[1:]):
        if b.start <= a.end:
            return False
    return all(
        e.end - e.start <= 1
        and len(e.corrections[0].split()) <= 1
        and e.corrections[0].split() != sentence.source[e.start : e.end]
        for e in edits
    )


def test_m2_conll2013_unchanged_source(conll):
    sentences, sources = conll
    result = m2_score(sources, sentences)
    assert prf(result) == (0, 0, 3506, 1.0, 0.0) and result["f0.5"] == 0.0


def test_m2_conll2013_gold_corrections(conll):
    sentences, _ = conll
    simple = [s for s in sentences if is_simple(s)]
    assert len(simple) > 500
    result = m2_score([apply_edits(s) for s in simple], simple)
    n_edits = sum(len(s.annotators[0]) for s in simple)
    assert prf(result) == (n_edits, n_edits, n_edits, 1.0, 1.0)
    # All sentences: edits spanning more than 2 unchanged words, word-order changes that the
    # minimum-edit alignment does not follow, and overlapping gold edits are not all
    # recoverable (the official scorer has the same limits), and overlapping edits were
    # skipped when building the text: P = 0.993, R = 0.959 here.
    full = m2_score([apply_edits(s) for s in sentences], sentences)
    assert full["precision"] > 0.98 and full["recall"] > 0.95 and full["gold"] == 3506


def test_m2_conll2013_ref0(conll):
    # ref0 is the annotator-0 correction shipped with the data (edits applied by the data
    # preparation, overlapping ones included): P = 0.977, R = 0.962 here.
    sentences, _ = conll
    ref0 = read_data("gec/conll2013/conll2013.test.ref0.gz")
    result = m2_score(ref0, sentences)
    assert result["precision"] > 0.95 and result["recall"] > 0.95 and result["f0.5"] > 0.95


# ---------------------------------------------------------------------------------------------
# GLEU
# ---------------------------------------------------------------------------------------------


def test_gleu_by_hand():
    src = "Yesterday I has a apple for lunch in the park ."
    ref = "Yesterday I had an apple for lunch in the park ."
    hyp = "Yesterday I had a apple for lunch in the park ."
    # n-grams of hyp in ref, minus those in src-but-not-ref ("has", "a", "a apple", ...):
    #   1: 10 - 1 = 9 of 11, 2: 8 - 1 = 7 of 10, 3: 6 - 1 = 5 of 9, 4: 4 - 1 = 3 of 8; BP = 1
    expected = (9 / 11 * 7 / 10 * 5 / 9 * 3 / 8) ** 0.25
    assert gleu_score([src], [hyp], [[ref]])["gleu"] == pytest.approx(100 * expected)
    # copying the source: 1: 9 - 2 = 7 of 11, 2: 7 - 3 = 4 of 10, 3: 5 - 4 = 1 of 9,
    #   4: 4 - 4 = 0 of 8 -> a GLEU of zero (corpus GLEU is not smoothed)
    assert gleu_score([src], [src], [[ref]])["gleu"] == 0.0
    assert gleu_score([src, src], [hyp, src], [[ref, ref]])["gleu"] == pytest.approx(
        100 * ((9 + 7) / 22 * (7 + 4) / 20 * (5 + 1) / 18 * (3 + 0) / 16) ** 0.25
    )
    assert gleu_score([src], [ref], [[ref]])["gleu"] == pytest.approx(100.0)


def test_gleu_orders_systems_on_jfleg_dev():
    src = read_data("gec/jfleg/dev.src.gz")
    refs = [read_data(f"gec/jfleg/dev.ref{i}.gz") for i in range(4)]
    source_copy = gleu_score(src, src, refs[1:], iterations=50)["gleu"]
    human = gleu_score(src, refs[0], refs[1:], iterations=50)["gleu"]
    assert 30 < source_copy < 45 < human
    assert gleu_score(src, src, refs, iterations=50)["gleu"] == pytest.approx(38.2, abs=0.5)


# ---------------------------------------------------------------------------------------------
# Perplexity, exact match
# ---------------------------------------------------------------------------------------------


def test_perplexity_is_exp_of_mean_nll():
    token_nll = np.array([2.0, 3.5, 1.25, 4.0])
    assert perplexity(float(token_nll.mean())) == pytest.approx(math.exp(2.6875))
    assert perplexity(math.log(10_000)) == pytest.approx(10_000)  # uniform over 10k words
    assert perplexity(0.0) == 1.0
    assert perplexity(1e4) == math.inf


def test_exact_match():
    assert exact_match(["a b ", "c"], ["a b", "d"]) == 50.0


# ---------------------------------------------------------------------------------------------
# compute_metrics for Seq2SeqTrainer
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "</s>", "<unk>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "in", "park", "."]
    model = models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


def padded_ids(tokenizer, texts, pad_value):
    ids = [tokenizer.convert_tokens_to_ids(t.split()) + [tokenizer.eos_token_id] for t in texts]
    width = max(map(len, ids)) + 2
    return np.array([row + [pad_value] * (width - len(row)) for row in ids])


def test_compute_metrics_decodes_and_scores(word_tokenizer):
    from transformers import EvalPrediction

    refs = ["the cat sat on the mat .", "a dog ran in the park ."]
    hyps = ["the cat sat on a mat .", "a dog ran in the park ."]
    prediction = EvalPrediction(
        predictions=padded_ids(word_tokenizer, hyps, word_tokenizer.pad_token_id),
        label_ids=padded_ids(word_tokenizer, refs, -100),
    )
    translation = build_seq2seq_compute_metrics(word_tokenizer, "translation")(prediction)
    assert translation["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert translation["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    gec = build_seq2seq_compute_metrics(word_tokenizer, "gec")(prediction)
    assert gec["exact_match"] == 50.0 and gec["bleu"] == translation["bleu"]
    # predictions padded with -100 too, and given as a tuple as some models return
    tupled = EvalPrediction(
        predictions=(padded_ids(word_tokenizer, hyps, -100),), label_ids=prediction.label_ids
    )
    summary = build_seq2seq_compute_metrics(word_tokenizer, "summarization")(tupled)
    assert summary == pytest.approx(rouge_scores(hyps, refs))
    assert all(isinstance(v, float) for v in summary.values())
    # --metric_for_best_model is checked against these names before training: they must be what is returned
    returned = {"translation": translation, "gec": gec, "summarization": summary}
    assert {task: sorted(scores) for task, scores in returned.items()} == {
        name: sorted(task.metric_names) for name, task in TASKS.items() if not task.is_lm
    }
    with pytest.raises(ValueError, match="task must be one of"):
        build_seq2seq_compute_metrics(word_tokenizer, "parsing")


# ---------------------------------------------------------------------------------------------
# Standalone command
# ---------------------------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m ode_transformer.train.evaluate_predictions ARGS``, in process: its exit code and what it wrote."""
    import contextlib
    import io

    from ode_transformer.train.evaluate_predictions import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse's refusals
            code = exit_.code
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def write(path: Path, lines: list[str]) -> str:
    data = ("\n".join(lines) + "\n").encode("utf-8")
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return str(path)


def test_cli_translation_and_mismatch(tmp_path):
    refs = ["Das ist ein Top-Hotel.", "Wir fahren morgen nach Berlin.", "Es regnet."]
    hyps = ["Das ist ein Luxus-Hotel.", "Wir fahren morgen nach Berlin.", "Es schneit."]
    hyp, ref = write(tmp_path / "hyp.txt", hyps), write(tmp_path / "ref.de.gz", refs)
    out = tmp_path / "metrics.json"
    done = run_cli(
        "--task", "translation", "--hyp", hyp, "--ref", ref, "--tokenized-bleu", "--output", str(out)
    )
    assert done.returncode == 0, done.stderr
    metrics = json.loads(done.stdout)
    assert metrics == json.loads(out.read_text())
    assert metrics["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert metrics["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert metrics["tokenized_bleu"] == pytest.approx(tokenized_bleu(hyps, [refs])["score"])
    assert {"chrf", "chrf_signature", "tokenized_bleu_signature"} <= metrics.keys()

    short = write(tmp_path / "short.txt", hyps[:2])
    done = run_cli("--task", "translation", "--hyp", short, "--ref", ref)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"{short} has 2 lines" in done.stderr and f"{ref} has 3" in done.stderr


def test_cli_output_dash_is_standard_output(tmp_path, monkeypatch, capsys):
    """``--output -`` means standard output, as for ode-translate: the JSON is printed once, and no file named
    ``-`` appears in the working folder."""
    hyp = write(tmp_path / "hyp.txt", ["Wir fahren morgen nach Berlin ."])
    monkeypatch.chdir(tmp_path)
    assert main(["--task", "translation", "--hyp", hyp, "--ref", hyp, "--output", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["bleu"] == pytest.approx(100.0)
    assert not (tmp_path / "-").exists()


def test_cli_gec(tmp_path):
    m2_file = write(
        tmp_path / "gold.m2",
        [
            "S I went to store .",
            "A 3 3|||ArtOrDet|||the|||REQUIRED|||-NONE-|||0",
            "",
            "S He go home .",
            "A 1 2|||Vt|||went|||REQUIRED|||-NONE-|||0",
        ],
    )
    hyp = write(tmp_path / "hyp.txt", ["I went to the store .", "He go home ."])
    done = run_cli("--task", "gec", "--hyp", hyp, "--m2", m2_file)
    assert done.returncode == 0, done.stderr
    # 1 correct / 1 proposed / 2 gold: P = 1, R = 0.5, F0.5 = 0.625 / 0.75
    assert json.loads(done.stdout) == {
        "precision": 1.0,
        "recall": 0.5,
        "f0.5": pytest.approx(0.625 / 0.75),
        "correct": 1,
        "proposed": 1,
        "gold": 2,
    }


def test_cli_gleu_summarization_and_usage_errors(tmp_path, capsys, refused):
    sources, hyps = ["I went to store .", "He go home ."], ["I went to the store .", "He go home ."]
    refs = ["I went to the store .", "He went home ."]
    src, hyp = write(tmp_path / "src.txt.gz", sources), write(tmp_path / "hyp.txt", hyps)
    ref = write(tmp_path / "ref.txt", refs)
    assert main(["--task", "gleu", "--hyp", hyp, "--src", src, "--ref", ref]) == 0
    assert json.loads(capsys.readouterr().out) == pytest.approx(gleu_score(sources, hyps, [refs]))
    assert main(["--task", "summarization", "--hyp", hyp, "--ref", ref]) == 0
    assert json.loads(capsys.readouterr().out) == pytest.approx(rouge_scores(hyps, refs))
    assert main(["--task", "gec", "--hyp", hyp]) == 2
    assert "--task gec needs --m2" in capsys.readouterr().err
    assert (
        main(["--task", "gleu", "--hyp", hyp, "--src", write(tmp_path / "s.txt", sources[:1]), "--ref", ref])
        == 2
    )
    assert "has 2 lines but" in capsys.readouterr().err
    assert main(["--task", "summarization", "--hyp", str(tmp_path / "missing.txt"), "--ref", ref]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "empty.txt").write_bytes(b"")
    empty = str(tmp_path / "empty.txt")
    # refused: not scored 0 by ROUGE, nor an IndexError in sacrebleu
    for task in ("summarization", "translation"):
        assert main(["--task", task, "--hyp", empty, "--ref", empty]) == 2
        assert f"{empty} has no lines: nothing to score" in capsys.readouterr().err
    # argparse's choices, not a KeyError from sacrebleu
    error = refused(main, ["--task", "translation", "--hyp", hyp, "--ref", ref, "--tokenize", "foo"])
    assert "argument --tokenize: invalid choice: 'foo'" in error


def test_evaluate_load_local_m2_metric_offline(tmp_path):
    code = (
        "import evaluate, json\n"
        "m = evaluate.load('train/evaluate_metrics/m2_score')\n"
        "blocks = ['S She see the cat .\\nA 1 2|||SVA|||sees|||REQUIRED|||-NONE-|||0',\n"
        "          'S I went to store .\\nA 3 3|||ArtOrDet|||the|||REQUIRED|||-NONE-|||0']\n"
        "print(json.dumps(m.compute(predictions=['She sees the cat .', 'I went to store .'], references=blocks)))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["correct"], result["proposed"], result["gold"], result["recall"]) == (1, 1, 2, 0.5)


SCORING_PROBE = """
import sys
import ode_transformer.train.run
from ode_transformer.train import metrics
from ode_transformer.train.tasks import TASKS
late = ("rouge_score", "nltk", "sacremoses")
print(sorted(name for name in late if name in sys.modules))
for task in TASKS.values():
    for package in task.scoring_packages:
        __import__(package)
before = {name.split(".")[0] for name in sys.modules}
metrics.rouge_scores(["the cat sat"], ["the cat sat down"])
print(sorted({name.split(".")[0] for name in sys.modules} - before))
"""


def test_a_run_imports_its_metric_backends_only_where_its_task_scores_with_them():
    """Importing ode_transformer.train.run (every ode-train run does) imports neither ROUGE's backend (which
    loads nltk) nor sacremoses; a task that scores with one names it in `scoring_packages`, imported at the
    run's start, after which scoring imports no further package."""
    run = subprocess.run(
        [sys.executable, "-c", SCORING_PROBE], capture_output=True, text=True, timeout=300, check=True
    )
    assert run.stdout.splitlines() == ["[]", "[]"], run.stdout


def test_mostly_empty_hypotheses_are_warned_of_where_they_are_scored(tmp_path, caplog, word_tokenizer):
    """Hypotheses that are all (or mostly) empty score near nothing for a reason that is not the metric's: the test
    split's scores, an evaluation during training and ode-evaluate each say so in one warning, counting them and
    naming the usual causes; a few empty ones (empty sources) are not warned of."""
    from datasets import Dataset
    from transformers import EvalPrediction

    from ode_transformer.train.evaluation import seq2seq_test_results

    refs = ["the cat sat on the mat .", "a dog ran in the park .", "the dog sat ."]
    hyp_file, ref_file = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp_file.write_text("\n\n\n", encoding="utf-8")
    ref_file.write_text("".join(ref + "\n" for ref in refs), encoding="utf-8")
    causes = "so their scores are near 0: usually an untrained or barely trained model"
    with caplog.at_level(logging.WARNING):
        assert main(["--task", "translation", "--hyp", str(hyp_file), "--ref", str(ref_file)]) == 0
        records = seq2seq_test_results("translation", ["", "", ""], Dataset.from_dict({"target": refs}), None)
        prediction = EvalPrediction(
            predictions=padded_ids(word_tokenizer, ["", "", "the cat"], word_tokenizer.pad_token_id),
            label_ids=padded_ids(word_tokenizer, refs, -100),
        )
        build_seq2seq_compute_metrics(word_tokenizer, "translation")(prediction)
    assert [r.getMessage().split(", so")[0] for r in caplog.records if r.levelno == logging.WARNING] == [
        f"3 of 3 hypotheses in {hyp_file} are empty",
        "3 of 3 test hypotheses are empty",
        "2 of 3 validation hypotheses are empty",
    ]
    assert all(causes in r.getMessage() and "max_length" in r.getMessage() for r in caplog.records)
    assert records[0]["value"] == 0.0
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        seq2seq_test_results("translation", ["", *refs[1:]], Dataset.from_dict({"target": refs}), None)
    assert not caplog.records
