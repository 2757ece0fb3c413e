"""Model card, Hub export with remote code (loaded where `modeling_ode` cannot be imported), dry-run push."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_folder import save_tiny_folder
from tiny_run import (
    ROOT,
    command,
    last_line,
    snapshot,
    start,
    weights,
    write,
)

from modeling_ode import ODETransformerForConditionalGeneration
from ode_transformer import cli
from ode_transformer.files import read_lines
from ode_transformer.hub.export import export_for_hub
from ode_transformer.train import averaging

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from huggingface_hub import ModelCard  # noqa: E402
from package_free import run_package_free  # noqa: E402

import modeling_ode  # noqa: E402
from modeling_ode import (  # noqa: E402
    ODETransformerConfig,
    ODETransformerForCausalLM,
)
from ode_transformer import config_in_words, model_card_writer  # noqa: E402
from ode_transformer.card_metrics import load_metrics  # noqa: E402
from ode_transformer.hub import push  # noqa: E402
from ode_transformer.hub.model_card import main as model_card_main  # noqa: E402
from ode_transformer.model_card_writer import CITATION, validate_card_locally, write_model_card  # noqa: E402
from ode_transformer.train.data import data_root  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PAPER = (
    data_root().parent / "paper" / "ode_transformer_acl2022.tex"
)  # the paper's source next to the shared data


def tiny_seq2seq(**overrides) -> ODETransformerForConditionalGeneration:
    torch.manual_seed(0)
    config = ODETransformerConfig.from_preset("tiny", **overrides)
    return ODETransformerForConditionalGeneration(config).eval()


def real_metrics(shared_data: Path) -> dict:
    """A real sacreBLEU/chrF score: the first newstest2014 German references against a perturbed copy."""
    sacrebleu = pytest.importorskip("sacrebleu")
    refs = [line.strip() for line in read_lines(shared_data / "wmt" / "en-de" / "newstest2014.de.gz")[:20]]
    hyps = [
        " ".join(w for j, w in enumerate(line.split()) if j % 4 != 3) for line in refs
    ]  # drop every 4th word
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score, chrf_score = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    return {
        "task": "translation",
        "language": ["en", "de"],
        "dataset": {
            "name": "WMT14 English-German (newstest2014)",
            "id": "wmt/wmt14",
            "config": "de-en",
            "split": "test",
        },
        "results": [
            {
                "metric": "sacrebleu",
                "name": "BLEU",
                "value": round(bleu_score.score, 2),
                "signature": bleu.get_signature().format(),
            },
            {
                "metric": "chrf",
                "name": "chrF",
                "value": round(chrf_score.score, 2),
                "signature": chrf.get_signature().format(),
            },
        ],
        "training": {"data": "WMT14 En-De", "recipe": {"optimizer": "Adam (0.9, 0.997)", "lr": 0.002}},
        "decoding": {"num_beams": 4, "length_penalty": 0.6},
    }


# ----------------------------------------------------------------------------------------------------------
# Model card
# ----------------------------------------------------------------------------------------------------------


def test_citation_matches_paper():
    if not PAPER.is_file():
        pytest.skip("paper source not available")
    tex = PAPER.read_text(encoding="utf-8")
    title = re.search(r"\\title\{(.+?)\}\n", tex).group(1)
    assert title == model_card_writer.PAPER_TITLE
    assert title.replace("ODE Transformer", "{ODE} Transformer") in CITATION
    author_block = re.search(r"\\author\{(.+?)\\\\\s*\$\^\{1\}\$School", tex, re.S).group(1)
    for author in model_card_writer.PAPER_AUTHORS:
        assert author in author_block
        first, last = author.rsplit(" ", 1)
        assert f"{last}, {first}" in CITATION
    assert 'year = "2022"' in CITATION


def test_model_card_round_trip(tmp_path, shared_data):
    metrics = real_metrics(shared_data)
    model = tiny_seq2seq(ode_coefficient_scope="stack", encoder_layers=1)  # "1 layer", not "1 layers"
    model.save_pretrained(tmp_path)
    (tmp_path / "hub_metrics.json").write_text(json.dumps(metrics))

    path = write_model_card(tmp_path, tmp_path / "hub_metrics.json", repo_id="someone/ode-tiny")
    card = ModelCard.load(path)
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "translation"
    assert card.data.language == ["en", "de"] and card.data.model_name == "ode-tiny"
    results = {r.metric_type: r for r in card.data.eval_results}
    for expected in metrics["results"]:
        result = results[expected["metric"]]
        assert result.metric_value == expected["value"] and result.metric_value > 0
        assert result.metric_args == {"signature": expected["signature"]}
        assert (result.dataset_type, result.dataset_split, result.task_type) == (
            "wmt/wmt14",
            "test",
            "translation",
        )
        assert expected["signature"].replace("|", "\\|") in card.text
    params = sum(p.numel() for p in model.parameters())
    assert f"{params:,}" in card.text
    assert "second-order Runge-Kutta" in card.text and "one shared by all blocks" in card.text
    assert (
        "trust_remote_code=True" in card.text
        and "beam 4, length penalty 0.6: generation_config.json" in card.text
    )
    assert "@inproceedings{li-etal-2022-ode" in card.text and "Intended use and limitations" in card.text
    assert "**Encoder**: 1 layer;" in card.text and "1 layers" not in card.text
    assert "rejected" not in card.text and "pip install ode-transformer" not in card.text
    validate_card_locally(path)

    # the CLI writes the same card
    path.unlink()
    model_card_main([str(tmp_path), str(tmp_path / "hub_metrics.json"), "--repo-id", "someone/ode-tiny"])
    assert ModelCard.load(path).data.eval_results[0].metric_value == metrics["results"][0]["value"]


def test_metrics_schema_errors_name_the_fields():
    with pytest.raises(ValueError, match=r"'task'.*'results\[0\]\.value'.*\['id'\]"):
        load_metrics(
            {"dataset": {"name": "x", "split": "test"}, "results": [{"metric": "bleu", "value": "high"}]}
        )


def test_metrics_of_the_wrong_shape_are_schema_errors_naming_the_field(tmp_path):
    """Metrics of the wrong shape (a list at the top, a string for an object or a whole number) are schema
    errors naming the field, and invalid JSON names its file and says to fix it, rather than end deep inside
    the card's code (AttributeError, TypeError, a formatting crash) or in json's message that names no file;
    no card is written half-way."""
    good = {
        "task": "translation",
        "dataset": {"name": "WMT14", "id": "wmt/wmt14", "split": "test", "rows": 3003},
        "results": [{"metric": "sacrebleu", "value": 27.1}],
    }
    assert load_metrics(good).dataset["rows"] == 3003
    as_list = tmp_path / "list.json"
    as_list.write_text(json.dumps([good]))
    with pytest.raises(
        ValueError, match=r"list\.json does not follow the schema.*top level \(an object.*a list"
    ):
        load_metrics(as_list)
    string_dataset = {**good, "results": [{**good["results"][0], "dataset": "newstest2013"}]}
    with pytest.raises(ValueError, match=r"does not follow the schema.*'results\[0\]\.dataset' \(an object"):
        load_metrics(string_dataset)
    string_rows = {**good, "dataset": {**good["dataset"], "rows": "3003"}}
    with pytest.raises(ValueError, match=r"does not follow the schema.*'dataset\.rows' \(a whole number"):
        load_metrics(string_rows)
    folder = tmp_path / "model"
    tiny_seq2seq().save_pretrained(folder)
    with pytest.raises(ValueError, match=r"'dataset\.rows'"):  # the card is not written half-way
        write_model_card(folder, string_rows)
    assert not (folder / "README.md").exists()
    broken = tmp_path / "hub_metrics.json"
    broken.write_text('{"task": "translation",}')
    with pytest.raises(ValueError, match=r"metrics JSON .*hub_metrics\.json is not valid JSON.*fix the file"):
        load_metrics(broken)
    with pytest.raises(FileNotFoundError, match=r"absent\.json does not exist"):
        load_metrics(tmp_path / "absent.json")


def test_the_cards_limitations_name_the_split_that_was_scored(tmp_path):
    """The card's limitations say what its scores were computed on, as the results table does: one test set
    (a slice of it too), one validation set where no test split was scored, the count of sets where the results
    name several, and nothing of scores where there are none."""
    folder = tmp_path / "model"
    tiny_seq2seq().save_pretrained(folder)

    def limitations(dataset: dict | None, *others: dict) -> str:
        results = [{"metric": "sacrebleu", "value": 27.1}]
        results += [{"metric": "chrf", "value": 50.0, "dataset": other} for other in others]
        metrics = dataset and {
            "task": "translation",
            "dataset": {"name": "WMT14", "id": "wmt/wmt14", **dataset},
            "results": results,
        }
        card = write_model_card(folder, metrics).read_text(encoding="utf-8")
        section = card.split("## Intended use and limitations")[1].split("##")[0]
        return " ".join(section.split())

    note = "The scores above are corpus-level metrics on {} and say little about single outputs."
    assert note.format("one test set") in limitations({"split": "test"})
    assert note.format("one test set") in limitations({"split": "test[:100]", "rows": 100})
    validation = limitations({"split": "validation"})
    assert (
        note.format("one validation set (no test split was scored)") in validation
        and "test set" not in validation
    )
    assert note.format("2 evaluation sets (those of the table)") in limitations(
        {"split": "test"}, {"name": "newstest2013", "split": "validation"}
    )
    assert "The scores above" not in limitations(None)


def _bart_folder(folder: Path) -> Path:
    from transformers import BartConfig

    BartConfig(d_model=16, encoder_layers=1, decoder_layers=1, vocab_size=50).save_pretrained(folder)
    return folder


def test_a_folder_of_another_model_type_is_refused(tmp_path):
    """transformers only warns when a BART config.json is read as an ODE Transformer's: the export would be a
    randomly initialised ODE model and the card would describe BART as one."""
    bart = _bart_folder(tmp_path / "bart")
    expected = r"bart is not an ODE Transformer folder: its config.json has model_type 'bart', expected "
    expected += r"'ode_transformer'.*save_pretrained"
    with pytest.raises(ValueError, match=expected):
        export_for_hub(bart, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    metrics = {
        "task": "translation",
        "dataset": {"name": "x", "id": "x/y", "split": "test"},
        "results": [{"metric": "bleu", "value": 1.0}],
    }
    with pytest.raises(ValueError, match=expected):
        write_model_card(bart, metrics)
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    with pytest.raises(ValueError, match=expected):  # `python -m ode_transformer.hub.model_card DIR METRICS`
        model_card_main([str(bart), str(tmp_path / "metrics.json")])
    assert not (bart / "README.md").exists()


def test_export_refuses_weights_that_do_not_fill_the_model(tmp_path):
    """Missing, unexpected or reshaped weights are refused by name (transformers initialises the missing ones at
    random and only warns); the tied output projection, stored once, is not missing."""
    from safetensors.torch import save_file

    folder = tmp_path / "trained"
    model = tiny_seq2seq()
    assert model.config.tie_word_embeddings
    model.save_pretrained(folder)
    weights = load_file(folder / "model.safetensors")
    assert "lm_head.weight" not in weights  # tied: stored once, and exported without complaint
    export_for_hub(folder, tmp_path / "tied")

    norm = "model.encoder.layer_norm.weight"
    for name, edit, problem in (
        ("missing", {norm: None}, f"1 missing (they would be random): ['{norm}']"),
        ("unexpected", {"model.extra.weight": torch.zeros(2)}, "1 unexpected: ['model.extra.weight']"),
        ("reshaped", {norm: torch.zeros(3)}, f"of another shape (file vs config): ['{norm} (3,) vs (16,)']"),
    ):
        changed = {**weights, **edit}
        changed = {key: tensor for key, tensor in changed.items() if tensor is not None}
        save_file(changed, folder / "model.safetensors", metadata={"format": "pt"})
        with pytest.raises(ValueError) as info:
            export_for_hub(folder, tmp_path / name)
        message = str(info.value)
        assert f"the weights in {folder} do not match its config.json" in message, message
        assert problem in message and "save_pretrained" in message, message
        assert not (tmp_path / name).exists()


# ----------------------------------------------------------------------------------------------------------
# Export with remote code
# ----------------------------------------------------------------------------------------------------------

PACKAGE_FREE = """
import json, sys
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, GenerationConfig

