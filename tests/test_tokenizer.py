"""Tests of ode_transformer.tokenizer: special-token ids, </s> post-processing, round trip, reuse."""

from __future__ import annotations

import logging
import unicodedata
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from ode_transformer.files import read_lines
from ode_transformer.tokenizer import SPECIAL_TOKENS, load_or_train_tokenizer, train_tokenizer

VOCAB_SIZE = 3000


@pytest.fixture(scope="module")
def folder(tmp_path_factory, shared_data) -> Path:
    """A tokenizer trained on 8,000 Multi30k training pairs (en + de), saved to a folder."""
    texts = (
        read_lines(shared_data / "multi30k" / "train.en.gz")[:8000]
        + read_lines(shared_data / "multi30k" / "train.de.gz")[:8000]
    )
    out = tmp_path_factory.mktemp("tok")
    train_tokenizer(texts, VOCAB_SIZE, save_to=out)
    return out


@pytest.fixture(scope="module")
def tok(folder) -> PreTrainedTokenizerFast:
    return AutoTokenizer.from_pretrained(str(folder))


def test_autotokenizer_loads_with_fairseq_special_ids(tok):
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert [tok.bos_token_id, tok.pad_token_id, tok.eos_token_id, tok.unk_token_id] == [0, 1, 2, 3]
    assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == list(SPECIAL_TOKENS)
    assert (tok.bos_token, tok.pad_token, tok.eos_token, tok.unk_token) == ("<s>", "<pad>", "</s>", "<unk>")
    assert len(tok) == VOCAB_SIZE


def test_eos_appended_once_and_padding_uses_pad(tok):
    ids = tok("Ein Hund läuft.")["input_ids"]
    assert ids[-1] == 2 and ids.count(2) == 1 and 0 not in ids
    batch = tok(["Ein Hund.", "Zwei kleine Hunde spielen im Schnee."], padding=True)["input_ids"]
    assert batch[0][-1] == 1 and batch[1][-1] == 2 and len(batch[0]) == len(batch[1])


def test_round_trip_on_unseen_german_lines_with_umlauts(tok, shared_data):
    lines = [s for s in read_lines(shared_data / "multi30k" / "val.de.gz") if any(c in s for c in "äöüÄÖÜß")]
    assert len(lines) > 100
    for line in lines:
        # exact round trip up to NFKC (a few lines contain a no-break space, NFKC maps it to " ")
        assert tok.decode(tok(line)["input_ids"], skip_special_tokens=True) == unicodedata.normalize(
            "NFKC", line
        )
    unchanged = [s for s in lines if unicodedata.normalize("NFKC", s) == s]
    assert len(unchanged) > 0.95 * len(lines)


def test_no_unknown_tokens_for_unseen_scripts(tok):
    text = "Ședința „România” — 😀  double  spaces, tokenised word ."
    ids = tok(text)["input_ids"]
    assert tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_nfkc_normalisation(tok):
    assert tok.decode(tok("ﬁne")["input_ids"], skip_special_tokens=True) == "fine"


def test_bpe_merges_frequent_words(tok):
    # frequent Multi30k words are single tokens; the whole sentence is much shorter than its bytes
    assert tok.tokenize("Ein Mann") == ["Ein", "ĠMann"]
    sentence = "Ein Mann in einem blauen Hemd steht auf einer Leiter."
    assert len(tok(sentence)["input_ids"]) < len(sentence.encode()) / 3


def test_load_or_train_reuses_existing_folder(folder, tok):
    reused = load_or_train_tokenizer(folder, texts=None, vocab_size=VOCAB_SIZE)
    assert reused.get_vocab() == tok.get_vocab()


def test_load_or_train_trains_and_saves(tmp_path):
    texts = ["der Hund läuft", "die Katze schläft", "the dog runs", "the cat sleeps"] * 50
    trained = load_or_train_tokenizer(tmp_path / "new", texts, vocab_size=300)
    assert (tmp_path / "new" / "tokenizer.json").is_file()
    assert load_or_train_tokenizer(tmp_path / "new", None, 300).get_vocab() == trained.get_vocab()
    with pytest.raises(ValueError, match="no texts"):
        load_or_train_tokenizer(tmp_path / "absent", None, 300)
    with pytest.raises(ValueError, match="no room"):
        train_tokenizer(texts, 100)


