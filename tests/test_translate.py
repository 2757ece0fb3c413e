"""ode_transformer.translate: length batching, input order, stdin/stdout, and agreement with plain generate()."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import time

import pytest
import torch
from tiny_folder import SOURCES, save_tiny_folder
from tiny_run import (
    assert_one_line,
    command,
    interrupt,
    last_line,
    read_until,
    start,
    write,
)

import ode_transformer.loading
import ode_transformer.train.arguments
import ode_transformer.train.evaluation
import ode_transformer.train.run
import ode_transformer.train.saved_model
import ode_transformer.train.trainer
from ode_transformer import cli, translate
from ode_transformer.files import read_lines


def test_length_batches_longest_first():
    lengths = [3, 1, 3, 2, 5]
    assert translate.length_batches(lengths, 2) == [[4, 0], [2, 3], [1]]
    assert translate.length_batches([], 4) == []


def test_stdin_to_stdout_in_input_order(tmp_path, monkeypatch, capsys):
    model, tokenizer = save_tiny_folder(tmp_path, weight_scale=3)
    stdin = "".join(s + "\n" for s in SOURCES).encode("utf-8")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    translate.main(
        [str(tmp_path), "--batch_size", "2", "--num_beams", "3", "--max_new_tokens", "5", "--no_progress"]
    )
    with torch.no_grad():
        one_by_one = [
            model.generate(**tokenizer([s], return_tensors="pt"), num_beams=3, max_new_tokens=5)[0]
            for s in SOURCES
        ]
    expected = [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in one_by_one]
    expected[SOURCES.index("")] = ""  # an empty input line gets an empty output line
    assert len(set(expected)) > 1
    assert capsys.readouterr().out.split("\n") == [*expected, ""]


def test_an_overlong_lm_prompt_keeps_its_end_and_leaves_room_for_the_continuation(tmp_path, caplog):
    """A causal LM continues the end of its prompt: an overlong prompt is cut at its start (after `<s>`), whatever
    the tokenizer's own truncation side, to the model's 128 positions less the new tokens, and generates what the
    model generates from exactly those ids; without max_new_tokens anywhere, transformers' default of 20 new tokens.
    128 is the trained length, not a limit: 127 new tokens leave the prompt <s> and its last token. max_new_tokens 0
    would generate nothing: refused."""
    model, tokenizer = save_tiny_folder(tmp_path, causal=True, weight_scale=3)
    tokenizer.truncation_side = "right"
    prompt = " ".join(f"w{i % 7} dog{i % 5}" for i in range(150))
    full = tokenizer(prompt)["input_ids"]
    assert full[0] == tokenizer.bos_token_id and len(full) > 128
    assert model.generation_config.max_new_tokens is None and model.generation_config.max_length is None
    for new_tokens in (8, None, 127):
        kept = [tokenizer.bos_token_id, *full[-max(128 - (new_tokens or 20) - 1, 1) :]]
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ode_transformer.translate"):
            (text,) = translate.generate_texts(
                model, tokenizer, [prompt], max_new_tokens=new_tokens, num_beams=1
            )
        assert f"1 input line(s) longer than {len(kept)} tokens were truncated (the model's " \
               f"max_position_embeddings 128 less max_new_tokens {new_tokens or 20})" in caplog.text  # fmt: skip
        with torch.no_grad():
            expected = model.generate(
                torch.tensor([kept]), max_new_tokens=new_tokens or 20, num_beams=1, do_sample=False
            )
        assert text == tokenizer.decode(expected[0, len(kept) :], skip_special_tokens=True).strip() != ""
    assert tokenizer.truncation_side == "right"  # restored
    with pytest.raises(ValueError, match="^max_new_tokens 0: give a positive number"):
        translate.generate_texts(model, tokenizer, [prompt], max_new_tokens=0)


def test_api_input_mistakes_are_named(tmp_path):
    """generate_texts as a user calls it: a single string (which list() would split into characters), a
    non-string item, several returns per input (which would be matched to the wrong inputs), a batch size or
    source length of 0 (silently one batch, or the default) or no new tokens. More new tokens than the model's
    trained length (128) are no mistake: its positions have no limit. An empty generator gives no outputs, like an
    empty list."""
    model, tokenizer = save_tiny_folder(tmp_path, weight_scale=3)
    cases = [
        (TypeError, "texts is one string", "the dog", {}),
        (TypeError, r"texts\[1\] is NoneType, not a string", ["the dog", None], {}),
        (ValueError, "num_return_sequences 2: this returns one output per input", SOURCES,
         {"num_beams": 2, "num_return_sequences": 2}),
        (ValueError, "batch_size 0: give a positive number", SOURCES, {"batch_size": 0}),
        (ValueError, "max_source_length 0: give a positive number", SOURCES, {"max_source_length": 0}),
        (ValueError, "max_new_tokens 0: give a positive number", SOURCES, {"max_new_tokens": 0}),
    ]  # fmt: skip
    for error, message, texts, kwargs in cases:
        with pytest.raises(error, match=message):
            translate.generate_texts(model, tokenizer, texts, **kwargs)
    assert translate.generate_texts(model, tokenizer, (text for text in [])) == []
    generated = translate.generate_texts(model, tokenizer, (text for text in SOURCES[:2]), max_new_tokens=140)
    assert generated == translate.generate_texts(model, tokenizer, SOURCES[:2], max_new_tokens=140)
    if not torch.cuda.is_available():  # named, not torch's "Torch not compiled with CUDA enabled"
        with pytest.raises(ValueError, match="device cuda: this torch has no CUDA device"):
            translate.load_for_generation(str(tmp_path), device="cuda")


def test_a_byte_order_mark_is_not_part_of_the_first_input(tmp_path, capsys):
    """Windows editors start UTF-8 files with a byte-order mark; it is not tokenized into the first line: a
    marked file translates as the plain one does."""
    save_tiny_folder(tmp_path / "model", weight_scale=3)
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_text("the dog runs\nzwei Hunde\n", encoding="utf-8")
    marked.write_text("the dog runs\nzwei Hunde\n", encoding="utf-8-sig")
    assert marked.read_bytes().startswith(b"\xef\xbb\xbf")
    outputs = []
    for source in (plain, marked):
        translate.main([str(tmp_path / "model"), "--input", str(source), "--num_beams", "1", "--no_progress"])
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0].count("\n") == 2


def test_a_hypothesis_with_a_line_break_stays_on_one_line(tmp_path):
    """A byte-level vocabulary can write a line break; written as is, it would shift every later hypothesis."""
    _, tokenizer = save_tiny_folder(tmp_path / "model")
    ids = tokenizer(["the dog\nruns\u2028far\r.", "a cat"])["input_ids"]
    assert translate.decode(tokenizer, ids) == ["the dog runs far .", "a cat"]


@pytest.mark.parametrize(
    ("device", "gpus", "mps", "fragment"),
    [
        ("cuda:2", 2, False, "there are 2 CUDA device(s), numbered from 0; use cuda:0 or cpu"),
        ("cuda:1", 2, False, None),
        ("cuda", 0, False, "this torch has no CUDA device"),
        ("mps", 0, False, "this machine has no Apple MPS device"),
        ("mps", 0, True, None),
        ("cpu", 0, False, None),
    ],
)
def test_device_problem_names_a_missing_gpu(monkeypatch, device, gpus, mps, fragment):
    """A GPU index past the count, or mps on a machine without it, is named before the model is moved."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    problem = translate.device_problem(device)
    assert problem is None if fragment is None else fragment in problem