folders = json.loads(sys.argv[1])
torch.set_num_threads(1)
inputs = torch.load(folders["inputs"])
config = AutoConfig.from_pretrained(folders["seq2seq"], trust_remote_code=True)
assert type(config).__module__.startswith("transformers_modules."), type(config).__module__
model = AutoModelForSeq2SeqLM.from_pretrained(folders["seq2seq"], trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
lm = AutoModelForCausalLM.from_pretrained(folders["causal"], trust_remote_code=True).eval()
generation = GenerationConfig.from_pretrained(folders["seq2seq"])
with torch.no_grad():
    out = {
        "seq2seq": model(input_ids=inputs["src"], decoder_input_ids=inputs["tgt"]).logits,
        "causal": lm(input_ids=inputs["src"]).logits,
        "num_beams": generation.num_beams,
        "length_penalty": generation.length_penalty,
    }
    with sdpa_kernel(SDPBackend.MATH):  # the other CPU kernel SDPA may pick
        out["seq2seq_math"] = model(input_ids=inputs["src"], decoder_input_ids=inputs["tgt"]).logits
        out["causal_math"] = lm(input_ids=inputs["src"]).logits
torch.save(out, folders["outputs"])
"""


def test_export_loads_with_remote_code_without_the_package(tmp_path):
    seq2seq = tiny_seq2seq(encoder_ode_method="rk4", encoder_ode_coefficients="tableau")
    seq2seq.save_pretrained(tmp_path / "trained")
    out = export_for_hub(tmp_path / "trained", tmp_path / "ode-hub", repo_id="someone/ode-tiny")
    torch.manual_seed(1)
    causal = ODETransformerForCausalLM(
        ODETransformerConfig.from_preset(
            "tiny", is_encoder_decoder=False, decoder_ode_method="rk2", decoder_ode_coefficients="gated"
        )
    ).eval()
    out_causal = export_for_hub(causal, tmp_path / "ode-lm-hub")

    code = (
        "configuration_ode_transformer.py",
        "modeling_ode_transformer.py",
        "cache_ode.py",
        "ode.py",
        "compat.py",
        "lora.py",
        "dropout.py",
        "input_checks.py",
        "weights_integrity.py",
    )
    files = sorted(p.name for p in out.iterdir())
    assert set(code) | {"config.json", "model.safetensors", "generation_config.json", "README.md"} == set(
        files
    )
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_ode_transformer.ODETransformerConfig",
        "AutoModel": "modeling_ode_transformer.ODETransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_ode_transformer.ODETransformerForConditionalGeneration",
    }
    assert json.loads((out_causal / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"] == (
        "modeling_ode_transformer.ODETransformerForCausalLM"
    )
    for name in code:  # flat copies, relative imports intact
        assert (out / name).read_text() == (Path(modeling_ode.__file__).parent / name).read_text()
    assert "from .ode import" in (out / "modeling_ode_transformer.py").read_text()

    g = torch.Generator().manual_seed(2)
    inputs = {
        "src": torch.randint(3, 99, (2, 7), generator=g),
        "tgt": torch.randint(3, 99, (2, 5), generator=g),
    }
    torch.save(inputs, tmp_path / "inputs.pt")
    folders = {
        "seq2seq": str(out),
        "causal": str(out_causal),
        "inputs": str(tmp_path / "inputs.pt"),
        "outputs": str(tmp_path / "outputs.pt"),
    }
    run = run_package_free(PACKAGE_FREE, tmp_path, json.dumps(folders))
    assert run.returncode == 0, run.stderr[-3000:]
    remote = torch.load(tmp_path / "outputs.pt")
    with torch.no_grad():
        local = {"seq2seq": seq2seq(input_ids=inputs["src"], decoder_input_ids=inputs["tgt"]).logits,
                 "causal": causal(input_ids=inputs["src"]).logits}  # fmt: skip
    # Same weights, same code, but not necessarily the same kernels: on CPU, scaled_dot_product_attention runs
    # its fused flash kernel or its math kernel depending on process state (grad mode, `sdpa_kernel` /
    # `enable_flash_sdp` flags, shapes), and GEMM reductions depend on the thread count; the kernels round
    # differently. On these inputs math vs flash differ by 4.8e-7 in the causal logits (4 float32 ulp at |x| ~ 1),
    # the difference seen when this test compared with torch.equal. So compare within 1e-5 (well above that; a wrong or
    # untied weight, or another config, moves logits by > 1e-2), and check the math kernel's logits as well.
    for name in ("seq2seq", "causal"):
        for kernel in (name, f"{name}_math"):
            torch.testing.assert_close(remote[kernel], local[name], rtol=1e-5, atol=1e-5, msg=kernel)
    assert (remote["num_beams"], remote["length_penalty"]) == (4, 0.6)


def test_save_pretrained_folder_needs_trust_remote_code_without_the_package(tmp_path):
    """Without the package and without trust_remote_code, transformers' own error asks for it."""
    tiny_seq2seq().save_pretrained(tmp_path / "model")
    code = """
    import sys
    from transformers import AutoModelForSeq2SeqLM
    try:
        AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1])
    except ValueError as error:
        print(error)
    """
    run = run_package_free(code, tmp_path, str(tmp_path / "model"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "trust_remote_code=True" in run.stdout


def test_export_keeps_own_generation_config_and_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "hallo": 4, "welt": 5}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    model = tiny_seq2seq()
    model.generation_config.num_beams = 5
    model.generation_config.length_penalty = 1.3  # the paper's En-Ro decoding
    model.save_pretrained(tmp_path / "trained")
    tokenizer.save_pretrained(tmp_path / "trained")
    out = export_for_hub(tmp_path / "trained", tmp_path / "hub")
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"]) == (5, 1.3)
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    assert ModelCard.load(out / "README.md").data.eval_results is None


def test_export_checks_every_input_before_writing(tmp_path):
    """ode-export checks every input (--metrics, --tokenizer, the folder's own hub_metrics.json) before it
    writes, so that a bad one leaves no folder with the weights for the re-run to refuse as occupied."""
    folder = tmp_path / "trained"
    tiny_seq2seq().save_pretrained(folder)
    out = tmp_path / "out"
    bad_metrics = tmp_path / "metrics.json"
    bad_metrics.write_text(json.dumps({"task": "translation", "results": []}))
    with pytest.raises(
        ValueError, match=r"metrics\.json does not follow the schema.*'results' \(a non-empty"
    ):
        export_for_hub(folder, out, metrics=bad_metrics)
    assert not out.exists()
    with pytest.raises(FileNotFoundError, match=r"tokenizer folder .*no-tokenizer does not exist"):
        export_for_hub(folder, out, tokenizer=tmp_path / "no-tokenizer")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty holds none of the tokenizer files"):
        export_for_hub(folder, out, tokenizer=tmp_path / "empty")
    assert not out.exists()
    (folder / "hub_metrics.json").write_text("[]")  # the folder's own metrics are an input as well
    with pytest.raises(ValueError, match=r"hub_metrics\.json does not follow the schema"):
        export_for_hub(folder, out)
    assert not out.exists()
    (folder / "hub_metrics.json").unlink()
    assert (export_for_hub(folder, out) / "model.safetensors").is_file()  # the re-run is not refused


# ----------------------------------------------------------------------------------------------------------
# Push
# ----------------------------------------------------------------------------------------------------------


def test_push_dry_run_lists_files_without_network(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "hub"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\0" * 1234)
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "ode.cpython-312.pyc").write_bytes(b"x")
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref")

    import huggingface_hub

    def no_network(*args, **kwargs):
        raise AssertionError("dry run touched the Hub client")

    monkeypatch.setattr(huggingface_hub, "HfApi", no_network)
    push.main([str(folder), "--repo-id", "someone/ode-tiny", "--dry-run", "--private"])
    printed = capsys.readouterr().out
    assert "would upload 2 files" in printed and "(private)" in printed
    assert re.search(r"\b2\s+config\.json", printed) and re.search(r"\b1234\s+model\.safetensors", printed)
    assert "pyc" not in printed and ".git" not in printed
    assert push.files_to_upload(folder) == [("config.json", 2), ("model.safetensors", 1234)]

    # the module CLI, in a fresh interpreter, offline
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "ode_transformer.hub.push",
            str(folder),
            "--repo-id",
            "someone/ode-tiny",
            "--dry-run",
        ],
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert "model.safetensors" in run.stdout


def test_describe_ode_speaks_the_catalogue():
    """The card's words for methods, coefficients, F and connections are the catalogue's (modeling_ode/ode.py)."""
    from modeling_ode.ode import COEFFICIENT_MODES, GATE_INPUTS, LAYER_CONNECTIONS, ODE_FUNCTIONS, ODE_METHODS

    for method, mode, function, connections in zip(
        ["rk2", "rk4", "rk3", "ralston", "polynet", "rk2"],
        COEFFICIENT_MODES,
        [*ODE_FUNCTIONS, "layer", "layer"],
        [*LAYER_CONNECTIONS, "residual"],
    ):
        config = ODETransformerConfig.from_preset(
            "tiny",
            encoder_ode_method=method,
            encoder_ode_coefficients=mode,
            encoder_ode_function=function,
            encoder_layer_connections=connections,
        )
        encoder = config_in_words.describe_ode(config)[0]
        for words in (ODE_METHODS[method].description, COEFFICIENT_MODES[mode].description):
            assert words in encoder
        assert ODE_FUNCTIONS[function] in encoder and LAYER_CONNECTIONS[connections] in encoder
    normalised = ODETransformerConfig.from_preset("tiny", ode_gate_inputs="layer_norm")
    assert GATE_INPUTS["layer_norm"] in config_in_words.describe_ode(normalised)[0]


@pytest.mark.parametrize("causal", [False, True])
def test_exported_tokenizer_config_is_the_folders(tmp_path, causal):
    """The export's tokenizer_config.json is the model folder's, key for key, plus the weights digest the
    export records: none of what transformers' load adds (`is_local`, `local_files_only`, tokenizer.json's
    truncation: `max_length`, `stride`, ...). The class it names is the one hub/README.md names, and the
    reloaded tokenizer truncates on the task's side."""
    from modeling_ode.weights_integrity import WEIGHTS_DIGEST, weights_digest

    save_tiny_folder(tmp_path / "model", causal=causal)
    export_for_hub(tmp_path / "model", tmp_path / "export")
    saved, exported = (
        json.loads((tmp_path / folder / "tokenizer_config.json").read_text())
        for folder in ("model", "export")
    )
    assert exported.pop(WEIGHTS_DIGEST) == weights_digest(tmp_path / "export" / "model.safetensors")
    assert exported == saved
    assert f"name transformers' `{exported['tokenizer_class']}`" in (REPO / "hub" / "README.md").read_text()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "export")
    assert tokenizer.truncation_side == ("left" if causal else "right")


