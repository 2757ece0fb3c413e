"""Saved models checked before use (ode_transformer/loading.py, train/saved_model.py): another model's folder,
damaged or hostile files, non-finite weights, pickles, foreign config and tokenizer entries, flags and presets a
saved model fixes; each refused by name, with the fix, before anything is written.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_folder import save_tiny_folder
from tiny_run import (
    TINY_RUN,
    Payload,
    assert_bit_identical,
    assert_translate_and_train_refuse,
    corpus,
    snapshot,
    train_run,
    weights,
    write,
)

import ode_transformer.loading
import ode_transformer.train.arguments
import ode_transformer.train.evaluation
import ode_transformer.train.run
import ode_transformer.train.saved_model
import ode_transformer.train.trainer
from modeling_ode import ODETransformerForConditionalGeneration
from ode_transformer import cli, translate
from ode_transformer.hub.export import export_for_hub
from ode_transformer.train.arguments import parse_arguments
from ode_transformer.train.checks import check_settings
from ode_transformer.train.run import run


@pytest.mark.both_cpus
def test_a_model_folder_without_its_tokenizer_is_refused_and_left_untouched(tmp_path):
    """Fine-tuning reads the model's own vocabulary; a new tokenizer trained into the model's folder would pair
    other ids with its trained embeddings, and change the user's folder."""
    src, tgt = corpus(tmp_path / "data")
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink(missing_ok=True)
    before = snapshot(folder)
    with pytest.raises(FileNotFoundError, match="holds no tokenizer"):
        train_run(tmp_path / "out", "--model_name_or_path", str(folder), "--train_file", f"{src},{tgt}")
    assert snapshot(folder) == before


@pytest.mark.both_cpus
def test_a_folder_of_another_model_or_with_unfitting_weights_is_refused(tmp_path):
    """A BART folder, or an ODE folder whose config.json was edited, loaded with only a warning from transformers:
    ode-translate wrote a random model's output and ode_transformer.train.run fine-tuned from random weights."""
    from transformers import BartConfig, BartForConditionalGeneration

    src = write(tmp_path / "in.txt", "the dog runs\n")
    bart = tmp_path / "bart"
    save_tiny_folder(bart)  # its tokenizer, then a BART model over the ODE one
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        (bart / name).unlink(missing_ok=True)
    BartForConditionalGeneration(BartConfig(vocab_size=320, d_model=16, encoder_layers=1, decoder_layers=1,
                                            encoder_ffn_dim=32, decoder_ffn_dim=32)).save_pretrained(bart)  # fmt: skip
    message = f"{bart} is not an ODE Transformer folder: its config.json has model_type 'bart'"
    with pytest.raises(ValueError, match=message):
        translate.main([str(bart), "--input", str(src), "--no_progress"])
    with pytest.raises(ValueError, match=message):
        run(parse_arguments([*TINY_RUN, "--model_name_or_path", str(bart), "--train_file", f"{src},{src}",
                             "--output_dir", str(tmp_path / "out")]))  # fmt: skip
    assert not (tmp_path / "out").exists()

    causal = tmp_path / "causal"
    save_tiny_folder(causal, causal=True)
    with pytest.raises(
        ValueError, match=f"{causal} is a decoder-only language model: give --task lm with it"
    ):
        run(parse_arguments([*TINY_RUN, "--model_name_or_path", str(causal), "--train_file", f"{src},{src}",
                             "--output_dir", str(tmp_path / "out")]))  # fmt: skip

    edited = tmp_path / "edited"
    save_tiny_folder(edited)
    config = json.loads((edited / "config.json").read_text())
    config["relative_position_values"] = not config["relative_position_values"]
    (edited / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"the weights in {edited} do not match its config.json: .* missing"):
        translate.main([str(edited), "--input", str(src), "--no_progress"])


