"""One test per entry of `modeling_ode.compat`: the private API it wraps still exists in the installed release and
behaves as the project relies on. Each docstring names the releases the entry was checked on (`compat.CHECKED`);
a newer release that keeps the behaviour passes, one that drops it fails here rather than deep inside a run."""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import re

import pytest
import torch
import transformers
from packaging.version import Version
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.cache_utils import StaticCache
from transformers.generation import CompileConfig, GenerationConfig
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions, Seq2SeqLMOutput
from transformers.utils import output_capturing

import modeling_ode.modeling_ode_transformer as modeling
from modeling_ode import ODETransformerConfig, ODETransformerForConditionalGeneration, compat


def tiny_seq2seq(**overrides) -> ODETransformerForConditionalGeneration:
    torch.manual_seed(0)
    return ODETransformerForConditionalGeneration(
        ODETransformerConfig.from_preset("tiny", **overrides)
    ).eval()


def test_installed_releases_are_in_the_supported_range():
    """pyproject's ranges (transformers >= 5.23, < 6; torch >= 2.6); the entries were checked on `compat.CHECKED`.
    A release outside the checked ones is printed, not refused: the tests below say whether it still fits."""
    installed = {
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "python": platform.python_version(),
    }
    print(f"installed {installed}; checked {compat.CHECKED}")
    assert Version("5.23") <= Version(installed["transformers"]) < Version("6")
    assert Version(installed["torch"]) >= Version("2.6")
    assert set(compat.CHECKED) == set(installed)


def test_cache_field_is_the_installed_outputs_cache_name():
    """`CACHE_FIELD`, `CACHE_KWARGS`, `cache_argument`. Checked: transformers 5.23.0 (`past_key_values`), 5.24.0
    (`cache`)."""
    for output in (BaseModelOutputWithPastAndCrossAttentions, Seq2SeqLMOutput):
        assert compat.CACHE_FIELD in output.__dataclass_fields__
    if Version(transformers.__version__) >= Version("5.24"):
        assert compat.CACHE_FIELD == "cache"
    assert compat.CACHE_FIELD in compat.CACHE_KWARGS
    assert modeling.CACHE_FIELD is compat.CACHE_FIELD  # hub and tests import it from the modeling file
    cache = object()
    assert compat.cache_argument(cache, {}) is cache
    kwargs = {"cache": cache}
    assert compat.cache_argument(None, kwargs) is cache and kwargs == {}
    with pytest.raises(ValueError, match="pass the cache once"):
        compat.cache_argument(cache, {"cache": object()})


def test_active_output_collector_is_none_outside_capture_and_names_the_recorded_outputs():
    """`active_output_collector` (`output_capturing._active_collector`). Checked: transformers 5.23.0, 5.24.0."""
    assert isinstance(output_capturing._active_collector.get(), type(None))
    assert compat.active_output_collector() is None
    model = tiny_seq2seq()
    seen = []
    attention = model.model.decoder.layers[0].self_attn
    hook = attention.register_forward_hook(lambda *_: seen.append(compat.active_output_collector()))
    ids = torch.tensor([[5, 6, 7, 2]])
    try:
        model(input_ids=ids, decoder_input_ids=ids)
        model(input_ids=ids, decoder_input_ids=ids, output_attentions=True)
    finally:
        hook.remove()
    assert not seen[0] or "attentions" not in seen[0]
    assert "attentions" in seen[-1] and "cross_attentions" in seen[-1]
    assert compat.active_output_collector() is None


def test_attention_implementation_is_what_the_model_was_loaded_with(tmp_path):
    """`attention_implementation` (`PreTrainedConfig._attn_implementation`). Checked: transformers 5.23.0, 5.24.0."""
    model = tiny_seq2seq()
    assert compat.attention_implementation(model.config) == "sdpa"
    model.save_pretrained(tmp_path)
    eager = ODETransformerForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager")
    assert compat.attention_implementation(eager.config) == "eager"
    model.set_attn_implementation("eager")
    assert compat.attention_implementation(model.config) == "eager"