# The card's formula of each kind of block, as a reader would write it by hand: the default block's is its
# learned gate's, not the fixed-weight Eq. (rk2).
CARD_FORMULAS = {
    "gated RK2 (the default)": ({}, "y + g F1 + (1 - g) F2; F1 = F(y), F2 = F(y + F1)"),
    "RK2": ({"encoder_ode_coefficients": "tableau"}, "y + (F1 + F2) / 2; F1 = F(y), F2 = F(y + F1)"),
    "RK4": (
        {"encoder_ode_method": "rk4"},
        "y + (F1 + 2 F2 + 2 F3 + F4) / 6; F1 = F(y), F2 = F(y + F1 / 2), F3 = F(y + F2 / 2), F4 = F(y + F3)",
    ),
    "gated RK4": (
        {"encoder_ode_method": "rk4", "encoder_ode_coefficients": "gated"},
        "y + gamma_1 F1 + gamma_2 F2 + gamma_3 F3 + gamma_4 F4; "
        "F1 = F(y), F2 = F(y + F1 / 2), F3 = F(y + F2 / 2), F4 = F(y + F3)",
    ),
    "midpoint": ({"encoder_ode_method": "midpoint"}, "y + F2; F1 = F(y), F2 = F(y + F1 / 2)"),
    "Ralston": ({"encoder_ode_method": "ralston"}, "y + (F1 + 3 F2) / 4; F1 = F(y), F2 = F(y + 2 F1 / 3)"),
    "RK3": (
        {"encoder_ode_method": "rk3"},
        "y + (F1 + 4 F2 + F3) / 6; F1 = F(y), F2 = F(y + F1 / 2), F3 = F(y - F1 + 2 F2)",
    ),
    "RK4 3/8": (
        {"encoder_ode_method": "rk4_38"},
        "y + (F1 + 3 F2 + 3 F3 + F4) / 8; F1 = F(y), F2 = F(y + F1 / 3), F3 = F(y - F1 / 3 + F2), "
        "F4 = F(y + F1 - F2 + F3)",
    ),
    "PolyNet": ({"encoder_ode_method": "polynet"}, "y + F1 + F2; F1 = F(y), F2 = F(F1)"),
    "weight sharing": ({"encoder_ode_method": "weight_sharing"}, "y + F1 + F2; F1 = F(y), F2 = F(y + F1)"),
    "ones": ({"encoder_ode_coefficients": "ones"}, "y + F1 + F2; F1 = F(y), F2 = F(y + F1)"),
    "learnable": (
        {"encoder_ode_coefficients": "learnable"},
        "y + gamma_1 F1 + gamma_2 F2; F1 = F(y), F2 = F(y + F1)",
    ),
    "sigmoid gates": (
        {"encoder_ode_coefficients": "gated_independent"},
        "y + gamma_1 F1 + gamma_2 F2; F1 = F(y), F2 = F(y + F1)",
    ),
    "tanh gates": (
        {"encoder_ode_coefficients": "gated_tanh"},
        "y + gamma_1 F1 + gamma_2 F2; F1 = F(y), F2 = F(y + F1)",
    ),
    "user tableau": (
        {"encoder_ode_method": {"a": [[], [0.5]], "b": [0.3, 0.7]}},
        "y + (3 F1 + 7 F2) / 10; F1 = F(y), F2 = F(y + F1 / 2)",
    ),
    "step size 1/2": (
        {"ode_step_size": 0.5},
        "y + g F1 + (1 - g) F2; F1 = 0.5 F(y), F2 = 0.5 F(y + F1)",
    ),
    "PCformer RK2": ({"preset": "pcformer_rk2"}, "y + a (1 - a) F1 + a F2; F1 = F(y), F2 = F(y + F1)"),
    "PCformer RK4": (
        {"preset": "pcformer_rk4", "ode_ema_alpha": "dimension"},
        "y + a (1 - a)^3 F1 + a (1 - a)^2 F2 + a (1 - a) F3 + a F4; "
        "F1 = F(y), F2 = F(y + F1 / 2), F3 = F(y + F2 / 2), F4 = F(y + F3)",
    ),
}


