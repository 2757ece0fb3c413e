"""Tests of train.tokenizer: special-token ids, </s> post-processing, round trip, reuse."""

from __future__ import annotations

import gzip
import unicodedata
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from train.tokenizer import SPECIAL_TOKENS, load_or_train_tokenizer, train_tokenizer

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
VOCAB_SIZE = 3000


def _read_gz(path: Path) -> list[str]:
    if not path.is_file():
        pytest.skip(f"shared data not found at {path}")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A tokenizer trained on 8,000 Multi30k training pairs (en + de), saved to a folder."""
    texts = (
        _read_gz(DATA / "multi30k" / "train.en.gz")[:8000]
        + _read_gz(DATA / "multi30k" / "train.de.gz")[:8000]
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


def test_round_trip_on_unseen_german_lines_with_umlauts(tok):
    lines = [s for s in _read_gz(DATA / "multi30k" / "val.de.gz") if any(c in s for c in "äöüÄÖÜß")]
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
    reused = load_or_train_tokenizer(folder, texts=None, vocab_size=500)
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


def test_causal_tokenizer_prepends_bos_and_leaves_the_prompt_open(tmp_path):
    texts = ["the dog runs", "the cat sleeps", "a dog sleeps"] * 50
    load_or_train_tokenizer(tmp_path, texts, vocab_size=300, causal=True)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    ids = tok("the dog")["input_ids"]
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.eos_token_id not in ids
    assert ids[1:] == tok("the dog", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == "the dog"