def test_is_loaded_weight_marks_loaded_tensors_and_keeps_a_loaded_padding_row(tmp_path):
    """`is_loaded_weight` (the `_is_hf_initialized` flag): a loaded embedding is marked, a fresh tensor is not, and a
    saved padding row that is not zero survives loading. Checked: transformers 5.23.0, 5.24.0."""
    assert not compat.is_loaded_weight(torch.nn.Parameter(torch.zeros(2)))
    model = tiny_seq2seq()
    pad = model.config.pad_token_id
    with torch.no_grad():
        model.model.shared.weight[pad] = 1.0
    model.save_pretrained(tmp_path)
    loaded = ODETransformerForConditionalGeneration.from_pretrained(tmp_path)
    assert compat.is_loaded_weight(loaded.model.shared.weight)
    assert torch.equal(loaded.model.shared.weight[pad], torch.ones_like(loaded.model.shared.weight[pad]))


def test_compile_on_any_device_lets_generate_compile_on_the_cpu():
    """`compile_on_any_device` (`CompileConfig._compile_all_devices`): `generate` decides to compile a CPU model's
    step with a static cache only when it is set. Checked: transformers 5.23.0, 5.24.0."""
    assert hasattr(CompileConfig, "_compile_all_devices")
    config = CompileConfig(fullgraph=True)
    assert compat.compile_on_any_device(config) is config and config._compile_all_devices is True
    assert "_compile_all_devices" not in config.to_dict()  # not written to generation_config.json
    model = tiny_seq2seq()
    cache = StaticCache(config=PreTrainedConfig(num_hidden_layers=1), max_cache_len=4)
    decides = {}
    for label, compile_config in (("plain", CompileConfig()), ("any device", config)):
        generation = GenerationConfig(compile_config=compile_config)
        decides[label] = model._valid_auto_compile_criteria({compat.CACHE_FIELD: cache}, generation)
    assert decides == {"plain": False, "any device": True}


def test_generation_cache_hook_sees_the_cache_generate_builds_and_not_a_given_one():
    """`GenerationCacheHook` (overrides `GenerationMixin._prepare_cache_for_generation`). Checked: transformers
    5.23.0, 5.24.0."""
    assert hasattr(GenerationMixin, "_prepare_cache_for_generation")
    model = tiny_seq2seq(decoder_ode_method="rk2")
    rebuilt = []
    original = model.rebuild_generation_cache
    model.rebuild_generation_cache = lambda cache, *args: rebuilt.append(cache) or original(cache, *args)
    ids = torch.tensor([[5, 6, 7, 2]])
    model.generate(input_ids=ids, max_new_tokens=2, num_beams=1, do_sample=False)
    assert len(rebuilt) == 1
    first = model(input_ids=ids, decoder_input_ids=ids[:, :1], use_cache=True)
    model.generate(
        input_ids=ids,
        decoder_input_ids=ids[:, :1],
        max_new_tokens=2,
        num_beams=1,
        do_sample=False,
        **{compat.CACHE_FIELD: getattr(first, compat.CACHE_FIELD)},
    )
    assert len(rebuilt) == 1


def test_model_hooks_are_read_by_transformers_and_listed():
    """`MODEL_HOOKS`: each underscore hook the model classes define is one transformers still reads, and every such
    name the modeling file defines is listed (`_auto_class`, which `register_for_auto_class` sets, is not defined
    there). Checked: transformers 5.23.0, 5.24.0."""
    for hook in compat.MODEL_HOOKS:
        if hook == "_reorder_cache":  # looked up with hasattr in beam search, defined by no base class
            assert re.search(r"hasattr\(self, \"_reorder_cache\"\)", inspect.getsource(GenerationMixin))
        else:
            assert hasattr(PreTrainedModel, hook), hook
    defined = set()
    for value in vars(modeling).values():
        if isinstance(value, type) and issubclass(value, GenerationMixin | PreTrainedModel):
            if value.__module__ != modeling.__name__:
                continue
            defined |= {
                name
                for name in vars(value)
                if name.startswith("_")
                and not name.startswith("__")
                and re.search(rf"\b{name}\b", inspect.getsource(value))
                and (
                    hasattr(PreTrainedModel, name)
                    or hasattr(GenerationMixin, name)
                    or name == "_reorder_cache"
                )
            }
    assert defined <= set(compat.MODEL_HOOKS), defined - set(compat.MODEL_HOOKS)
    assert "_reorder_cache" in defined