def _evaluate_card_formula(formula: str, values: dict[str, object]) -> object:
    """The card's "UPDATE; F1 = ..., F2 = ..." evaluated in Python: juxtaposition is a product, ^ a power."""

    def python(text: str) -> str:
        return re.sub(r"(?<=[\w)])\s+(?=[\w(])", "*", text.replace("^", "**"))

    update, _, stages = formula.partition("; ")
    for stage in re.split(r", (?=F\d+ = )", stages):
        name, _, value = stage.partition(" = ")
        values[name] = eval(python(value), {}, values)
    return eval(python(update), {}, values)


@pytest.mark.parametrize("kind", CARD_FORMULAS)
def test_card_formula_is_the_block_the_config_builds(kind):
    """The card states each kind of block's formula (gated RK2, RK2, RK4, other tableaus, PCformer's predictor):
    the hand-written one, and evaluated with the config's built coefficients and a nonlinear F it gives what the
    model's `ode_step` computes."""
    from modeling_ode import ODETransformerEncoder, ode_step
    from modeling_ode.configuration_ode_transformer import PRESETS

    fields, expected = CARD_FORMULAS[kind]
    fields = dict(fields)
    config = ODETransformerConfig.from_preset(fields.pop("preset", "tiny"), **{**PRESETS["tiny"], **fields})
    encoder_line = config_in_words.describe_ode(config)[0]
    formula = re.search(r"y_\{t\+1\} = (.*?)(?:, combining|; blocks)", encoder_line).group(1)
    assert formula == expected, encoder_line

    torch.manual_seed(0)
    coefficients = ODETransformerEncoder(config).ode_coefficients[0]
    for parameter in coefficients.parameters():  # away from every start, so that no weight is trivially 1/2
        torch.nn.init.uniform_(parameter, 0.1, 0.9)
    recorded = []
    coefficients.recorder.register_forward_hook(lambda module, args, out: recorded.append(out[1]))

    def function(x):
        return torch.tanh(x) + 0.3 * x**2

    y = torch.randn(1, 3, config.d_model)
    out = ode_step(y, lambda x, _: function(x), config.tableau("encoder"), coefficients, config.ode_step_size)
    gamma = recorded[0]
    values = {"F": function, "y": y, "g": gamma[0], "a": getattr(coefficients, "alpha", None)}
    values.update({f"gamma_{i + 1}": weight for i, weight in enumerate(gamma)})
    torch.testing.assert_close(_evaluate_card_formula(formula, values), out)