@pytest.mark.both_cpus
def test_model_flags_with_a_saved_model_are_refused_by_name(tmp_path):
    """Model flags that differ from a saved model's config (--d_model 64 --encoder_layers 3 with
    --model_name_or_path) are refused, each beside its saved value, rather than train the saved model as it
    is. Flags equal to the saved config pass; dropout and label smoothing are the run's and are applied."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    flags = [*TINY_RUN, "--output_dir", str(tmp_path / "out"), "--train_file", "a,b",
             "--model_name_or_path", str(folder)]  # fmt: skip
    with pytest.raises(ValueError) as raised:
        check_settings(parse_arguments([*flags, "--d_model", "64", "--encoder_layers", "3"]))
    assert str(raised.value) == (
        f"--d_model 64 (saved: 16), --encoder_layers 3 (saved: 2): {folder} is a saved model, whose shape and "
        "method its config.json fixes; leave these flags out to fine-tune it as it is, or leave "
        "--model_name_or_path out to train a new model with them"
    )
    with pytest.raises(ValueError, match=r"^--encoder_ode_method 'euler' \(saved: 'rk2'\): "):
        check_settings(parse_arguments([*flags, "--encoder_ode_method", "euler"]))
    model_args, _, run_args, _ = parse_arguments([*flags, "--d_model", "16", "--dropout", "0.3"])
    model = ode_transformer.train.saved_model.load_trainable_model(model_args, run_args.task)
    assert model.config.d_model == 16 and model.config.dropout == 0.3
    assert model.model.encoder.embed.dropout.p == 0.3  # built with it, not only written into the config


@pytest.mark.both_cpus
def test_a_preset_with_a_saved_model_is_refused_where_it_would_be_ignored(tmp_path):
    """--preset with --model_name_or_path is checked, not ignored: a preset that matches the saved model (or
    whose differing fields the flags set) passes; one that does not is refused, its fields named."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)  # the tiny preset with an RK2 encoder
    flags = [*TINY_RUN, "--output_dir", str(tmp_path / "out"), "--train_file", "a,b",
             "--model_name_or_path", str(folder)]  # fmt: skip
    check_settings(parse_arguments(flags))  # TINY_RUN gives --preset tiny: the saved model's own
    with pytest.raises(ValueError) as raised:
        check_settings(parse_arguments([*flags, "--preset", "base"]))
    assert str(raised.value).startswith(
        "--preset base sets d_model 512 (saved: 16), decoder_attention_heads 8 (saved: 2), decoder_ffn_dim 2048 "
        "(saved: 32), decoder_layers 6 (saved: 2), "
    )
    assert (
        f"{folder} is a saved model, whose config.json fixes its shape and method; leave --preset out"
        in str(raised.value)
    )
    shaped = ["--d_model", "16", "--encoder_ffn_dim", "32", "--decoder_ffn_dim", "32", "--encoder_layers", "2",
              "--decoder_layers", "2", "--encoder_attention_heads", "2", "--decoder_attention_heads", "2"]  # fmt: skip
    # every differing field set (to the saved values)
    check_settings(parse_arguments([*flags, "--preset", "base", *shaped]))


def _foreign_entries(folder: Path) -> Path:
    """Give ``folder``'s config.json another project's auto_map entry, trust_remote_code and an unknown key, and
    put the code that entry names beside it: importing it leaves a marker file."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["auto_map"]["AutoTokenizer"] = ["evil.Evil", None]
    config.update(trust_remote_code=True, not_a_field=7)
    path.write_text(json.dumps(config))
    marker = folder.parent / "evil_ran"
    write(folder / "evil.py", f"open({str(marker)!r}, 'w').close()\nclass Evil: pass\n")
    return marker


def _assert_own_entries_only(folder: Path, marker: Path) -> None:
    from transformers import AutoTokenizer

    config = json.loads((folder / "config.json").read_text())
    assert "trust_remote_code" not in config and "not_a_field" not in config
    assert sorted(config["auto_map"]) == ["AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM"]
    assert all(
        value.startswith(("configuration_ode", "modeling_ode")) for value in config["auto_map"].values()
    )
    write(folder / "evil.py", (folder.parent / "model" / "evil.py").read_text())  # dropped beside it later
    AutoTokenizer.from_pretrained(folder, trust_remote_code=True)  # what its card says to run
    assert not marker.exists()


@pytest.mark.both_cpus
def test_foreign_config_entries_are_not_carried_into_exported_or_trained_folders(tmp_path, caplog):
    """Another project's auto_map entry (AutoTokenizer: evil.Evil), trust_remote_code and an unknown key in a
    saved config.json stay out of the folder ode-export (with a warning naming them) or ode-train writes, so
    that its card's AutoTokenizer.from_pretrained(trust_remote_code=True) works and never runs an evil.py
    beside it."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    marker = _foreign_entries(folder)
    with caplog.at_level(logging.WARNING, logger="ode_transformer.translate"):
        export_for_hub(folder, tmp_path / "exported")
    assert "dropped not_a_field, trust_remote_code, auto_map.AutoTokenizer, not this project's" in caplog.text
    _assert_own_entries_only(tmp_path / "exported", marker)
    src, tgt = corpus(tmp_path / "data")
    train_run(tmp_path / "trained", "--model_name_or_path", str(folder), "--train_file", f"{src},{tgt}",
              "--max_steps", "1")  # fmt: skip
    _assert_own_entries_only(tmp_path / "trained", marker)