@pytest.mark.both_cpus
def test_translate_names_bad_utf8_on_stdin_and_a_missing_cuda(tmp_path, monkeypatch, refused):
    save_tiny_folder(tmp_path / "model")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"a dog\n\xff cat\n")))
    with pytest.raises(ValueError, match="^standard input, line 2: not UTF-8 text"):
        translate.main([str(tmp_path / "model"), "--no_progress"])
    if not torch.cuda.is_available():
        error = refused(translate.main, [str(tmp_path / "model"), "--device", "cuda"])
        assert "--device cuda: this torch has no CUDA device" in error


@pytest.mark.both_cpus
def test_translate_empty_input_overlong_line_and_bad_folders(tmp_path, caplog, monkeypatch):
    folder = tmp_path / "model"
    save_tiny_folder(folder, weight_scale=3)
    empty, output = write(tmp_path / "empty.txt", ""), tmp_path / "out.txt"
    translate.main([str(folder), "--input", str(empty), "--output", str(output), "--no_progress"])
    assert output.read_text() == ""

    long = write(tmp_path / "long.txt", "the dog " * 200 + "\nthe cat\n")
    with caplog.at_level(logging.WARNING, logger="ode_transformer.translate"):
        translate.main([str(folder), "--input", str(long), "--output", str(output), "--no_progress"])
    assert (
        "1 input line(s) longer than 128 tokens were truncated (the model's max_position_embeddings"
        in caplog.text
    )
    assert "--max_source_length" in caplog.text
    assert len(output.read_text().split("\n")) == 3  # two lines, each ended by a newline
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ode_transformer.translate"):
        translate.main([str(folder), "--input", str(long), "--output", str(output), "--no_progress",
                        "--max_source_length", "4"])  # fmt: skip
    assert "were truncated (--max_source_length 4); raise --max_source_length" in caplog.text

    with pytest.raises(
        FileNotFoundError, match=f"^no model folder {tmp_path}/missing/model: give the folder"
    ):
        translate.main([str(tmp_path / "missing" / "model"), "--input", str(empty)])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    with pytest.raises(FileNotFoundError, match=f"^{folder} holds no tokenizer .*: copy tokenizer.json"):
        translate.main([str(folder), "--input", str(empty)])

    # a run that has not finished: checkpoints, no final model (named so, not as a folder without a tokenizer)
    run_folder = tmp_path / "run"
    save_tiny_folder(run_folder / "checkpoint-4")
    (run_folder / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": 4}')
    with pytest.raises(
        FileNotFoundError, match=f"^{run_folder} holds checkpoints \\(checkpoint-4\\) but no final model"
    ):
        translate.main([str(run_folder), "--input", str(empty)])
    # a mistyped folder beside existing ones is a path, not a Hub id to try for a minute
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="^no model folder run/modle"):
        translate.main(["run/modle", "--input", str(empty)])
    # ... but a Hub id whose owner happens to name a local folder without models stays a Hub id
    (tmp_path / "someuser").mkdir()
    ode_transformer.loading.check_model_folder("someuser/ode-base")