# ----------------------------------------------------------------------------------------------------------
# Card snippets
# ----------------------------------------------------------------------------------------------------------


ARTICLE = " ".join(["The council met on Tuesday and approved the budget for schools and transport."] * 35)
CARD_TASKS = {  # task -> (card task, example input, languages)
    "translation": ("translation", "the dog runs", ["en", "de"]),
    "summarization": ("summarization", ARTICLE, ["en"]),  # 2,700 characters: longer than the model takes
    "gec": ("grammatical-error-correction", "She go to school every days .", ["en"]),
    "lm": ("text-generation", "ein Hund läuft", ["en"]),
}


def _task_card(folder: Path, task: str) -> ModelCard:
    card_task, example, language = CARD_TASKS[task]
    causal = task == "lm"
    save_tiny_folder(folder, causal, **({} if causal else {"d_model": 32, "encoder_layers": 3}))
    metrics = {
        "task": card_task,
        "language": language,
        "dataset": {"name": "Toy corpus", "id": "toy/corpus", "split": "test[:1500]", "rows": 1500},
        "results": [{"metric": "chrf", "name": "chrF", "value": 12.5}],
        "example": example,
        "base_model": "someone/ode-base",
        "training": {"datasets": ["toy/corpus"], "recipe": {"model": "3-3 layers, d_model 32"}},
        **({} if causal else {"decoding": {"num_beams": 2, "length_penalty": 0.6, "precision": "fp32"}}),
    }
    return ModelCard.load(write_model_card(folder, metrics, repo_id=str(folder)))