def test_word_level_vocabulary_is_dense_and_keeps_literal_unk():
    """kind="word": specials 0-3, then words by frequency (ties alphabetical); a literal ``<unk>`` in the
    text (as in PTB) is the special ``<unk>``, not a second entry; words beyond the size map to ``<unk>``."""
    texts = ["the cat sat", "the dog <unk> sat", "the <unk> ran"]
    tokenizer = train_tokenizer(texts, vocab_size=len(SPECIAL_TOKENS) + 3, min_frequency=1, kind="word")
    vocab = tokenizer.get_vocab()
    assert sorted(vocab.values()) == list(range(len(vocab)))  # no holes: ids < len(tokenizer)
    assert [vocab[t] for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert vocab["the"] == 4 and vocab["sat"] == 5 and vocab["cat"] == 6  # the 3, sat 2; cat/dog/ran 1
    assert tokenizer("the dog <unk> sat")["input_ids"] == [4, 3, 3, 5, 2]  # dog is cut: <unk>; then </s>
    assert tokenizer.decode([4, 6, 5, 2], skip_special_tokens=True) == "the cat sat"


def test_word_level_ptb_has_every_word(tmp_path, shared_data):
    lines = read_lines(shared_data / "ptb" / "ptb.train.txt.gz")
    train_tokenizer(
        lines, vocab_size=10_002, kind="word", save_to=tmp_path
    )  # as `ode_transformer.train.run --tokenizer_type word`
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    words = {w for line in lines for w in line.split()}
    assert len(words) == 9999  # Mikolov's PTB: 10k types counting </s>
    assert len(tokenizer) == len(words) - 1 + len(SPECIAL_TOKENS)  # <unk> is a special
    ids = tokenizer(lines[0])["input_ids"]
    assert (
        len(ids) == len(lines[0].split()) + 1
        and tokenizer.unk_token_id not in ids[:-1]
        or "<unk>" in lines[0]
    )


def test_unknown_tokenizer_kind_is_refused():
    with pytest.raises(ValueError, match="tokenizer kind must be one of"):
        train_tokenizer(["a b"], 100, kind="sentencepiece")


def test_reuse_refuses_a_tokenizer_trained_otherwise(tmp_path, caplog):
    texts = ["der Hund läuft", "die Katze schläft", "the dog runs", "the cat sleeps"] * 50
    trained = load_or_train_tokenizer(tmp_path, texts, vocab_size=300)
    with caplog.at_level(logging.INFO, logger="ode_transformer.tokenizer"):
        load_or_train_tokenizer(tmp_path, texts, vocab_size=300)  # same settings and data: reused
    assert f"using the tokenizer in {tmp_path}" in caplog.text
    with pytest.raises(ValueError, match="vocab_size 300 vs 400 now"):
        load_or_train_tokenizer(tmp_path, texts, vocab_size=400)
    with pytest.raises(ValueError, match=r"texts 200 vs 199 now; texts_sha256 \w+ vs \w+ now"):
        load_or_train_tokenizer(tmp_path, texts[:-1], vocab_size=300)
    # asked for by name (verify=False): the user's choice, used as it is
    assert load_or_train_tokenizer(tmp_path, texts[:-1], 400, verify=False).get_vocab() == trained.get_vocab()
    with pytest.raises(ValueError, match="kind bpe vs word now"):
        load_or_train_tokenizer(tmp_path, texts, vocab_size=300, kind="word")


def test_causal_tokenizer_prepends_bos_and_leaves_the_prompt_open(tmp_path):
    texts = ["the dog runs", "the cat sleeps", "a dog sleeps"] * 50
    load_or_train_tokenizer(tmp_path, texts, vocab_size=300, causal=True)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    ids = tok("the dog")["input_ids"]
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.eos_token_id not in ids
    assert ids[1:] == tok("the dog", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == "the dog"