def test_translate_on_a_full_disk_keeps_the_old_output(tmp_path):
    """On a full disk ode-translate exits 2 with one line naming the output and to free some space; the old
    output stays whole, neither truncated nor cut off mid-word, and no temporary file is left."""
    save_tiny_folder(tmp_path / "model", weight_scale=3)
    source = write(tmp_path / "in.txt", "".join(f"the dog number {i} runs in the park\n" for i in range(80)))
    output = write(tmp_path / "out.txt", "".join(f"old line {i}\n" for i in range(80)))
    argv = [str(tmp_path / "model"), "--input", str(source), "--output", str(output), "--no_progress"]
    process = start(command("ode-translate", *argv, limit=40))  # 80 outputs take 80 newlines at least
    _, stderr = process.communicate(timeout=300)
    stderr = stderr.decode()
    assert process.returncode == 2, stderr
    last = assert_one_line(
        stderr, f"ode-translate: error: [Errno 28] no space left on device while saving {output}"
    )
    assert "free some space" in last
    assert output.read_text() == "".join(f"old line {i}\n" for i in range(80))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "model", "out.txt"]  # no temporary left


def test_translate_a_second_writer_is_refused_and_ctrl_c_keeps_the_old_output(
    tmp_path, monkeypatch, capsys, refused
):
    """A second ode-translate into the --output another one is writing is refused in one line naming the first
    one's pid, rather than both exiting 0 and one output lost; Ctrl-C ends the first with exit code 130 and
    one line saying the output keeps its old content, not a KeyboardInterrupt traceback; the lock files are
    gone."""
    save_tiny_folder(tmp_path / "model", weight_scale=3)
    source = write(tmp_path / "in.txt", "the dog runs in the park\n" * 20000)  # minutes of decoding
    output = write(tmp_path / "out.txt", "old\n")
    argv = [str(tmp_path / "model"), "--input", str(source), "--output", str(output), "--batch_size", "1"]
    first = start(command("ode-translate", *argv))
    try:
        seen = read_until(first, b"sent/s]")  # the progress bar: decoding has begun
        monkeypatch.delenv("ODE_TRACEBACK", raising=False)
        monkeypatch.setattr(sys, "argv", ["ode-translate", *argv, "--no_progress"])
        capsys.readouterr()
        assert refused(cli.translate) == (
            f"ode-translate: error: {output} is in use by another process (pid {first.pid}); "
            "wait for it to finish or stop it, or choose another --output.\n"
        )
        code, stderr = interrupt(first, seen)
    finally:
        first.kill()
    assert code == 130
    assert assert_one_line(stderr, "ode-translate: interrupted; ") == (
        f"ode-translate: interrupted; nothing was written to {output} (it keeps its old content); run the "
        "command again to translate the input"
    )
    assert output.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "model", "out.txt"]  # lock files gone