def test_every_card_snippet_runs_as_written(tmp_path):
    """The card of each task: its transformers-only snippet runs where the package is not installed, its
    one-call snippet (ode_transformer.generate_texts) where it is; both as written, on a tiny model."""
    plain, helpers = [], []
    for task in CARD_TASKS:
        card = _task_card(tmp_path / task, task)
        assert card.data.language == CARD_TASKS[task][2] and card.data.datasets == ["toy/corpus"]
        assert card.data.base_model == "someone/ode-base"
        snippets = re.findall(r"```python\n(.*?)```", card.text, re.DOTALL)
        assert len(snippets) == 2 and all(f'from_pretrained("{tmp_path / task}"' in snippets[0] for _ in "x")
        assert len(snippets[0]) < 1200, "the example is an excerpt, not a whole article"
        plain.append(snippets[0])
        helpers.append(snippets[1])
    assert "Decoding: num beams 2, length penalty 0.6, precision fp32." in card.text or task == "lm"
    assert "Toy corpus test[:1500]: 1,500 examples scored." in card.text
    assert card.data.eval_results[0].dataset_split == "test[:1500]"
    separator = "\nprint('=====')\n"
    result = run_package_free(separator.join(plain), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    outputs = result.stdout.split("=====\n")
    assert len(outputs) == 4 and all(out.strip() for out in outputs), result.stdout
    assert outputs[-1].startswith("['ein Hund läuft")  # the causal LM continues its prompt
    helper = subprocess.run(
        [sys.executable, "-c", separator.join(helpers)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert helper.returncode == 0, helper.stderr[-3000:]
    assert len(helper.stdout.split("=====\n")) == 4


def test_a_saved_folder_carries_the_model_limits_and_loads_with_every_auto_class(tmp_path):
    """AutoModel, the task's auto class and AutoTokenizer load the folder where the package is not installed;
    the tokenizer truncates to the model's limit and pads on the task's side."""
    save_tiny_folder(tmp_path / "seq2seq")
    save_tiny_folder(tmp_path / "lm", causal=True)
    for name, task_class, base in (
        ("seq2seq", "AutoModelForSeq2SeqLM", "ODETransformerModel"),
        ("lm", "AutoModelForCausalLM", "ODETransformerDecoder"),
    ):
        auto_map = json.loads((tmp_path / name / "config.json").read_text())["auto_map"]
        assert {"AutoConfig", "AutoModel", task_class} == set(auto_map)
        assert auto_map["AutoModel"] == f"modeling_ode_transformer.{base}"
    code = """
    import sys
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer
    for name, task_class in (("seq2seq", AutoModelForSeq2SeqLM), ("lm", AutoModelForCausalLM)):
        folder = f"{sys.argv[1]}/{name}"
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        task_model = task_class.from_pretrained(folder, trust_remote_code=True)
        model = AutoModel.from_pretrained(folder, trust_remote_code=True)
        ids = tokenizer("the dog runs in the park " * 200, truncation=True)["input_ids"]
        limit = task_model.config.max_position_embeddings
        print(name, type(model).__name__, len(ids), limit, tokenizer.model_max_length, tokenizer.padding_side)
        task_model(**tokenizer(["the dog " * 200], truncation=True, return_tensors="pt"),
                   **({"decoder_input_ids": tokenizer(["a"], return_tensors="pt")["input_ids"]} if name == "seq2seq" else {}))
    """
    result = run_package_free(code, tmp_path, str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    seq2seq, lm = (line.split() for line in result.stdout.splitlines())
    assert seq2seq[:2] == ["seq2seq", "ODETransformerModel"] and seq2seq[-1] == "right"
    assert lm[:2] == ["lm", "ODETransformerDecoder"] and lm[-1] == "left"
    for row in (seq2seq, lm):
        assert int(row[2]) == int(row[3]) == int(row[4])  # cut to the model's positions, no more


def test_the_card_of_a_gated_rk2_model_says_what_the_projects_runs_show_about_it():
    """The recipes' default block is the paper's gated RK2; its card says it is untried here and that its
    gate saturated in every diagnostic (tests/test_lease.py checks that against the committed diagnostics)."""
    from modeling_ode import ODETransformerConfig

    DEFAULT_BLOCK_NOTE, describe_ode = config_in_words.DEFAULT_BLOCK_NOTE, config_in_words.describe_ode

    assert DEFAULT_BLOCK_NOTE.removeprefix("**About the gated RK2 block**: ") in " ".join(
        describe_ode(ODETransformerConfig())
    )
    for other in (
        {"encoder_ode_method": "rk4"},
        {"encoder_ode_coefficients": "tableau"},
        {"encoder_ode_method": "euler"},
        {"ode_gate_inputs": "layer_norm"},
    ):
        assert "About the gated RK2 block" not in " ".join(describe_ode(ODETransformerConfig(**other))), other


@pytest.mark.both_cpus
def test_averaging_and_export_refuse_an_occupied_folder_unless_overwrite(tmp_path, capsys, refused):
    model_dir = tmp_path / "model"
    save_tiny_folder(model_dir)
    for step in (1, 2):
        checkpoint = tmp_path / "run" / f"checkpoint-{step}"
        checkpoint.mkdir(parents=True)
        save_file({"w": torch.full((2,), float(step))}, str(checkpoint / "model.safetensors"))
        (checkpoint / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    before = snapshot(model_dir)
    error = refused(averaging.main, [str(tmp_path / "run"), "--last", "2", "--out", str(model_dir)])
    assert f"{model_dir} already holds files (" in error
    assert "pass --overwrite to delete it first, or choose an empty --out." in error
    export_dir = tmp_path / "exported"
    export_for_hub(model_dir, export_dir)
    exported = snapshot(export_dir)
    with pytest.raises(FileExistsError, match=f"{export_dir} already holds files .*; pass --overwrite"):
        export_for_hub(model_dir, export_dir)
    assert snapshot(model_dir) == before and snapshot(export_dir) == exported  # nothing touched

    (export_dir / "checkpoint-9").mkdir()  # a stale file that would describe another model
    export_for_hub(model_dir, export_dir, overwrite=True)
    assert not (export_dir / "checkpoint-9").exists() and (export_dir / "model.safetensors").is_file()
    averaging.main([str(tmp_path / "run"), "--last", "2", "--out", str(model_dir), "--overwrite"])
    assert sorted(p.name for p in model_dir.iterdir()) == [
        "model.safetensors"
    ]  # the old model's files are gone
    assert torch.equal(weights(model_dir)["w"], torch.full((2,), 1.5))
    err = refused(
        averaging.main, [str(tmp_path / "run"), "--last", "2", "--out", str(tmp_path), "--overwrite"]
    )
    assert re.search(r"holds .*checkpoint-1, an input of this command: writing the folder", err)


KILL_DURING = {  # tool: (what is replaced by a SIGKILL of the process, its command line given the folders)
    "export": (
        "ode_transformer.model_card_writer.write_model_card",
        lambda model, out: ["ode_transformer.hub.export", str(model), str(out)],
    ),
    "averaging": (
        "safetensors.torch.save_file",
        lambda run, out: ["ode_transformer.train.averaging", str(run), "--out", str(out)],
    ),
}


KILLED_RUN = """
import importlib, os, runpy, signal, sys
module, name = sys.argv[1].rsplit(".", 1)
setattr(importlib.import_module(module), name, lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL))
sys.argv = sys.argv[2:]
runpy.run_module(sys.argv[0], run_name="__main__")
"""


@pytest.mark.both_cpus
@pytest.mark.parametrize("tool", list(KILL_DURING))
def test_export_and_averaging_rerun_after_a_kill(tmp_path, capsys, tool, refused):
    """A kill of `python -m ode_transformer.hub.export` or `python -m ode_transformer.train.averaging` leaves
    OUT.incomplete, named for what it is; the rerun writes OUT and removes it, rather than stop on a
    FileExistsError traceback; a third run is refused in one line: the folder is occupied."""
    from ode_transformer.hub import export

    target, argv = KILL_DURING[tool]
    source = tmp_path / "model"
    save_tiny_folder(source)
    if tool == "averaging":
        source = tmp_path / "run"
        for step in (1, 2):
            save_tiny_folder(source / f"checkpoint-{step}")
            (source / f"checkpoint-{step}" / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    out = tmp_path / "out"
    killed = subprocess.run([sys.executable, "-c", KILLED_RUN, target, *argv(source, out)], cwd=ROOT)
    assert killed.returncode == -signal.SIGKILL
    assert not out.exists() and (tmp_path / "out.incomplete").is_dir()  # named for what it is
    main = export.main if tool == "export" else averaging.main
    main(argv(source, out)[1:])  # the rerun: python -m runs main
    assert (out / "model.safetensors").is_file() and not (tmp_path / "out.incomplete").exists()
    assert not list(tmp_path.glob(".out.*"))  # lock files released
    capsys.readouterr()
    err = refused(main, argv(source, out)[1:])  # a third time: the folder is occupied, said in one line
    assert err.startswith(f"python -m {argv(source, out)[0]}: error: {out} already holds files (")
    assert "pass --overwrite to delete it first" in err and len(err.splitlines()) == 1


def test_an_exported_card_names_neither_the_staging_folder_nor_a_local_path(tmp_path):
    """Without --repo-id an exported card names neither the staging folder (`OUT.incomplete`) nor a local
    path, but `path/to/OUT`; no scratch folder is left, and the card and tokenizer.json keep the trained input
    length."""
    save_tiny_folder(tmp_path / "model")
    (tmp_path / "model" / "README.md").unlink(missing_ok=True)
    out = export_for_hub(tmp_path / "model", tmp_path / "my-model")
    card = (out / "README.md").read_text()
    assert ".incomplete" not in card and str(tmp_path) not in card
    assert 'from_pretrained("path/to/my-model"' in card or "path/to/my-model" in card
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "my-model"]  # no scratch folder left
    # the card is written in a scratch copy: the tokenizer's files go with it, so it states the trained length
    limit = json.loads((out / "tokenizer_config.json").read_text())["model_max_length"]
    assert f"trained on inputs of up to {limit} tokens" in card, card
    # ... and the exported tokenizer.json truncates to it too (tokenizers-only deployments read that)
    assert json.loads((out / "tokenizer.json").read_text())["truncation"]["max_length"] == limit


def _training_folder(folder: Path) -> Path:
    save_tiny_folder(folder)
    (folder / "checkpoint-2").mkdir()
    for name in ("optimizer.pt", "rng_state.pth", "model.safetensors"):
        write(folder / "checkpoint-2" / name, "x")
    write(folder / "trainer_state.json", "{}")
    write(folder / "training_args.bin", "pickle")
    return folder


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "push"])
def test_push_refuses_a_training_folder_naming_what_would_leave(
    tmp_path, monkeypatch, capsys, dry_run, refused
):
    """ode-push of a training folder (checkpoints, optimizer states, pickled training arguments), --dry-run
    too, is refused naming the files of training state that would leave the machine and saying to export it
    first; nothing reaches the network code. The export it names lists no checkpoint."""
    import huggingface_hub

    folder = _training_folder(tmp_path / "run")
    monkeypatch.setattr(huggingface_hub, "HfApi", None)  # nothing may reach the network code
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    argv = ["ode-push", str(folder), "--repo-id", "u/n", *(["--dry-run"] if dry_run else [])]
    monkeypatch.setattr(sys, "argv", argv)
    capsys.readouterr()
    assert refused(cli.push) == (
        f"ode-push: error: {folder} is a training folder: 5 of its files are training state, not the model "
        "(checkpoint-2/, trainer_state.json, training_args.bin), and would leave the machine; export it first "
        f"(ode-export {folder} OUT_DIR) and push OUT_DIR\n"
    )
    export_for_hub(folder, tmp_path / "exported")  # what the message says to do
    monkeypatch.setattr(
        sys, "argv", ["ode-push", str(tmp_path / "exported"), "--repo-id", "u/n", "--dry-run"]
    )
    refused(cli.push, code=0)
    assert "checkpoint" not in capsys.readouterr().out


class ConnectError(Exception):
    """As httpx names the failure to connect (huggingface_hub's HTTP client)."""


def test_push_without_network_is_one_line_and_exit_code_2(tmp_path, monkeypatch, capsys, refused):
    """ode-push with no network and HF_HUB_OFFLINE unset ends in exit code 2 and one line saying to check the
    network or use --dry-run, not an httpx ConnectError traceback. (The Hub client is patched to fail as it
    does offline: no real network.)"""
    import huggingface_hub

    class OfflineApi:
        def create_repo(self, *args, **kwargs):
            try:
                raise OSError("[Errno -3] Temporary failure in name resolution")
            except OSError as error:
                raise ConnectError("[Errno -3] Temporary failure in name resolution") from error

    save_tiny_folder(tmp_path / "model")
    export_for_hub(tmp_path / "model", tmp_path / "exported")
    monkeypatch.setattr(huggingface_hub, "HfApi", OfflineApi)
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    monkeypatch.setattr(sys, "argv", ["ode-push", str(tmp_path / "exported"), "--repo-id", "u/n"])
    capsys.readouterr()
    assert refused(cli.push) == (
        "ode-push: error: could not reach the Hugging Face Hub to push u/n (ConnectError: [Errno -3] Temporary "
        "failure in name resolution); check the network (or HF_ENDPOINT, a proxy) and run the command again; "
        "--dry-run lists the files without it\n"
    )


# ----------------------------------------------------------------------------------------------------------
# One lock per real folder, exports that cannot eat their source or a run, a full disk while quantising


EXPORTED = sorted(
    [
        "README.md",
        "cache_ode.py",
        "compat.py",
        "config.json",
        "configuration_ode_transformer.py",
        "dropout.py",
        "generation_config.json",
        "input_checks.py",
        "lora.py",
        "model.safetensors",
        "modeling_ode_transformer.py",
        "ode.py",
        "tokenizer.json",
        "tokenizer_config.json",
        "weights_integrity.py",
    ]
)


def test_two_exports_into_one_folder_by_two_names_take_one_lock(tmp_path):
    """`ode-export SA runs/E9 --overwrite & ode-export SB runs/E9link --overwrite` (E9link a link to E9) take
    one lock, since every lock derives from the resolved path: one writer at a time, the other waiting or
    refused, so that the folder holds every file of one export and no staging folder or lock is left."""
    from modeling_ode.weights_integrity import weights_digest
    from ode_transformer.files import lock_output

    sources = {"A": tmp_path / "SA", "B": tmp_path / "SB"}
    save_tiny_folder(sources["A"])
    save_tiny_folder(sources["B"], weight_scale=3)
    runs = tmp_path / "runs"
    out, link = runs / "E9", runs / "E9link"
    export_for_hub(sources["A"], out)
    link.symlink_to("E9")  # `ln -s E9 runs/E9link`: a relative link
    with lock_output(out, "OUT_DIR"):  # an export by one name holds the folder: another name waits its turn
        process = start(command("ode-export", str(sources["B"]), str(link), "--overwrite"))
        _, stderr = process.communicate(timeout=300)
    assert process.returncode == 2 and last_line(stderr) == (
        f"ode-export: error: {link} is in use by another process (pid {os.getpid()}); wait for it to finish or "
        "stop it, or choose another OUT_DIR."
    )
    assert weights(out).keys() and snapshot(out) == snapshot(link)
    expected = {name: weights(path) for name, path in sources.items()}
    for _ in range(3):  # both at once, by the two names: each waits or is refused, never both writing
        racers = [
            start(command("ode-export", str(sources[name]), str(target), "--overwrite"))
            for name, target in (("A", out), ("B", link))
        ]
        outcomes = [(racer.wait(timeout=300), racer.communicate()[1]) for racer in racers]
        for code, stderr in outcomes:
            assert code == 0 or (code == 2 and " is in use by another process (pid " in last_line(stderr))
        assert any(code == 0 for code, _ in outcomes)
        assert sorted(p.name for p in out.iterdir()) == EXPORTED
        written = weights(out)
        same = [
            written.keys() == w.keys() and all(map(torch.equal, written.values(), w.values()))
            for w in expected.values()
        ]
        assert any(same)
        recorded = {
            json.loads((out / name).read_text())["weights_digest"]
            for name in ("config.json", "tokenizer_config.json")
        }
        assert recorded == {weights_digest(out / "model.safetensors")}  # every file of one export
        assert sorted(p.name for p in runs.iterdir()) == ["E9", "E9link"]  # no staging folder, no lock left


def _finished_run(run: Path) -> None:
    """A run's folder as ode-train leaves it: checkpoints, trainer state, results, its tokenizer, the final model."""
    save_tiny_folder(run)
    save_tiny_folder(run / "checkpoint-40")
    save_tiny_folder(run / "tokenizer")
    for folder in (run, run / "checkpoint-40"):
        write(folder / "trainer_state.json", '{"global_step": 40}')
    write(run / "hub_metrics.json", "{}")


@pytest.mark.both_cpus
def test_no_tool_replaces_a_folder_holding_its_input_or_a_run(tmp_path, capsys, monkeypatch, refused):
    """No writer replaces a folder that holds its input, or a run's checkpoints, by any name and whatever
    --overwrite says: `ode-export RUN/checkpoint-40 RUN --overwrite` is refused with exit code 2, the run left
    whole."""
    from ode_transformer.hub.convert_fairseq import convert_fairseq_checkpoint
    from ode_transformer.hub.upcycle import upcycle_folder

    run_dir = tmp_path / "RUN"
    _finished_run(run_dir)
    (tmp_path / "RUNlink").symlink_to(run_dir)
    other = tmp_path / "other"
    save_tiny_folder(other)
    before = snapshot(run_dir)
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    monkeypatch.setattr(
        sys, "argv", ["ode-export", str(run_dir / "checkpoint-40"), str(run_dir), "--overwrite"]
    )
    capsys.readouterr()
    assert refused(cli.export) == (
        f"ode-export: error: OUT_DIR {run_dir} holds {run_dir / 'checkpoint-40'}, an input of this command: "
        f"writing the folder would delete it, whatever --overwrite says; give another OUT_DIR, a new folder "
        f"outside it (e.g. {run_dir}-export)\n"
    )
    run_message = (
        f"OUT_DIR {{}} holds a training run (checkpoint-40, trainer_state.json): writing the folder would delete "
        f"its checkpoints and results; --overwrite does not change that; give another OUT_DIR, a new folder "
        f"(e.g. {run_dir}-{{}})"
    )
    for name in (run_dir, tmp_path / "RUNlink"):
        with pytest.raises(FileExistsError, match=f"^{re.escape(run_message.format(name, 'export'))}$"):
            export_for_hub(other, name, overwrite=True)
    with pytest.raises(FileExistsError, match=f"^{re.escape(run_message.format(run_dir, 'upcycled'))}$"):
        upcycle_folder(other, run_dir, overwrite=True)
    with pytest.raises(FileExistsError, match=f"^{re.escape(run_message.format(run_dir, 'converted'))}$"):
        convert_fairseq_checkpoint(tmp_path / "missing.pt", run_dir, overwrite=True)
    averaged = run_message.format(run_dir, "averaged").replace("OUT_DIR", "--out")
    with pytest.raises(FileExistsError, match=f"^{re.escape(averaged)}$"):
        averaging.write_average([other], run_dir, overwrite=True)
    with pytest.raises(
        FileExistsError, match=f"holds {re.escape(str(run_dir / 'checkpoint-40'))}, an input of this"
    ):
        averaging.write_average([run_dir / "checkpoint-40"], tmp_path / "RUNlink" / "..", overwrite=True)
    assert snapshot(run_dir) == before
    export_for_hub(run_dir / "checkpoint-40", tmp_path / "exported")  # elsewhere: written
    assert sorted(p.name for p in (tmp_path / "exported").iterdir()) == EXPORTED


def test_a_full_disk_while_a_graph_is_quantised_is_named(tmp_path):
    """A full disk during `ode-export --onnx --quantize int8` ends in exit code 2 and one line saying the disk
    is full, naming the output, the graph and the fix, nothing half-written, not a protobuf "Wire format was
    corrupt" traceback: onnxruntime writes a shape-inferred copy of each graph, cut off by the full disk (its
    writer does not say so), and reads it back. Tested under a
    file-size limit, set as the first graph is quantised, that the graph fits but its copy with shapes does
    not. (The exporter's unfused graphs, written before, are larger than any copy.)"""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    save_tiny_folder(tmp_path / "model", weight_scale=3)
    out = tmp_path / "int8"
    argv = [
        str(tmp_path / "model"),
        str(out),
        "--onnx",
        "--onnx-exporter",
        "torchscript",
        "--quantize",
        "int8",
    ]
    limited = (
        "import resource, signal\nfrom ode_transformer.hub import onnx_export\n"
        "quantize = onnx_export.quantize_graph_int8\n"
        "def limited(path, model):\n"
        "    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "    resource.setrlimit(resource.RLIMIT_FSIZE, (path.stat().st_size + 1, resource.RLIM_INFINITY))\n"
        "    return quantize(path, model)\n"
        "onnx_export.quantize_graph_int8 = limited\n"
    )
    python, flag, script, *rest = command("ode-export", *argv)
    process = start([python, flag, limited + script, *rest])
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 2
    assert last_line(stderr) == (
        f"ode-export: error: [Errno 28] no space left on device while saving {out} ([Errno 28] the disk is "
        "full: onnxruntime's shape-inferred copy of encoder_model.onnx was cut off); free some space (or raise "
        "the file-size limit, `ulimit -f`) and run the command again"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing half-written


def test_a_disk_without_room_for_a_graphs_copy_is_full_before_it_is_quantised(tmp_path, monkeypatch):
    """Less free space than the graph takes (onnxruntime writes a shape-inferred copy of it beside it) is named
    as a full disk before quantize_dynamic writes anything: the graph is left as it was, and no copy."""
    pytest.importorskip("onnxruntime")
    import errno
    import shutil

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from ode_transformer.hub.onnx_export import quantize_graph_int8

    weight = numpy_helper.from_array(np.arange(64, dtype=np.float32).reshape(8, 8) / 64, "weight")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "weight"], ["y"], name="product")],
        "product",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [weight],
    )
    path = tmp_path / "onnx" / "encoder_model.onnx"
    path.parent.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    before = path.read_bytes()
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=len(before) - 1))
    with pytest.raises(OSError) as raised:
        quantize_graph_int8(path, torch.nn.Linear(1, 1))
    assert raised.value.errno == errno.ENOSPC and raised.value.strerror == (
        f"the disk is full: {len(before) - 1} bytes free, and onnxruntime writes a shape-inferred copy of "
        f"encoder_model.onnx ({len(before)} bytes) beside it"
    )
    assert path.read_bytes() == before and sorted(path.parent.iterdir()) == [path]
    monkeypatch.undo()
    quantized = quantize_graph_int8(path, torch.nn.Linear(1, 1))  # with the room, the same graph is quantised
    assert sorted(path.parent.iterdir()) == [quantized] and quantized.name == "encoder_model_quantized.onnx"
    assert "MatMulInteger" in {node.op_type for node in onnx.load(quantized).graph.node}
