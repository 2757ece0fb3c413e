"""PEFT LoRA on the target modules docs/model.md names: it trains, saves and reloads, and merging it into the model
gives the adapted model's outputs."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import torch

from modeling_ode import ODETransformerConfig, ODETransformerForConditionalGeneration

peft = pytest.importorskip("peft")

DOC = Path(__file__).resolve().parents[1] / "docs" / "model.md"


def documented_target_modules() -> list[str]:
    """The `target_modules` list of the docs' LoRA example."""
    listed = re.search(r"target_modules=\[([^\]]*)\]", DOC.read_text(encoding="utf-8"))
    return re.findall(r'"(\w+)"', listed.group(1))


def test_lora_on_the_documented_modules_trains_reloads_and_merges(tmp_path):
    targets = documented_target_modules()
    assert set(targets) == {"q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"}
    torch.manual_seed(0)
    config = ODETransformerConfig.from_preset(
        "tiny", dropout=0.0, attention_dropout=0.0, activation_dropout=0.0
    )
    base = ODETransformerForConditionalGeneration(config)
    base.save_pretrained(tmp_path / "base")
    source = torch.randint(4, config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    labels = torch.randint(4, config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = base(input_ids=source, labels=labels).logits

    lora = peft.LoraConfig(task_type=peft.TaskType.SEQ_2_SEQ_LM, r=4, lora_alpha=8, target_modules=targets)
    model = peft.get_peft_model(base, lora)
    adapted = {name.split(".")[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")}
    assert adapted == set(targets)  # every named module exists, on both sides
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    optimizer = torch.optim.Adam(trainable, lr=1e-2)
    losses = []
    for _ in range(5):
        loss = model(input_ids=source, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    model.eval()
    with torch.no_grad():
        adapted_logits = model(input_ids=source, labels=labels).logits
    assert not torch.allclose(adapted_logits, before, atol=1e-3)  # the adapter changed the function

    model.save_pretrained(tmp_path / "adapter")
    reloaded = peft.PeftModel.from_pretrained(
        ODETransformerForConditionalGeneration.from_pretrained(tmp_path / "base"), tmp_path / "adapter"
    ).eval()
    merged = model.merge_and_unload().eval()
    assert type(merged) is ODETransformerForConditionalGeneration
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=source, labels=labels).logits, adapted_logits)
        torch.testing.assert_close(
            merged(input_ids=source, labels=labels).logits, adapted_logits, atol=1e-5, rtol=0
        )
        assert torch.equal(merged.generate(source, num_beams=2, max_new_tokens=6),
                           reloaded.generate(input_ids=source, num_beams=2, max_new_tokens=6))  # fmt: skip


def test_bart_target_names_adapt_q_and_v_of_every_attention():
    """BART's usual `target_modules=["q_proj", "v_proj"]` puts LoRA on the queries and values of every attention:
    encoder self-attention, decoder self-attention and cross-attention, in every layer; a model built after
    `import peft` gives PEFT the same default (`LoraConfig()` without `target_modules`)."""
    config = ODETransformerConfig.from_preset("tiny")
    ids = torch.randint(4, config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(0))

    def adapted(targets) -> dict[str, int]:
        model = peft.get_peft_model(
            ODETransformerForConditionalGeneration(config),
            peft.LoraConfig(task_type=peft.TaskType.SEQ_2_SEQ_LM, r=2, target_modules=targets),
        )
        model(input_ids=ids, labels=ids).loss.backward()
        counts = Counter(
            ("encoder." if ".encoder.layers." in name else "decoder.") + ".".join(name.split(".")[-2:])
            for name, module in model.named_modules()
            if hasattr(module, "lora_A")
        )
        return dict(counts)

    every_block = {
        f"{where}.{projection}": layers
        for where, layers in (
            ("encoder.self_attn", config.encoder_layers),
            ("decoder.self_attn", config.decoder_layers),
            ("decoder.encoder_attn", config.decoder_layers),
        )
        for projection in ("q_proj", "v_proj")
    }
    assert adapted(["q_proj", "v_proj"]) == every_block
    assert adapted(None) == every_block