def test_trainer_hooks_exist_with_the_signatures_overridden_and_are_listed():
    """`TRAINER_HOOKS`: each private `Trainer` method ode_transformer.train.trainer overrides still exists, with the parameters the
    override takes, and the token-budget trainers override no other. Checked: transformers 5.23.0, 5.24.0."""
    from transformers import Trainer

    from ode_transformer.train.trainer import TokenBudgetSeq2SeqTrainer, TokenBudgetTrainer

    for hook in compat.TRAINER_HOOKS:
        ours = inspect.signature(getattr(TokenBudgetTrainer, hook)).parameters
        theirs = inspect.signature(getattr(Trainer, hook)).parameters
        assert list(ours) == list(theirs)[: len(ours)], (hook, list(ours), list(theirs))
    for trainer in (TokenBudgetTrainer, TokenBudgetSeq2SeqTrainer):
        overridden = {
            name
            for klass in trainer.__mro__
            if klass.__module__ == TokenBudgetTrainer.__module__
            for name in vars(klass)
            if name.startswith("_") and not name.startswith("__") and hasattr(Trainer, name)
        }
        assert overridden == set(compat.TRAINER_HOOKS), overridden


def test_forget_auto_class_keeps_save_pretrained_from_writing_an_auto_map(tmp_path):
    """`forget_auto_class` (`_auto_class`, which `save_pretrained` maps into `auto_map`). Checked: transformers
    5.23.0, 5.24.0."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    class LocalTokenizer(PreTrainedTokenizerFast):  # a class of this file: save_pretrained copies it as code
        pass

    tokenizer = LocalTokenizer(tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, "<unk>")))
    tokenizer.register_for_auto_class("AutoTokenizer")
    tokenizer.save_pretrained(tmp_path / "mapped")
    assert "auto_map" in json.loads((tmp_path / "mapped" / "tokenizer_config.json").read_text())
    compat.forget_auto_class(tokenizer)
    tokenizer.save_pretrained(tmp_path / "plain")
    assert "auto_map" not in json.loads((tmp_path / "plain" / "tokenizer_config.json").read_text())


def fused_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` as earlier releases saved it: self-attention's q, k and v stacked in one `qkv_proj`,
    cross-attention's k and v in one `kv_proj` (fairseq's `in_proj` order)."""
    out = dict(state)
    for attention, first, fused, parts in (
        ("self_attn", "q", "qkv", "qkv"),
        ("encoder_attn", "k", "kv", "kv"),
    ):
        for key in [key for key in state if f".{attention}.{first}_proj." in key]:
            names = [key.replace(f".{first}_proj.", f".{part}_proj.") for part in parts]
            out[key.replace(f".{first}_proj.", f".{fused}_proj.")] = torch.cat(
                [out.pop(name) for name in names]
            )
    return out


@pytest.mark.parametrize("causal", [False, True], ids=["seq2seq", "causal_lm"])
def test_register_weight_splits_loads_a_fused_checkpoint_with_the_same_outputs(tmp_path, causal):
    """`register_weight_splits`: a folder saved with the fused projections of earlier releases loads through
    `from_pretrained` with nothing missing or unexpected and the same logits and beam search; saved again, its
    weights carry the separate names. Checked: transformers 5.23.0, 5.24.0."""
    from safetensors.torch import load_file, save_file

    from modeling_ode import ODETransformerForCausalLM

    cls = ODETransformerForCausalLM if causal else ODETransformerForConditionalGeneration
    torch.manual_seed(0)
    model = cls(ODETransformerConfig.from_preset("tiny", is_encoder_decoder=not causal)).eval()
    model.save_pretrained(tmp_path / "old")
    weights = tmp_path / "old" / "model.safetensors"
    separate = load_file(weights)
    old = fused_layout(separate)
    assert any(".qkv_proj." in key for key in old) and any(".kv_proj." in key for key in old) != causal
    save_file(old, weights, metadata={"format": "pt"})

    loaded, info = cls.from_pretrained(tmp_path / "old", output_loading_info=True)
    assert all(not keys for keys in info.values()), info
    ids = torch.randint(4, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded.eval()(input_ids=ids).logits, model(input_ids=ids).logits)
        beams = {"num_beams": 3, "max_new_tokens": 5, "min_new_tokens": 5}
        assert torch.equal(loaded.generate(input_ids=ids, **beams), model.generate(input_ids=ids, **beams))
    loaded.save_pretrained(tmp_path / "new")
    assert load_file(tmp_path / "new" / "model.safetensors").keys() == separate.keys()