@pytest.mark.both_cpus
@pytest.mark.parametrize(
    ("name", "damage", "what"),
    [
        ("tokenizer.json", lambda data: data[: len(data) // 2], "not valid JSON ("),
        ("tokenizer_config.json", lambda data: b"\xe8\x00garbage" + data, "not UTF-8 text"),
    ],
    ids=["truncated tokenizer.json", "garbage tokenizer_config.json"],
)
def test_a_damaged_tokenizer_file_is_named_with_the_fix(tmp_path, name, damage, what):
    """A truncated tokenizer.json or a tokenizer_config.json that is not UTF-8 is refused by ode-translate,
    ode-train and ode-export naming the file, what is wrong with it and the fix (copy it again), not by a bare
    JSON or codec error; nothing is written."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    path = folder / name
    path.write_bytes(damage(path.read_bytes()))
    message = f"^{re.escape(str(path))} is {re.escape(what)}.*; copy it again from the folder the tokenizer was saved in"
    src = write(tmp_path / "in.txt", "the dog\n")
    assert_translate_and_train_refuse(folder, src, tmp_path / "out", message)
    with pytest.raises(ValueError, match=message):
        export_for_hub(folder, tmp_path / "exported")
    assert not (tmp_path / "out").exists() and not (tmp_path / "exported").exists()


@pytest.mark.both_cpus
def test_a_saved_model_with_non_finite_weights_is_refused_before_training(tmp_path):
    """A saved model with NaN weights is refused before training, naming the folder and the tensor, rather
    than trained until a FloatingPointError advises a lower learning rate; nothing is written."""
    folder = tmp_path / "model"
    model, _ = save_tiny_folder(folder)
    with torch.no_grad():
        model.model.shared.weight[5, 0] = float("nan")
    model.save_pretrained(folder)
    out = tmp_path / "out"
    with pytest.raises(
        ValueError, match=f"^{folder} holds non-finite weights .* in 1 tensors .*shared.weight"
    ):
        train_run(
            out, "--model_name_or_path", str(folder), "--train_file", ",".join(corpus(tmp_path / "data"))
        )
    assert not out.exists()


@pytest.mark.both_cpus
def test_a_pickle_payload_in_the_weights_is_refused_by_name(tmp_path):
    """A pickle pytorch_model.bin as the only weights is refused by ode-translate and ode-train naming the
    file and saying to convert weights you trust, not by a raw UnpicklingError traceback; it is not unpickled,
    so its payload never runs."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    state = load_file(folder / "model.safetensors")
    torch.save({**state, "extra": Payload(tmp_path / "ran")}, folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    src = write(tmp_path / "in.txt", "the dog\n")
    message = (
        f"^{re.escape(str(folder / 'pytorch_model.bin'))} holds objects other than tensors and plain values "
        r"\(.*GLOBAL posix.system.*\): it is not loaded, since unpickling it could run code; convert weights you trust"
    )
    assert_translate_and_train_refuse(folder, src, tmp_path / "out", message)
    assert not (tmp_path / "ran").exists() and not (tmp_path / "out").exists()


@pytest.mark.both_cpus
def test_a_config_json_of_a_hostile_size_or_the_wrong_shape_is_refused_before_allocating(
    tmp_path, monkeypatch
):
    """A config.json asking for a hostile size (`vocab_size` 2e8) is refused before its embeddings are
    allocated, as not describing the weights beside it; one holding a JSON list is refused by name, not by a
    TypeError from inside transformers. Neither builds the model."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    src = write(tmp_path / "in.txt", "the dog\n")

    def never(*_args, **_kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr(ODETransformerForConditionalGeneration, "from_pretrained", never)
    config_path.write_text(json.dumps({**config, "vocab_size": 200_000_000}), encoding="utf-8")
    message = (
        f"^{re.escape(str(config_path))} asks for a model of [0-9,]+ parameters \\(vocab_size 200000000, .*\\), but "
        f"{re.escape(str(folder / 'model.safetensors'))} holds [0-9,]+: the config does not describe these weights.*"
        "; copy config.json again from the folder the model was saved in$"
    )
    with pytest.raises(ValueError, match=message):
        translate.main([str(folder), "--input", str(src), "--no_progress"])
    with pytest.raises(ValueError, match=message):
        export_for_hub(folder, tmp_path / "exported")

    config_path.write_text(json.dumps([config]), encoding="utf-8")
    message = (
        f"^{re.escape(str(config_path))} holds a JSON list, not an object of fields .*; copy it again from"
    )
    assert_translate_and_train_refuse(folder, src, tmp_path / "out", message)
    assert not (tmp_path / "out").exists() and not (tmp_path / "exported").exists()


def _foreign_tokenizer(folder: Path, tokenizer_class: str) -> Path:
    """Give ``folder``'s tokenizer_config.json ``tokenizer_class`` and another project's auto_map, with the code
    it names beside it: importing it leaves a marker file."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(tokenizer_class=tokenizer_class, auto_map={"AutoTokenizer": ["evil.EvilTokenizer", None]})
    path.write_text(json.dumps(config))
    marker = folder.parent / "evil_tokenizer_ran"
    code = f"open({str(marker)!r}, 'w').close()\nfrom transformers import PreTrainedTokenizerFast\n"
    write(folder / "evil.py", code + "class EvilTokenizer(PreTrainedTokenizerFast): pass\n")
    return marker


def _assert_standard_tokenizer(folder: Path, marker: Path) -> None:
    from transformers import AutoTokenizer
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert "auto_map" not in config
    assert tokenizer_class_from_name(config["tokenizer_class"]) is not None  # transformers' own class
    write(folder / "evil.py", (folder.parent / "model" / "evil.py").read_text())  # dropped beside it later
    AutoTokenizer.from_pretrained(folder, trust_remote_code=True)  # what its card says to run
    assert not marker.exists()


@pytest.mark.both_cpus
def test_a_foreign_tokenizer_auto_map_is_not_carried_into_exported_or_trained_folders(tmp_path, caplog):
    """Another project's auto_map in tokenizer_config.json (its tokenizer code beside it) stays out of the
    folder ode-export (with a warning) or ode-train writes, so that the card's own
    AutoTokenizer.from_pretrained(trust_remote_code=True) never runs that code: a saved tokenizer names
    transformers' own fast class and carries no auto_map."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    marker = _foreign_tokenizer(folder, "EvilTokenizer")
    with caplog.at_level(logging.WARNING):
        export_for_hub(folder, tmp_path / "exported")
    assert "tokenizer_config.json: dropped auto_map" in caplog.text and "'EvilTokenizer'" in caplog.text
    _assert_standard_tokenizer(tmp_path / "exported", marker)
    # ode-train loads a tokenizer of transformers' own class (another one needs the remote code: refused there),
    # and saves it without the auto_map
    _foreign_tokenizer(folder, "PreTrainedTokenizerFast")
    src, tgt = corpus(tmp_path / "data")
    train_run(tmp_path / "trained", "--model_name_or_path", str(folder), "--train_file", f"{src},{tgt}",
              "--max_steps", "1")  # fmt: skip
    config = json.loads((tmp_path / "trained" / "tokenizer_config.json").read_text())
    assert "auto_map" not in config
    assert not marker.exists()


@pytest.mark.both_cpus
@pytest.mark.parametrize(
    ("name", "change", "said"),
    [
        ("generation_config.json", {"max_length": -1}, ": max_length -1 is not a whole number of at least 1; "),
        ("generation_config.json", {"num_beams": 0}, ": num_beams 0 is not a whole number of at least 1; "),
        ("generation_config.json", {"length_penalty": "abc"}, ": length_penalty 'abc' is not a number; "),
        ("tokenizer_config.json", [], " holds a JSON list, not an object of tokenizer fields; copy it again"),
        ("tokenizer_config.json", {"eos_token": 7}, ": eos_token (a string) is of another type; copy it again"),
        ("tokenizer.json", {"added_tokens": None}, ": added_tokens (a list) is missing or of another type; copy it"),
        ("tokenizer.json", {"model": {"type": "BPE", "vocab": 3}}, " is not a tokenizer ("),
        ("tokenizer.json", [], " holds a JSON list, not an object of tokenizer fields; copy it again"),
    ],
    ids=["max_length -1", "num_beams 0", "length_penalty abc", "tokenizer_config list", "eos_token number",
         "tokenizer.json without added_tokens", "tokenizer.json model of another shape", "tokenizer.json list"],
)  # fmt: skip
def test_a_generation_config_or_tokenizer_file_of_the_wrong_shape_is_named(tmp_path, name, change, said):
    """Valid JSON of the wrong shape in generation_config.json, tokenizer_config.json or tokenizer.json is
    refused by ode-translate and ode-train naming the file and what is wrong, not by a traceback from deep
    inside (`'list' object has no attribute 'get'`, `KeyError: 'added_tokens'`) nor by a message that names no
    file."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    path = folder / name
    if isinstance(change, dict):
        data = json.loads(path.read_text(encoding="utf-8"))
        data.update(change)
        data = {k: v for k, v in data.items() if v is not None}
    else:
        data = change
    path.write_text(json.dumps(data), encoding="utf-8")
    message = f"^{re.escape(str(path) + said)}"
    src = write(tmp_path / "in.txt", "the dog\n")
    assert_translate_and_train_refuse(folder, src, tmp_path / "out", message)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("beams", [-3, "4", [4]], ids=["negative", "string", "list"])
def test_a_bad_num_beams_is_named_before_it_chooses_a_backend(tmp_path, capsys, monkeypatch, refused, beams):
    """num_beams -3, "4" or [4] in generation_config.json is refused with exit code 2 in one line naming the
    file and the fix, by ode-translate and ode-export alike: the config is checked before the backend choice
    takes log2 of it (a "math domain error" or a TypeError)."""
    folder = tmp_path / "model"
    save_tiny_folder(folder)
    path = folder / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_beams": beams}), encoding="utf-8")
    said = (
        f"{path}: num_beams {beams!r} is not a whole number of at least 1; correct it, or remove the field to decode "
        "with the default"
    )
    source = write(tmp_path / "in.txt", "the dog\n")
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    for name, main, argv in (
        ("ode-translate", cli.translate, [str(folder), "--input", str(source), "--no_progress"]),
        ("ode-export", cli.export, [str(folder), str(tmp_path / "exported")]),
    ):
        monkeypatch.setattr(sys, "argv", [name, *argv])
        capsys.readouterr()
        assert refused(main) == f"{name}: error: {said}\n"
    assert not (tmp_path / "exported").exists()


def test_an_export_records_its_weights_digest_and_a_load_of_two_exports_is_refused(
    tmp_path, caplog, monkeypatch
):
    """A reader loading while `ode-export --overwrite` replaces the folder can take one export's config with
    another's weights. An export records the digest of its weights in model.safetensors' metadata and in
    config.json, generation_config.json and tokenizer_config.json; the model's own from_pretrained (remote
    code too) checks it, loads again once, then refuses in one line."""
    import shutil

    from transformers import PreTrainedModel
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    from modeling_ode.weights_integrity import weights_digest

    save_tiny_folder(tmp_path / "A")
    save_tiny_folder(tmp_path / "B", weight_scale=3)
    a, b = export_for_hub(tmp_path / "A", tmp_path / "EA"), export_for_hub(tmp_path / "B", tmp_path / "EB")
    digests = {folder: weights_digest(folder / "model.safetensors") for folder in (a, b)}
    for folder, digest in digests.items():
        for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
            assert json.loads((folder / name).read_text(encoding="utf-8"))["weights_digest"] == digest
    assert len(set(digests.values())) == 2 and all(len(digest) == 64 for digest in digests.values())
    again = export_for_hub(
        tmp_path / "A", tmp_path / "EA2"
    )  # a digest of the weights: the same for the same ones
    assert weights_digest(again / "model.safetensors") == digests[a]
    assert_bit_identical(weights(a), weights(tmp_path / "A"))  # the weights themselves untouched
    # the folder's own code, which a plain transformers user runs (trust_remote_code=True)
    remote = get_class_from_dynamic_module(
        "modeling_ode_transformer.ODETransformerForConditionalGeneration", a
    )
    assert remote.__module__.startswith("transformers_modules")

    mixed = (
        tmp_path / "mixed"
    )  # what a reader took: config.json of one export, model.safetensors of the other
    shutil.copytree(a, mixed)
    shutil.copy2(b / "model.safetensors", mixed / "model.safetensors")
    message = (
        f"{mixed}: config.json and generation_config.json record the weights digest {digests[a][:12]}, but its "
        f"model.safetensors holds {digests[b][:12]}, loaded twice: its files come from two exports; load it again "
        "once the export writing it has finished, or export the model again"
    )
    for load in (ODETransformerForConditionalGeneration.from_pretrained, translate.load_for_generation):
        with pytest.raises(OSError, match=f"^{re.escape(message)}$"):
            load(str(mixed))
    with pytest.raises(OSError, match=f"^{re.escape(message)}$"):
        remote.from_pretrained(mixed)

    original = PreTrainedModel.from_pretrained.__func__
    loads = []

    def export_finishes_after_the_first_load(cls, *args, **kwargs):
        loads.append(original(cls, *args, **kwargs))
        if len(loads) == 1:
            shutil.copytree(b, mixed, dirs_exist_ok=True)  # the folder is now the new export, whole
        return loads[-1]

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(export_finishes_after_the_first_load))
    with caplog.at_level(logging.WARNING):
        model = ODETransformerForConditionalGeneration.from_pretrained(mixed)
    assert len(loads) == 2 and "it was replaced while it loaded; loading it again" in caplog.text
    assert model.config.weights_digest == digests[b]
    assert_bit_identical(dict(model.state_dict()), dict(loads[1].state_dict()))

    # The weights read from another export's file, which a third export (of the first model again) replaced
    # before the check: the file after the load agrees with the config, so only the file read before the load
    # tells that the weights loaded are not the config's.
    swapped = tmp_path / "swapped"
    shutil.copytree(a, swapped)
    loads.clear()

    def replace(source: Path) -> None:  # as an export replaces it: a new file, renamed into place
        shutil.copy2(source, swapped / ".incoming")
        os.replace(swapped / ".incoming", swapped / "model.safetensors")

    def swapped_during_the_load(cls, *args, **kwargs):
        replace(b / "model.safetensors")
        loads.append(original(cls, *args, **kwargs))
        replace(a / "model.safetensors")
        return loads[-1]

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(swapped_during_the_load))
    swap = (
        f"{swapped}: its model.safetensors is another file after the load than before it (weights digest "
        f"{digests[a][:12]} before, {digests[a][:12]} after)"
    )
    with caplog.at_level(logging.WARNING), pytest.raises(OSError) as refusal:
        ODETransformerForConditionalGeneration.from_pretrained(swapped)
    assert str(refusal.value) == (
        f"{swap}, loaded twice: its files come from two exports; load it again once the export writing it has "
        "finished, or export the model again"
    )
    assert f"{swap}: it was replaced while it loaded; loading it again" in caplog.text
    assert len(loads) == 2 and loads[0].config.weights_digest == digests[a]
    held = loads[0].state_dict()  # what the check stands between: the config of one, the weights of the other
    assert_bit_identical({name: held[name] for name in weights(b)}, weights(b))

    def swapped_during_the_first_load(cls, *args, **kwargs):
        if loads:
            return original(cls, *args, **kwargs)
        return swapped_during_the_load(cls, *args, **kwargs)

    loads.clear()
    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(swapped_during_the_first_load))
    # loaded again, the file holding still this time
    model = ODETransformerForConditionalGeneration.from_pretrained(swapped)
    held = model.state_dict()
    assert_bit_identical({name: held[name] for name in weights(a)}, weights(a))
    monkeypatch.undo()

    # the tokenizer of the other one
    shutil.copy2(a / "tokenizer_config.json", mixed / "tokenizer_config.json")
    said = f"{mixed}: tokenizer_config.json records the weights digest {digests[a][:12]}, but config.json "
    with pytest.raises(ValueError, match=f"^{re.escape(said)}{digests[b][:12]}, loaded twice"):
        translate.load_for_generation(str(mixed))

    saved = tmp_path / "saved"  # weights saved anew are not the export's: no digest carried over
    model.save_pretrained(saved)
    assert json.loads((saved / "config.json").read_text(encoding="utf-8"))["weights_digest"] is None
    assert "weights_digest" not in (saved / "generation_config.json").read_text(encoding="utf-8")
    ODETransformerForConditionalGeneration.from_pretrained(saved)
