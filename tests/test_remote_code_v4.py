"""The remote code an exported folder ships loads its config under transformers 4.x too, the version 🤗 Optimum pins
(optimum-onnx 0.1.0: transformers < 4.58), whose config base class is `PretrainedConfig` (transformers 5:
`PreTrainedConfig`) and no dataclass: Optimum's `ORTModelForSeq2SeqLM.from_pretrained(EXPORT, subfolder="onnx",
trust_remote_code=True)` reads config.json through it.

Here (transformers 5) the config module is imported under a stand-in `transformers` that hides the v5 names and
offers a 4.x-style `PretrainedConfig`; with ``ODE_OPTIMUM_PYTHON`` naming an interpreter that has optimum-onnx and
its transformers 4.57, Optimum itself loads an export and decodes it as the PyTorch model does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import transformers
from tiny_folder import save_tiny_folder

REPO = Path(__file__).resolve().parents[1]
REMOTE_CONFIG_FILES = ("configuration_ode_transformer.py", "ode.py")
"""The files `AutoConfig.from_pretrained(..., trust_remote_code=True)` imports from a folder: the config's module
and what it imports relatively."""
V5_ONLY = ("PreTrainedConfig",)


class PretrainedConfigV4:
    """transformers 4.x's config base, as far as a subclass sees it: no dataclass, an ``__init__`` taking any
    keyword, the standard ones with defaults of their own, every other one kept as an attribute."""

    model_type = ""
    attribute_map: dict = {}

    def __init__(self, **kwargs):
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            setattr(self, name, kwargs.pop(name, None))
        self.is_encoder_decoder = kwargs.pop("is_encoder_decoder", False)
        for name, value in kwargs.items():
            setattr(self, name, value)


class TransformersV4(types.ModuleType):
    """transformers with its v5-only names hidden and a 4.x-style `PretrainedConfig`."""

    def __getattr__(self, name: str):
        if name in V5_ONLY:
            raise AttributeError(name)
        if name == "PretrainedConfig":
            return PretrainedConfigV4
        return getattr(transformers, name)


def import_remote_config(folder: Path, monkeypatch) -> types.ModuleType:
    """The config module of the remote code in ``folder``, imported as a package of its own under
    :class:`TransformersV4`."""
    package = folder.parent / "remote_code_v4"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in REMOTE_CONFIG_FILES:
        shutil.copy(folder / name, package / name)
    monkeypatch.setitem(sys.modules, "transformers", TransformersV4("transformers"))
    monkeypatch.syspath_prepend(str(package.parent))
    import importlib

    return importlib.import_module("remote_code_v4.configuration_ode_transformer")


def test_the_remote_config_imports_and_builds_without_the_v5_names(tmp_path, monkeypatch):
    """The shipped config module imports without `PreTrainedConfig`, reads a saved config.json into the same fields,
    and still refuses a bad field by name."""
    save_tiny_folder(tmp_path / "model")
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    module = import_remote_config(tmp_path / "model", monkeypatch)
    assert module.DATACLASS_CONFIGS is False
    config = module.ODETransformerConfig(**saved)
    assert isinstance(config, PretrainedConfigV4)
    for field in ("d_model", "encoder_ode_method", "encoder_ode_coefficients", "pad_token_id", "vocab_size"):
        assert getattr(config, field) == saved[field], field
    assert config.use_cache is saved["use_cache"]
    unsaved = module.ODETransformerConfig(encoder_ode_method="rk4")  # the defaults, the coefficients resolved
    assert (unsaved.encoder_ode_coefficients, unsaved.pad_token_id) == ("tableau", 1)
    with pytest.raises(ValueError, match="does not divide `d_model`"):
        module.ODETransformerConfig(**{**saved, "encoder_attention_heads": 3})


OPTIMUM_PYTHON = os.environ.get("ODE_OPTIMUM_PYTHON")
OPTIMUM_DECODE = """
import json, sys
from optimum.onnxruntime import ORTModelForSeq2SeqLM
from transformers import PreTrainedTokenizerFast
folder, texts = sys.argv[1], json.loads(sys.argv[2])
tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
model = ORTModelForSeq2SeqLM.from_pretrained(folder, subfolder="onnx", trust_remote_code=True)
batch = tokenizer(texts, return_tensors="pt", padding=True)
print(json.dumps({beams: model.generate(**batch, num_beams=beams, max_new_tokens=8).tolist() for beams in (1, 4)}))
"""


@pytest.mark.skipif(not OPTIMUM_PYTHON, reason="ODE_OPTIMUM_PYTHON names no interpreter with optimum-onnx")
def test_optimum_loads_an_export_with_its_remote_code_and_decodes_as_generate(tmp_path):
    """Optimum's own `ORTModelForSeq2SeqLM` under its transformers 4.57, with `trust_remote_code=True`: the graphs
    of `ode-export --onnx` give the PyTorch model's tokens, greedy and beam 4."""
    pytest.importorskip("onnxruntime")
    from ode_transformer.hub.export import main

    model, tokenizer = save_tiny_folder(tmp_path / "model", weight_scale=3)
    out = tmp_path / "export"
    assert main([str(tmp_path / "model"), str(out), "--onnx", "--onnx-exporter", "torchscript"]) == 0
    texts = ["the dog runs", "a cat sleeps on the warm mat in the park", "zwei Hunde"]
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    decoded = subprocess.run(
        [OPTIMUM_PYTHON, "-c", OPTIMUM_DECODE, str(out), json.dumps(texts)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert decoded.returncode == 0, decoded.stderr[-3000:]
    tokens = json.loads(decoded.stdout.strip().splitlines()[-1])
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    for beams in (1, 4):
        with torch.no_grad():
            expected = model.generate(**batch, num_beams=beams, max_new_tokens=8)
        assert tokens[str(beams)] == expected.tolist(), beams