def test_load_state_dict_splits_the_fused_projections_as_trainer_resume_needs():
    """`load_state_dict` (what `Trainer` resumes and loads the best checkpoint with, outside `from_pretrained`)
    splits the fused projections too (`split_fused_projections`): every key matches and the logits are equal."""
    model = tiny_seq2seq()
    state = fused_layout(model.state_dict())
    torch.manual_seed(1)
    other = ODETransformerForConditionalGeneration(model.config).eval()
    assert not other.load_state_dict(state, strict=True).missing_keys
    ids = torch.randint(4, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(other(input_ids=ids).logits, model(input_ids=ids).logits)


def test_order_argument_groups_puts_the_named_groups_first_in_help():
    """`order_argument_groups` (argparse's `_action_groups`). Checked: Python 3.11.7."""
    parser = argparse.ArgumentParser(prog="p")
    parser.add_argument("--zeta")
    first = parser.add_argument_group("first group")
    first.add_argument("--alpha")
    parser.add_argument("recipe", nargs="?")
    assert (
        compat.order_argument_groups(
            parser, ("positional arguments", "first group"), titles={"options": "other flags"}
        )
        is parser
    )
    titles = [group.title for group in parser._action_groups]
    assert titles == ["positional arguments", "first group", "other flags"]
    text = parser.format_help()
    assert text.index("positional arguments:") < text.index("first group:") < text.index("other flags:")
    assert "--zeta" in text.split("other flags:")[1]


def test_parser_actions_lists_every_flag():
    """`parser_actions` (argparse's `_actions`). Checked: Python 3.11.7."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--learning_rate", type=float)
    parser.add_argument_group("g").add_argument("--seed", type=int)
    actions = {action.dest: action for action in compat.parser_actions(parser)}
    assert set(actions) == {"help", "learning_rate", "seed"} and actions["seed"].type is int


def test_compiled_graph_count_counts_a_compile_after_a_reset():
    """`reset_compiled_graphs`, `compiled_graph_count` (`torch._dynamo.utils.counters`). Checked: torch 2.13.0."""
    compat.reset_compiled_graphs()
    before = compat.compiled_graph_count()
    compiled = torch.compile(lambda x: x * 2 + 1, backend="eager")
    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 3.0))
    assert compat.compiled_graph_count() == before + 1
    compat.reset_compiled_graphs()


def test_inductor_fallback_random_is_set_within_the_block_only():
    """`inductor_fallback_random` (`torch._inductor.config.patch`). Checked: torch 2.13.0."""
    import torch._inductor.config

    before = torch._inductor.config.fallback_random
    with compat.inductor_fallback_random(not before):
        assert torch._inductor.config.fallback_random is (not before)
        assert compat.inductor_fallback_random_enabled() is (not before)
    assert (
        torch._inductor.config.fallback_random is before
        and compat.inductor_fallback_random_enabled() is before
    )


def test_graph_breaks_counts_the_graphs_and_the_breaks_with_their_reasons():
    """`graph_breaks` (`torch._dynamo.explain`). Checked: torch 2.13.0."""

    def straight(x):
        return torch.sin(x) + 1

    def broken(x):
        y = torch.sin(x)
        print("a graph break")  # dynamo cannot trace print: two graphs, one break
        return y + 1

    assert compat.graph_breaks(straight, torch.ones(3))[:2] == (1, 0)
    graphs, breaks, reasons = compat.graph_breaks(broken, torch.ones(3))
    assert (graphs, breaks) == (2, 1) and len(reasons) == 1


def test_raise_recompile_limit_raises_and_never_lowers():
    """`raise_recompile_limit` (`torch._dynamo.config.recompile_limit`). Checked: torch 2.13.0."""
    import torch._dynamo.config

    before = torch._dynamo.config.recompile_limit
    try:
        compat.raise_recompile_limit(before + 5)
        assert torch._dynamo.config.recompile_limit == before + 5
        compat.raise_recompile_limit(1)
        assert torch._dynamo.config.recompile_limit == before + 5
    finally:
        torch._dynamo.config.recompile_limit = before