def test_translate_max_new_tokens_caps_without_the_both_set_warning(tmp_path, monkeypatch):
    """`--max_new_tokens N` caps the new tokens at N, and `ode-translate MODEL --max_new_tokens N` does so
    without transformers' warning that both max_new_tokens and max_length (the saved generation config's) are
    set."""
    import transformers.generation.utils

    save_tiny_folder(tmp_path / "model", weight_scale=3)  # its generation config has max_length 9
    warnings = []
    monkeypatch.setattr(
        transformers.generation.utils.logger,
        "warning",
        lambda message, *a, **k: warnings.append(str(message)),
    )
    source = write(tmp_path / "in.txt", "the dog runs in the park\na cat\n")
    model, tokenizer = translate.load_for_generation(str(tmp_path / "model"), "cpu")
    ids = [tokenizer(line)["input_ids"] for line in read_lines(source)]
    for new_tokens in (2, 5):
        outputs = translate.generate_ids(model, ids, num_beams=1, max_new_tokens=new_tokens)
        longest = max(len(output) for output in outputs)
        assert longest == 1 + new_tokens  # the decoder's start token + new tokens (the random model runs on)
    translate.main([str(tmp_path / "model"), "--input", str(source), "--output", str(tmp_path / "out.txt"),
                    "--max_new_tokens", "3", "--no_progress"])  # fmt: skip
    assert not [w for w in warnings if "max_new_tokens" in w], warnings


def test_translate_into_one_file_by_two_names_takes_one_lock(tmp_path):
    """Two ode-translate writing one file by two names (a link, `dir/../file`) take one lock: the second is
    refused with exit code 2, naming the holder's pid, and the file keeps its content, rather than the last
    writer winning."""
    from ode_transformer.files import lock_output

    save_tiny_folder(tmp_path / "model", weight_scale=3)
    source = write(tmp_path / "in.txt", "the dog runs\n")
    output = write(tmp_path / "out.txt", "old\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.txt").symlink_to(output)
    for held, name in ((tmp_path / "link.txt", output), (output, tmp_path / "sub" / ".." / "out.txt")):
        with lock_output(held, "--output"):
            argv = [str(tmp_path / "model"), "--input", str(source), "--output", str(name), "--no_progress"]
            process = start(command("ode-translate", *argv))
            _, stderr = process.communicate(timeout=300)
        assert process.returncode == 2 and last_line(stderr).startswith(
            f"ode-translate: error: {name} is in use by another process (pid {os.getpid()});"
        )
        assert output.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "link.txt", "model", "out.txt", "sub"]


