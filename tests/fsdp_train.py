"""Worker for tests/test_train_accelerate.py::test_fsdp_training: run by ``accelerate launch`` in 2 CPU processes.

For each tiny model of ``MODELS`` (seq2seq, tied embeddings as the model ties them): train a few AdamW steps
under accelerate's FSDP (each process takes half of a fixed batch), gather the full state dict, save it with
``save_pretrained`` and, in the main process, measure what the test asserts into ``OUT/NAME.json``:

- the model reloaded with ``from_pretrained`` against one built from the gathered state dict (logits, greedy
  tokens through the per-stage KV cache);
- against the initial model (training changed it);
- against the same steps taken in one process on the whole batch (the gradients FSDP reduced for parameters
  that every RK stage reuses, and for the tied embeddings, are the unsharded ones).

Usage: ``accelerate launch --multi_gpu --num_processes 2 tests/fsdp_train.py OUT``.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

from modeling_ode import ODETransformerConfig, ODETransformerForConditionalGeneration

# The RK stages of a block reuse one layer's parameters; both stacks are ODE blocks so that the decoder's
# per-stage cache is used by the greedy decoding below.
MODELS: dict[str, dict] = {
    "rk2_gated": {"encoder_ode_method": "rk2", "encoder_ode_coefficients": "gated", "decoder_ode_method": "rk2",
                  "decoder_ode_coefficients": "gated"},
    "rk4": {"encoder_ode_method": "rk4", "encoder_ode_coefficients": "tableau", "decoder_ode_method": "rk4",
            "decoder_ode_coefficients": "tableau"},
}  # fmt: skip
STEPS = 3
# FSDP2 (`fully_shard`) under accelerate 1.15 fails for any encoder-decoder whose encoder and decoder embedding
# modules share one weight (MarianMT too): accelerate puts the input embedding and lm_head in one group and leaves
# `encoder.embed_tokens` in the root's, which torch 2.13 refuses (docs/distributed.md).
FSDP_VERSION = 1
BATCH, SOURCE_LENGTH, TARGET_LENGTH = 8, 12, 10


def fsdp_accelerator() -> Accelerator:
    """An Accelerator that shards with FSDP on CPU processes (gloo).

    accelerate 1.15 turns an FSDP plugin on only for accelerator devices (``AcceleratorState`` keeps
    ``MULTI_CPU`` and prepares DDP, silently); and FSDP1 rejects its ``device_id`` ``cpu:0`` against the compute
    device ``cpu``. Setting the state as a GPU launch would runs accelerate's own FSDP code path on CPU.
    """
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=FSDP_VERSION,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=list(ODETransformerForConditionalGeneration._no_split_modules),
        state_dict_type="FULL_STATE_DICT",
        use_orig_params=True,  # accelerate's and the Trainer's default; the state dict then has the model's names
        cpu_ram_efficient_loading=False,
    )
    accelerator = Accelerator(fsdp_plugin=plugin, cpu=True)
    # In both shared states: every new `AcceleratorState()` (accelerate makes them as it goes) copies
    # `PartialState`'s fields over its own.
    for state in (PartialState(), accelerator.state):
        state.distributed_type = DistributedType.FSDP
        state.device = torch.device("cpu")
    accelerator.state.fsdp_plugin = plugin
    return accelerator


def gathered_state_dict(model) -> dict:
    """The full (unsharded) state dict, in every process.

    Not ``accelerator.get_state_dict``: it asks FSDP1 for ``offload_to_cpu=True``, which for parameters that are
    already on the CPU returned the root unit's tensors as views of the freed unsharded storage (empty or still
    sharded tensors, or a crash) with torch 2.13; on a GPU the offload is a real copy.
    """
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    # Not the `FSDP.state_dict_type` context: on leaving, it restores the previous type, which accelerate set on
    # the first model it prepared only.
    FSDP.set_state_dict_type(
        model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=False, rank0_only=False)
    )
    return model.state_dict()


def tiny_model(overrides: dict) -> ODETransformerForConditionalGeneration:
    torch.manual_seed(0)  # the same initial weights in every process
    config = ODETransformerConfig.from_preset(
        "tiny", dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, **overrides
    )
    return ODETransformerForConditionalGeneration(config)


def fixed_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Unpadded, so that the mean of the per-process losses is the loss of the whole batch."""
    generator = torch.Generator().manual_seed(1)
    source = torch.randint(4, 99, (BATCH, SOURCE_LENGTH), generator=generator)
    target = torch.randint(4, 99, (BATCH, TARGET_LENGTH), generator=generator)
    return source, target


def train(model, optimizer, backward, source: torch.Tensor, target: torch.Tensor) -> list[float]:
    model.train()
    losses = []
    for _ in range(STEPS):
        loss = model(input_ids=source, labels=target).loss
        backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def optimizer_for(model) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2)


@torch.no_grad()
def compare(folder: Path, gathered: dict, initial, reference, source, target) -> dict:
    reloaded = ODETransformerForConditionalGeneration.from_pretrained(folder)
    from_gathered = ODETransformerForConditionalGeneration(reloaded.config)
    missing, unexpected = from_gathered.load_state_dict(gathered, strict=False)
    models = {"reloaded": reloaded, "gathered": from_gathered, "initial": initial, "reference": reference}
    logits = {}
    for name, model in models.items():
        model.eval()
        logits[name] = model(input_ids=source, labels=target).logits
    greedy = {
        name: models[name].generate(source[:2], max_new_tokens=6, num_beams=1, do_sample=False).tolist()
        for name in ("reloaded", "gathered")
    }
    shared = reloaded.model.shared.weight
    tied = reloaded.lm_head.weight is shared and reloaded.model.encoder.embed_tokens.weight is shared
    return {
        "missing": missing,
        "unexpected": unexpected,
        "reloaded_vs_gathered": (logits["reloaded"] - logits["gathered"]).abs().max().item(),
        "reloaded_vs_initial": (logits["reloaded"] - logits["initial"]).abs().max().item(),
        "reloaded_vs_one_process": (logits["reloaded"] - logits["reference"]).abs().max().item(),
        "greedy_equal": greedy["reloaded"] == greedy["gathered"],
        "tied_after_reload": tied,
    }


def main(out: Path) -> None:
    accelerator = fsdp_accelerator()
    source, target = fixed_batch()
    half = slice(accelerator.process_index * BATCH // 2, (accelerator.process_index + 1) * BATCH // 2)
    for name, overrides in MODELS.items():
        model = tiny_model(overrides)
        initial = copy.deepcopy(model)
        model, optimizer = accelerator.prepare(model, optimizer_for(model))
        local_numel = sum(p.numel() for p in model.parameters())  # this process's shards
        losses = train(model, optimizer, accelerator.backward, source[half], target[half])
        gathered = gathered_state_dict(model)
        folder = out / name
        # A copy: save_pretrained takes the entries out of the dict it is given.
        accelerator.unwrap_model(model).save_pretrained(
            folder,
            state_dict=dict(gathered),
            is_main_process=accelerator.is_main_process,
            save_function=accelerator.save,
        )
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            reference = copy.deepcopy(initial)
            train(reference, optimizer_for(reference), torch.Tensor.backward, source, target)
            report = compare(folder, gathered, initial, reference, source, target)
            report["losses"] = losses
            report["wrapper"] = type(model).__name__
            report["local_fraction"] = local_numel / sum(p.numel() for p in initial.parameters())
            (out / f"{name}.json").write_text(json.dumps(report))
        accelerator.wait_for_everyone()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
