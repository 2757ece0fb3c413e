"""ode-train refuses, at start, a tokenizer that does not fit the model it trains: another tokenizer for a saved
model (another size, other special ids, another vocabulary), and a broken folder of a handful of tokens that a new
model would be built on; and the config a trained folder keeps."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tiny_folder import TEXTS, save_tiny_folder
from tiny_run import TINY_RUN, corpus
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from ode_transformer.tokenizer import SPECIAL_TOKENS, train_tokenizer
from ode_transformer.train import run as ode_train

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def ode_train_main(tmp_path: Path, *flags: str) -> Path:
    """``ode-train`` in process (its ``main``) on a few lines; the output folder."""
    out = tmp_path / "out"
    data = ",".join(corpus(tmp_path / "data"))
    ode_train.main([*TINY_RUN, "--output_dir", str(out), "--train_file", data, *flags])
    return out


def copy_tokenizer(model: Path, folder: Path) -> Path:
    folder.mkdir()
    for name in TOKENIZER_FILES:
        shutil.copy(model / name, folder / name)
    return folder


def assert_refused(tmp_path: Path, message: str, *flags: str) -> None:
    """ode-train refuses ``flags`` with ``message``, before it writes anything."""
    with pytest.raises(ValueError, match=message):
        ode_train_main(tmp_path, *flags)
    assert not (tmp_path / "out").exists()


@pytest.fixture
def model(tmp_path) -> Path:
    save_tiny_folder(tmp_path / "model")
    return tmp_path / "model"


def test_a_smaller_tokenizer_for_a_saved_model_is_refused_naming_both_sizes(tmp_path, model):
    size = len(AutoTokenizer.from_pretrained(model))
    smaller = train_tokenizer(TEXTS, vocab_size=size // 2 + 150, save_to=tmp_path / "smaller")
    assert len(smaller) < size
    assert_refused(
        tmp_path,
        rf"the tokenizer in {tmp_path}/smaller has {len(smaller)} tokens, and {model} was trained with a "
        rf"{size}-token vocabulary .*; leave --tokenizer_name out to use {model}'s own tokenizer",
        "--model_name_or_path", str(model), "--tokenizer_name", str(tmp_path / "smaller"),
    )  # fmt: skip


def test_a_tokenizer_with_other_special_ids_is_refused(tmp_path, model):
    """A foreign tokenizer of the same size (a BART/RoBERTa-like one whose pad is another id) is refused by its
    special ids."""
    foreign = AutoTokenizer.from_pretrained(model)
    foreign.pad_token = SPECIAL_TOKENS[3]  # <unk>: id 3, the model pads with 1
    foreign.save_pretrained(tmp_path / "foreign")
    assert_refused(
        tmp_path,
        r"has other special ids than .*config.json: pad_token_id 3 \(the model's: 1\)",
        "--model_name_or_path", str(model), "--tokenizer_name", str(tmp_path / "foreign"),
    )  # fmt: skip


def test_a_tokenizer_of_the_same_size_with_another_vocabulary_is_refused(tmp_path, model):
    other = copy_tokenizer(model, tmp_path / "other")
    data = json.loads((other / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]  # two tokens change places: same size, same specials
    (other / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    assert_refused(
        tmp_path,
        rf"has another vocabulary than {model}'s own tokenizer \(2 of its \d+ tokens have another id",
        "--model_name_or_path", str(model), "--tokenizer_name", str(other),
    )  # fmt: skip


def test_a_named_folder_without_a_tokenizer_is_refused_for_a_saved_model(tmp_path, model):
    (tmp_path / "empty").mkdir()
    assert_refused(
        tmp_path,
        "holds no tokenizer.json: with --model_name_or_path it must name the folder of a saved tokenizer",
        "--model_name_or_path", str(model), "--tokenizer_name", str(tmp_path / "empty"),
    )  # fmt: skip
    assert not list((tmp_path / "empty").iterdir())  # no tokenizer trained into it


def test_the_model_s_own_tokenizer_named_again_fine_tunes(tmp_path, model):
    same = copy_tokenizer(model, tmp_path / "same")
    out = ode_train_main(tmp_path, "--model_name_or_path", str(model), "--tokenizer_name", str(same))
    assert (out / "model.safetensors").is_file()
    assert AutoTokenizer.from_pretrained(out).get_vocab() == AutoTokenizer.from_pretrained(model).get_vocab()


def five_token_tokenizer(folder: Path) -> Path:
    """A broken tokenizer folder: the four special tokens and one word."""
    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, "dog"])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS[3]))
    bos, pad, eos, unk = SPECIAL_TOKENS
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single=f"$A {eos}", special_tokens=[(eos, 2)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=bos, pad_token=pad, eos_token=eos, unk_token=unk
    )
    tokenizer.save_pretrained(folder)
    return folder


def test_a_broken_five_token_tokenizer_is_refused_for_a_new_model(tmp_path):
    """A 5-token tokenizer would build a 5-token model: refused before training, the message saying why and what
    to do."""
    named = five_token_tokenizer(tmp_path / "five")
    with pytest.raises(ValueError) as raised:
        ode_train_main(tmp_path, "--tokenizer_name", str(named))
    assert str(raised.value) == (
        f"the tokenizer in {named} has 5 tokens, 4 of them special: too few to encode text (a model needs at least "
        "26 besides the special ones, a byte-level BPE has 256 bytes alone), so that folder looks broken or cut off; "
        "name a folder that holds a whole tokenizer, or leave --tokenizer_name out to train one"
    )
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_trained_folder_keeps_use_cache_true(tmp_path):
    """The Trainer turns `use_cache` off for training (its `--use_cache` is false by default); the saved
    config.json keeps the class default, true, which generation reads."""
    out = ode_train_main(tmp_path)
    assert json.loads((out / "config.json").read_text())["use_cache"] is True