def test_two_translations_into_one_file_by_two_names_race_to_one_whole_output(tmp_path):
    """Two ode-translate started at once into one --output by two names (OUT/out.txt, and LINK/alias.txt where
    LINK links to OUT and alias.txt to out.txt), twice: one takes the file, the other is refused in one line
    (exit code 2) while it does, and the file is the whole output of the one that exited 0, never interleaved or
    cut off. Each reads its input from a pipe that is fed only once the other has ended, so that the two
    always overlap."""
    model = str(tmp_path / "model")
    save_tiny_folder(tmp_path / "model", weight_scale=3)
    out, link = tmp_path / "out", tmp_path / "link"
    out.mkdir()
    link.symlink_to("out")
    (out / "alias.txt").symlink_to("out.txt")
    texts = {  # one sentence repeated, in numbers of their own: the output's length says which run wrote it
        "A": "the dog runs in the park\n" * 30,
        "B": "a cat sleeps\n" * 47,
    }
    names = {"A": out / "out.txt", "B": link / "alias.txt"}

    def translation(argv: list[str]) -> subprocess.Popen:
        return start(command("ode-translate", model, *argv, "--no_progress"))

    for round_ in range(2):
        pipes = {name: tmp_path / f"{name}{round_}.fifo" for name in texts}
        racers = {}
        for name, pipe in pipes.items():
            os.mkfifo(pipe)
            racers[name] = translation(["--input", str(pipe), "--output", str(names[name])])
        try:
            deadline = time.monotonic() + 300
            while all(racer.poll() is None for racer in racers.values()):  # the winner waits on its pipe
                assert time.monotonic() < deadline, "neither translation was refused: both hold the file"
                time.sleep(0.2)
            (loser,) = [name for name, racer in racers.items() if racer.returncode is not None]
            (winner,) = set(texts) - {loser}
            with open(pipes[winner], "w", encoding="utf-8") as feed:
                feed.write(texts[winner])
            assert racers[winner].wait(timeout=300) == 0, racers[winner].communicate()[1].decode()[-3000:]
        finally:
            for racer in racers.values():
                racer.kill()
        stderr = racers[loser].communicate()[1]
        assert racers[loser].returncode == 2 and last_line(stderr) == (
            f"ode-translate: error: {names[loser]} is in use by another process (pid {racers[winner].pid}); "
            "wait for it to finish or stop it, or choose another --output."
        )
        # the winner's whole output: its number of lines, one translation repeated, none of the other's lines
        lines = (out / "out.txt").read_text(encoding="utf-8").splitlines()
        assert len(lines) == texts[winner].count("\n") and len(set(lines)) == 1
        assert sorted(p.name for p in out.iterdir()) == ["alias.txt", "out.txt"]  # no lock or temporary left
        assert (out / "alias.txt").is_symlink()


@pytest.mark.both_cpus
def test_an_empty_input_line_gets_an_empty_output_line_and_a_warning(tmp_path, caplog):
    """An empty (or blank) input line to ode-translate gets an empty output line, not a generated sentence,
    and a warning names the empty lines."""
    folder = tmp_path / "model"
    save_tiny_folder(folder, weight_scale=3)
    alone = tmp_path / "alone.txt"
    line = "a cat sleeps on the warm mat\n"
    source = write(tmp_path / "in.txt", line)
    translate.main([str(folder), "--input", str(source), "--output", str(alone), "--no_progress"])
    source = write(tmp_path / "mixed.txt", f"\n{line}   \n")
    output = tmp_path / "out.txt"
    with caplog.at_level(logging.WARNING, logger="ode_transformer.translate"):
        translate.main([str(folder), "--input", str(source), "--output", str(output), "--no_progress"])
    assert output.read_text().split("\n") == ["", alone.read_text().strip(), "", ""]
    assert alone.read_text().strip()  # the model writes something for a real line
    assert (
        "2 of 3 input line(s) are empty (line numbers 1, 3): each gets an empty output line, not a translation"
        in caplog.text
    )
    blank = write(tmp_path / "blank.txt", "\n \n")  # nothing to translate at all
    translate.main([str(folder), "--input", str(blank), "--output", str(output), "--no_progress"])
    assert output.read_text() == "\n\n"


def test_a_plain_folder_decodes_quietly_and_a_missing_one_is_named_before_any_backend_line(
    tmp_path, caplog, monkeypatch
):
    """`ode-translate MODEL` on a trained folder without ONNX graphs (the usual case, where the table names ONNX)
    decodes with PyTorch and warns of nothing: the choice is one short INFO line naming the command that writes
    the graphs. A folder that does not exist is named as such, with no line about its graphs before it."""
    monkeypatch.setattr(translate, "FASTEST", {(1, 1): {"float32": "onnx", "int8": "onnx"}})
    folder = tmp_path / "model"
    save_tiny_folder(folder, weight_scale=3)
    source, output = write(tmp_path / "in.txt", "the dog\n"), tmp_path / "out.txt"
    with caplog.at_level(logging.INFO, logger="ode_transformer.translate"):
        translate.main([str(folder), "--input", str(source), "--output", str(output), "--no_progress"])
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "ode_transformer.translate"] == [
        (
            logging.INFO,
            f"backend pytorch: no ONNX graphs in {folder} (`ode-export {folder} OUT --onnx` writes them)",
        )
    ]
    assert len(output.read_text().splitlines()) == 1
    caplog.clear()
    for backend in ("auto", "onnx"):
        with (
            caplog.at_level(logging.INFO, logger="ode_transformer.translate"),
            pytest.raises(FileNotFoundError, match=f"^no model folder {tmp_path}/missing/model: give"),
        ):
            translate.main(
                [str(tmp_path / "missing" / "model"), "--input", str(source), "--backend", backend]
            )
        assert not caplog.records


def test_max_length_means_generates_and_excludes_max_new_tokens(tmp_path, capsys, refused):
    """`--max_length N`, as HF users pass it, is generate()'s max_length: the whole generated sequence, the
    decoder's start token (a causal LM's prompt) included, so the outputs are plain generate(max_length=N)'s;
    given with --max_new_tokens, which caps the new tokens only, it is refused naming the difference."""
    folder = tmp_path / "model"
    model, tokenizer = save_tiny_folder(folder, weight_scale=3)  # its generation config has max_length 9
    lines = ["the dog runs in the park", "a cat sleeps on the warm mat"]
    source = write(tmp_path / "in.txt", "".join(line + "\n" for line in lines))
    for max_length in (3, 6):
        translate.main(
            [str(folder), "--input", str(source), "--max_length", str(max_length), "--no_progress"]
        )
        with torch.no_grad():
            ids = [
                model.generate(**tokenizer([s], return_tensors="pt"), max_length=max_length)[0] for s in lines
            ]
        assert max(len(row) for row in ids) == max_length  # the random model runs on to the cap
        expected = [tokenizer.decode(row, skip_special_tokens=True).strip() for row in ids]
        assert capsys.readouterr().out.splitlines() == expected
    error = refused(
        translate.main, [str(folder), "--input", str(source), "--max_length", "5", "--max_new_tokens", "3"]
    )
    assert "--max_length and --max_new_tokens both cap the output: --max_length counts the whole" in error
    with pytest.raises(ValueError, match="^max_length and max_new_tokens both cap the output"):
        translate.generate_texts(model, tokenizer, lines, max_length=5, max_new_tokens=3)

    # a causal LM: max_length counts the prompt, as generate() does
    lm, lm_tokenizer = save_tiny_folder(tmp_path / "lm", causal=True, weight_scale=3)
    prompt = "the dog runs in the park"
    prompt_ids = lm_tokenizer([prompt], return_tensors="pt")
    with torch.no_grad():
        generated = lm.generate(
            **prompt_ids, max_length=prompt_ids["input_ids"].shape[1] + 4, do_sample=False
        )
    continuation = generated[0, prompt_ids["input_ids"].shape[1] :]
    assert len(continuation) == 4
    assert translate.generate_texts(
        lm, lm_tokenizer, [prompt], max_length=prompt_ids["input_ids"].shape[1] + 4
    ) == [lm_tokenizer.decode(continuation, skip_special_tokens=True).strip()]


def test_a_hub_id_the_hub_cannot_serve_is_said_in_words(tmp_path, monkeypatch):
    """Offline with no cached copy, a Hub id is refused in one line naming it, why in plain words (the Hub cannot
    be reached, or HF_HUB_OFFLINE, set by the user) and the ways forward: a local folder, or a cache copied here
    with HF_HUB_OFFLINE=1. No exception class name (OfflineModeIsEnabled) is quoted."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    source = write(tmp_path / "in.txt", "the dog\n")
    for unreachable, why, fix in (
        (True, "the Hugging Face Hub cannot be reached from this machine", "set HF_HUB_OFFLINE=1"),
        (False, "HF_HUB_OFFLINE is set and no copy of nobody/ode-none is cached", "unset HF_HUB_OFFLINE"),
    ):
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        if unreachable:  # what ode-translate's check of the Hub sets beside HF_HUB_OFFLINE
            monkeypatch.setenv(cli.HUB_UNREACHABLE_ENV, "1")
        else:
            monkeypatch.delenv(cli.HUB_UNREACHABLE_ENV, raising=False)
        with pytest.raises(FileNotFoundError) as error:
            translate.main(["nobody/ode-none", "--input", str(source), "--no_progress"])
        message = str(error.value)
        assert message.startswith(f"nobody/ode-none is no local folder, and {why}"), message
        assert "give a local model folder" in message and fix in message, message
        assert "OfflineModeIsEnabled" not in message and "\n" not in message
