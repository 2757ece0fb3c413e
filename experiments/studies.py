"""The studies of the reproduction: small declarative tables of ``ode_transformer.train.run`` flags.

A study is ``variants x depths x seeds``; each cell is one ``python -m ode_transformer.train.run`` with the study's
common flags, its size's flags, the variant's flags, the depth and the seed. Sizes:

* ``cpu``: reduced models that a 2-core machine trains in the background (the runs resume);
* ``paper``: the paper's sizes and schedules, for a GPU.

Every variant of a study gets the same data, budget, schedule and seeds: only its own flags differ.
The paper's numbers (``paper``) are keyed by ``(variant, depth)`` and printed beside ours.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from typing import Any

Flags = dict[str, Any]


@dataclass(frozen=True)
class Variant:
    """One model variant: a label for tables and the flags that make it."""

    label: str
    flags: Flags


@dataclass(frozen=True)
class Metric:
    """A test metric as ``ode_transformer.train.run`` names it in ``hub_metrics.json`` (``results[].name``)."""

    name: str
    lower_is_better: bool = False
    digits: int = 2  # decimals in tables: 4 for metrics given as fractions (M2)
    # Derived, not recorded: the perplexity of the metric named here (its loss summed over the test split's words
    # and end-of-sentence tokens) with the same loss divided by the words alone (experiments.report).
    per_word_of: str | None = None


@dataclass(frozen=True)
class ExtraTest:
    """A further test set, scored on the trained model with the commands a user would run:
    ``python -m ode_transformer.translate MODEL --input SOURCE``, then ``python -m ode_transformer.train.evaluate_predictions --task TASK``
    against the sources and references. Paths are relative to the data root; ``metrics`` maps a key of
    ``evaluate_predictions``' JSON to the name the result records it under."""

    name: str
    task: str
    source: str
    references: tuple[str, ...]
    metrics: dict[str, str]


@dataclass(frozen=True)
class Study:
    name: str
    description: str
    common: Flags
    sizes: dict[str, Flags]
    variants: dict[str, Variant]
    depth_flags: tuple[str, ...]
    depths: tuple[int, ...]
    metrics: tuple[Metric, ...]
    seeds: tuple[int, ...] = (0, 1, 2)
    paper: dict[tuple[str, int], float] = field(default_factory=dict)
    baseline: str = "residual"
    # Corpora read besides the `dataset` flag's and the extra tests' files (a fixed test set such as GEC's
    # CoNLL-2013): recorded with checksums in every result.
    test_corpora: tuple[str, ...] = ()
    extra_tests: tuple[ExtraTest, ...] = ()
    # A study that fine-tunes trained models: the folder each run starts from (``--model_name_or_path``), relative
    # to the repository root, ``{seed}`` standing for the run's seed; ``experiments.run --source`` gives another.
    source: str | None = None
    # Rows of another study that each variant is also compared with, paired by seed within the same batch (size
    # and --batch): ``(study, {variant: its variant there})``, e.g. an upcycled RK2 row against RK2 from scratch.
    reference: tuple[str, dict[str, str]] | None = None
    # The paper's gap over the baseline for a variant whose comparison the paper makes in another setting than the
    # study's (its WMT'14 En-De base models for the Multi30k studies), so not a number of `paper`'s column: the effect
    # experiments.report sizes the study's seeds against where `paper` has none.
    paper_gap: dict[str, float] = field(default_factory=dict)
    # Tests between two rows other than the baseline, ``(variant, other)`` at each depth where both ran: paired by
    # seed, commit, device and precision as a row is with its baseline, on the primary metric, and Holm-corrected
    # together with the table's rows, so that a sentence ordering two blocks has a test to cite.
    pairwise: tuple[tuple[str, str], ...] = ()

    @property
    def tested_rows(self) -> tuple[str, ...]:
        """The rows compared with a baseline: every variant that is not one."""
        return tuple(variant for variant in self.variants if self.baseline_of(variant) != variant)

    def holm_family(self, primary: bool = True) -> int:
        """The number of tests the study declares for one metric's table, whether or not they have run: every
        tested row against its baseline at every depth, and for the primary metric the declared tests between two
        rows (``pairwise``) at every depth. Holm corrects over this many, so a table read before its last rows ran
        is held to the bar it will have once they have."""
        per_depth = len(self.tested_rows) + (len(self.pairwise) if primary else 0)
        return per_depth * len(self.depths)

    def source_path(self, seed: int, source: str | None = None) -> str | None:
        """The model folder a run of ``seed`` starts from: ``source`` (else the study's own) with the seed filled in;
        None for a study that trains from scratch."""
        template = source or self.source
        if template is not None and self.source is None:
            raise ValueError(f"study {self.name!r} trains from scratch: it takes no source model")
        return None if template is None else template.format(seed=seed)

    def baseline_of(self, variant: str) -> str:
        """The variant a gap is measured against: variants named ``BLOCK.FACTOR`` compare with the
        baseline block under the same factor (``rk4.word`` with ``residual.word``), or under the first
        factor where the factor does not apply to the baseline (``rk4.codeF`` with ``residual.pilot``)."""
        factor = variant.partition(".")[2]
        if not factor:
            return self.baseline
        same = f"{self.baseline}.{factor}"
        return (
            same
            if same in self.variants
            else next(v for v in self.variants if v.startswith(f"{self.baseline}."))
        )

    def flags(self, variant: str, depth: int, seed: int, size: str, source: str | None = None) -> Flags:
        """The ``ode_transformer.train.run`` flags of one run (later entries override earlier ones); a study with a source model
        starts each run from it (``source_path``)."""
        if size not in self.sizes:
            raise ValueError(f"study {self.name!r} has no size {size!r}; sizes: {', '.join(self.sizes)}")
        depth_flags = dict.fromkeys(self.depth_flags, depth)
        start = self.source_path(seed, source)
        return {
            **self.common,
            **self.sizes[size],
            **self.variants[variant].flags,
            **depth_flags,
            **({"model_name_or_path": start} if start is not None else {}),
            "seed": seed,
        }

    def flag_changes(
        self, result: dict[str, Any], overrides: Flags | None = None, source: str | None = None
    ) -> dict[str, tuple[Any, Any]]:
        """What a recorded run's flags would be now: ``{flag: (recorded, now)}`` for every flag whose value in
        ``result`` differs from what this study (with ``overrides``, as ``--set`` gives them, and ``source``, as
        ``--source`` does) sets for that run; None where a side lacks the flag. Compared as text, the way the command
        line passes them."""
        now = {
            **self.flags(result["variant"], result["depth"], result["seed"], result["size"], source),
            **(overrides or {}),
        }
        recorded = {RENAMED_FLAGS.get(key, key): value for key, value in result["flags"].items()}
        return {
            key: (recorded.get(key), now.get(key))
            for key in sorted(set(recorded) | set(now))
            if str(recorded.get(key)) != str(now.get(key))
        }


# Flags that recorded runs name by another name with the same meaning: a record's --label_smoothing is
# transformers' --label_smoothing_factor (the model's loss is plain cross entropy; the Trainer smooths the labels).
RENAMED_FLAGS = {"label_smoothing": "label_smoothing_factor"}


def describe_changes(changes: dict[str, tuple[Any, Any]]) -> str:
    """``flag old -> new`` for each flag of :meth:`Study.flag_changes`, ``-`` where a side lacks it."""
    shown = {key: ["-" if value is None else value for value in pair] for key, pair in changes.items()}
    return ", ".join(f"{key} {old} -> {new}" for key, (old, new) in shown.items())


def run_id(variant: str, depth: int, seed: int) -> str:
    """The file stem of one run's result: ``<variant>-<depth>-seed<k>``."""
    return f"{variant}-{depth}-seed{seed}"


BATCH_LABEL = re.compile(r"[A-Za-z0-9]+")


def batch_label(label: str) -> str:
    """A batch's label, letters and digits only (:func:`size_and_batch` splits the folder name at its ``_``); the
    ``--batch`` argument type of experiments.run and experiments.report."""
    if not BATCH_LABEL.fullmatch(label):
        raise argparse.ArgumentTypeError(f"batch label {label!r}: letters and digits only, e.g. h200")
    return label


def batch_folder(size: str, batch: str | None = None) -> str:
    """The folder of one batch of a study at a size, under ``results/<study>/`` and the work folder: ``cpu``, or
    ``cpu_h200`` for a second batch of the same recipe run elsewhere (another device or precision). The report
    compares runs within one folder only, so a batch never pairs with another batch's runs."""
    return size if batch is None else f"{size}_{batch_label(batch)}"


def size_and_batch(folder: str) -> tuple[str, str | None]:
    """:func:`batch_folder` read back: ``cpu_h200`` -> ``("cpu", "h200")``, ``cpu`` -> ``("cpu", None)``."""
    size, _, batch = folder.partition("_")
    return size, batch or None


# --------------------------------------------------------------------------------------------
# Model variants. The paper's F is G(LN(y)); the authors' code evaluates the whole pre-norm layer
# (F includes the layer's residual): `ode_function_includes_residual`.

CODE_F = {"ode_function_includes_residual": True}


def _lm_block(method: str, coefficients: str = "tableau") -> Flags:
    return {"decoder_ode_method": method, "decoder_ode_coefficients": coefficients}


def _encoder_block(method: str, coefficients: str = "tableau", **more: Any) -> Flags:
    return {"encoder_ode_method": method, "encoder_ode_coefficients": coefficients, **more}


def _pcformer(side: str, method: str) -> Flags:
    """PCformer (Li et al., NeurIPS 2024) as released: an EMA predictor with one alpha for the stack, and the
    corrector, whose layer connections (a learned history of layer-normalised states) replace the study's."""
    return {
        f"{side}_ode_method": method,
        f"{side}_ode_coefficients": "ema",
        f"{side}_layer_connections": "predictor_corrector",
        "ode_coefficient_scope": "stack",
    }


def _both_readings(blocks: dict[str, tuple[str, Flags]]) -> dict[str, Variant]:
    """Each RK block in the paper's reading of F and, suffixed ``_codeF``, the authors' code's."""
    variants = {}
    for key, (label, flags) in blocks.items():
        variants[key] = Variant(label, flags)
        if key != "residual":
            variants[f"{key}_codeF"] = Variant(f"{label}, code F", {**flags, **CODE_F})
    return variants


# --------------------------------------------------------------------------------------------
# ptb: truncation error (Table "truncate_error")

PTB_BLOCKS = {
    "residual": ("Residual-Block", _lm_block("euler")),
    "rk2": ("RK2-block", _lm_block("rk2")),
    "rk2_ones": ("RK2-block (gamma=1)", _lm_block("rk2", "ones")),
    "rk2_gated": ("RK2-block (learnable gamma)", _lm_block("rk2", "gated")),
    "rk4": ("RK4-block", _lm_block("rk4")),
    # Beyond the paper: PCformer's predictor-corrector blocks (their own connections, not plain stacking).
    "pc_rk2": ("PC-RK2 (PCformer)", _pcformer("decoder", "rk2")),
    "pc_rk4": ("PC-RK4 (PCformer)", _pcformer("decoder", "rk4")),
}

PTB_COMMON: Flags = {
    "task": "lm",
    "dataset": "ptb",
    # The paper's word-level vocabulary: every PTB word (9,999 types with <unk>) plus <s>, <pad>, </s>.
    "tokenizer_type": "word",
    "vocab_size": 10002,
    # One sentence per sequence (<s> sentence </s>), the same for every variant; perplexity per word
    # counts </s>, as Mikolov's PTB does.
    "max_target_length": 128,
    "preset": "base",
    # Plain stacking: a 1-layer model is then exactly embedding -> ODE block -> LN -> softmax, the
    # paper's truncation-error setting (no dense connections mixing the embedding into the output).
    "decoder_layer_connections": "residual",
    "label_smoothing_factor": 0.0,
    "adam_beta1": 0.9,
    "adam_beta2": 0.98,
    "weight_decay": 0.0,
    "lr_scheduler_type": "inverse_sqrt",
    "max_tokens": 4096,
    "eval_strategy": "epoch",
    "save_strategy": "epoch",
    "save_total_limit": 1,
    "load_best_model_at_end": True,
    "metric_for_best_model": "loss",
    "per_device_eval_batch_size": 64,
    "logging_steps": 50,
}

PTB = Study(
    name="ptb",
    description="Penn Treebank language model, 1 and 2 layers: test perplexity per word at the epoch of "
    "the best validation perplexity (Table 'truncate_error').",
    common=PTB_COMMON,
    sizes={
        # The 10k-word softmax dominates a PTB step on a CPU whatever the model's width, so the budget is
        # set in tokens: 2 epochs; 2K-token batches buy twice the updates of 4K ones for the same time.
        "cpu": {
            "d_model": 256,
            "decoder_ffn_dim": 1024,
            "decoder_attention_heads": 4,
            "learning_rate": 1e-3,
            "warmup_steps": 500,
            "num_train_epochs": 2,
            "max_tokens": 2048,
            "use_cpu": True,
            "bf16": True,
        },
        "paper": {
            "d_model": 512,
            "decoder_ffn_dim": 2048,
            "decoder_attention_heads": 8,
            "learning_rate": 7e-4,
            "warmup_steps": 2000,
            "num_train_epochs": 20,
            "bf16": True,
        },
    },
    variants=_both_readings(PTB_BLOCKS),
    depth_flags=("decoder_layers",),
    depths=(1, 2),
    metrics=(Metric("Word perplexity", lower_is_better=True),),
    paper={
        ("residual", 1): 142.33,
        ("residual", 2): 136.07,
        ("rk2", 1): 131.80,
        ("rk2", 2): 123.12,
        ("rk2_ones", 1): 132.67,
        ("rk2_ones", 2): 123.90,
        ("rk2_gated", 1): 128.48,
        ("rk2_gated", 2): 121.02,
        ("rk4", 1): 126.89,
        ("rk4", 2): 119.46,
    },
)

# --------------------------------------------------------------------------------------------
# ptb_pilot: what put RK behind residual in the first pilot? One factor at a time from the pilot
# (BPE 10k, DLCL connections, d 256, 3 epochs, lr 1e-3, warmup 300), every model variant alike.

PILOT: Flags = {
    **PTB_COMMON,
    "tokenizer_type": "bpe",
    "vocab_size": 10000,
    "decoder_layer_connections": "learnable_dense",  # the preset's default, which the pilot used
    # The pilot's own schedule (kept as it ran, before the `ptb` study's cpu size was set).
    "d_model": 256,
    "decoder_ffn_dim": 1024,
    "decoder_attention_heads": 4,
    "learning_rate": 1e-3,
    "warmup_steps": 300,
    "num_train_epochs": 3,
    "use_cpu": True,
    "bf16": True,
}
PILOT_FACTORS: dict[str, tuple[str, Flags]] = {
    "pilot": ("as the pilot", {}),
    "word": ("word-level 10k vocabulary", {"tokenizer_type": "word", "vocab_size": 10002}),
    "plain": ("plain stacking (no DLCL)", {"decoder_layer_connections": "residual"}),
    "nodrop": ("no dropout", {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}),
    "codeF": ("F = the whole layer (authors' code)", CODE_F),
    "lr5e-4": ("learning rate 5e-4", {"learning_rate": 5e-4}),
}
PILOT_BLOCKS = {key: PTB_BLOCKS[key] for key in ("residual", "rk2_gated", "rk4")}

PTB_PILOT = Study(
    name="ptb_pilot",
    description="The PTB pilot (BPE, DLCL, 3 epochs) and one factor changed at a time, 1 layer: test "
    "perplexity per word at the best validation epoch.",
    common=PILOT,
    sizes={"cpu": {}},
    variants={
        f"{block}.{factor}": Variant(f"{label}, {factor_label}", {**block_flags, **factor_flags})
        for factor, (factor_label, factor_flags) in PILOT_FACTORS.items()
        for block, (label, block_flags) in PILOT_BLOCKS.items()
        if not (block == "residual" and factor == "codeF")  # Euler has no stages to re-read
    },
    depth_flags=("decoder_layers",),
    depths=(1,),
    metrics=(Metric("Word perplexity", lower_is_better=True),),
    seeds=(0,),
)

# --------------------------------------------------------------------------------------------
# ptb_long: does the gap of the `ptb` study close with training? Its cpu setting for 6 epochs instead of 2.
# The inverse square-root schedule does not depend on the number of epochs, so epochs 1-2 of these runs are
# the `ptb` runs of the same seed, and the validation curve continues them.

PTB_LONG = Study(
    name="ptb_long",
    description="The ptb study's cpu setting (1 layer) trained for 6 epochs instead of 2: validation perplexity "
    "per epoch, and test perplexity per word at the best validation epoch.",
    common={**PTB_COMMON, **PTB.sizes["cpu"], "num_train_epochs": 6},
    sizes={"cpu": {}},
    variants={key: PTB.variants[key] for key in ("residual", "rk2", "rk2_gated", "rk4")},
    depth_flags=("decoder_layers",),
    depths=(1,),
    metrics=PTB.metrics,
    seeds=(0,),
    paper=PTB.paper,
    pairwise=(("rk4", "rk2_gated"),),
)

# --------------------------------------------------------------------------------------------
# ptb_paper: the `ptb` study at the paper's size, trained to convergence on a CPU. 1 layer, d 512, FFN 2048,
# 8 heads, dropout 0.1, the paper's schedule (lr 7e-4, inverse square root after 2,000 warm-up updates,
# 4,096-token batches), up to 20 epochs; the epoch with the best validation perplexity is kept and a run stops
# once validation has not improved for 3 epochs.

PTB_PAPER = Study(
    name="ptb_paper",
    description="Penn Treebank language model at the paper's size (1 layer, d 512), trained to convergence: "
    "test perplexity per word at the epoch of the best validation perplexity (Table 'truncate_error').",
    common={
        **PTB_COMMON,
        "d_model": 512,
        "decoder_ffn_dim": 2048,
        "decoder_attention_heads": 8,
        "dropout": 0.1,
        "learning_rate": 7e-4,
        "warmup_steps": 2000,
        "max_tokens": 4096,
        "num_train_epochs": 20,
        "early_stopping_patience": 3,
    },
    sizes={"cpu": {"use_cpu": True, "bf16": True}, "paper": {"bf16": True}},
    variants={key: PTB.variants[key] for key in ("residual", "rk2", "rk2_ones", "rk2_gated", "rk4")},
    depth_flags=("decoder_layers",),
    depths=(1,),
    # Word perplexity counts each sentence's </s> as a token (the usual PTB figure); the paper does not say which it
    # reports, so the same loss per word alone stands beside it.
    metrics=(*PTB.metrics, Metric("Per word, no </s>", lower_is_better=True, per_word_of="Word perplexity")),
    paper={key: value for key, value in PTB.paper.items() if key[1] == 1},
    pairwise=(("rk4", "rk2_gated"),),
)

# --------------------------------------------------------------------------------------------
# multi30k: translation En-De (Table "main-results" at a small scale)

MULTI30K_COMMON: Flags = {
    "task": "translation",
    "dataset": "multi30k",
    "source_lang": "en",
    "target_lang": "de",
    "preset": "base",
    "vocab_size": 8000,
    "max_source_length": 64,
    "max_target_length": 64,
    "adam_beta1": 0.9,
    "adam_beta2": 0.997,
    "weight_decay": 0.0,
    "max_grad_norm": 0.0,
    "lr_scheduler_type": "inverse_sqrt",
    "save_strategy": "steps",
    "save_total_limit": 5,
    "average_last_checkpoints": 5,
    "eval_strategy": "no",
    "predict_with_generate": True,
    "num_beams": 4,
    "length_penalty": 0.6,
    "per_device_eval_batch_size": 64,
    "logging_steps": 50,
}
MULTI30K_BLOCKS = {
    "residual": ("Residual", _encoder_block("euler")),
    "rk2": ("RK2-block", _encoder_block("rk2")),
    "rk2_gated": ("RK2-block (learnable gamma)", _encoder_block("rk2", "gated")),
    "rk4": ("RK4-block", _encoder_block("rk4")),
    # Beyond the paper: PCformer's predictor-corrector encoder blocks.
    "pc_rk2": ("PC-RK2 (PCformer)", _pcformer("encoder", "rk2")),
    "pc_rk4": ("PC-RK4 (PCformer)", _pcformer("encoder", "rk4")),
}
# The authors' code's form of Eq. (learnable): ONE gate (or pair of learnable scalars) for the whole
# encoder and F the whole layer, where g -> 1 is a residual step and g -> 0 is y + F1 + F2 (the `_codeF` rows have one
# gate per block). The scope is a global field, but the study's decoder is Euler (constant coefficients, nothing to
# share), and the DLCL connections (the authors' too) are the study's, so only the encoder's coefficients change.
AUTHORS_GATE: Flags = {"ode_coefficient_scope": "stack", **CODE_F}
MULTI30K_GATE_VARIANTS: dict[str, Variant] = {
    "rk2_gated_authors": Variant(
        "RK2-block (learnable gamma), authors' code: one gate, code F",
        _encoder_block("rk2", "gated", **AUTHORS_GATE),
    ),
    "rk2_learnable_authors": Variant(
        "RK2-block (learnable scalars), authors' code: one pair, code F",
        _encoder_block("rk2", "learnable", **AUTHORS_GATE),
    ),
    # Beyond the paper, a remedy for the gate's collapse: `rk2_gated` whose gate reads LN(F1), LN(F2).
    "rk2_gated_norm": Variant(
        "RK2-block (learnable gamma), gate reads LN(F_i)",
        _encoder_block("rk2", "gated", ode_gate_inputs="layer_norm"),
    ),
}
# The cpu-size seq2seq model of every translation-like study (multi30k, ablations, gec, cnndm).
SMALL_SEQ2SEQ: Flags = {
    "d_model": 256,
    "encoder_ffn_dim": 1024,
    "decoder_ffn_dim": 1024,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
}
MULTI30K_SIZES: dict[str, Flags] = {
    # A good small baseline for 29k pairs: d 256, 4 heads, dropout 0.1 (0.3 over-regularises at this
    # budget), label smoothing 0.1, 2K-token batches (updates are what a CPU budget buys), averaging.
    "cpu": {
        **SMALL_SEQ2SEQ,
        "max_tokens": 2048,
        "max_steps": 1500,
        "save_steps": 100,
        "learning_rate": 2e-3,
        "warmup_steps": 300,
        "use_cpu": True,
        "bf16": True,
    },
    "paper": {
        "max_tokens": 4096,
        "max_steps": 20000,
        "save_steps": 1000,
        "learning_rate": 2e-3,
        "warmup_steps": 4000,
        "dropout": 0.3,
        "bf16": True,
    },
}

# The paper's BLEU gains over its residual base model (6-6, WMT'14 En-De, Table "main-results": 27.89 -> RK2 28.67,
# RK2-gated 28.89, RK4 29.03): the gaps a Multi30k study must be able to detect to test the paper's claim.
WMT14_BASE_GAPS = {"rk2": 0.78, "rk2_gated": 1.00, "rk4": 1.14}

MULTI30K = Study(
    name="multi30k",
    description="Multi30k En-De (29k pairs), test2016: sacreBLEU and chrF, beam 4, length penalty 0.6, "
    "average of the last 5 checkpoints; RK blocks in the encoder, Euler decoder.",
    common=MULTI30K_COMMON,
    sizes=MULTI30K_SIZES,
    variants={**_both_readings(MULTI30K_BLOCKS), **MULTI30K_GATE_VARIANTS},
    depth_flags=("encoder_layers", "decoder_layers"),
    depths=(3,),
    metrics=(Metric("BLEU"), Metric("chrF")),
    paper_gap=WMT14_BASE_GAPS,
    pairwise=(("rk4", "rk2_gated"), ("pc_rk4", "pc_rk2")),
)

# --------------------------------------------------------------------------------------------
# multi30k_paired: the headline rows again, as one batch at one commit, each seed's variants back to back
# on one machine and in the precision that machine computes natively (--precision auto), so that the report can
# pair every run with the residual run of the same seed, commit, device and precision. Residual, RK2 and RK4 get
# seeds 0-4, the other rows 0-2 (experiments.queue). The equal-compute baselines are residual encoders with the
# encoder FLOPs of the 3-layer RK2 (6 layers) and RK4 (12 layers) encoders.

MULTI30K_PAIRED = Study(
    name="multi30k_paired",
    description="Multi30k En-De as MULTI30K (test2016, beam 4, last 5 checkpoints averaged), one batch at one "
    "commit, runs paired by seed, commit, device and precision; RK blocks in a 3-layer encoder, Euler decoder.",
    common={**MULTI30K_COMMON, "encoder_layers": 3},
    # cpu only: at the paper's size `multi30k` is the study (this batch exists to pair CPU runs)
    sizes={"cpu": {**{k: v for k, v in MULTI30K_SIZES["cpu"].items() if k != "bf16"}, "precision": "auto"}},
    variants={
        "residual": Variant("Residual", _encoder_block("euler")),
        "rk2": Variant("RK2-block", _encoder_block("rk2")),
        "rk4": Variant("RK4-block", _encoder_block("rk4")),
        # the block every recipe builds by default (`encoder_ode_method: rk2`, the config's gate), on trial
        "rk2_gated": Variant(
            "RK2-block (learnable gamma), the recipes' default", _encoder_block("rk2", "gated")
        ),
        "rk2_gated_authors": MULTI30K_GATE_VARIANTS["rk2_gated_authors"],
        # a remedy for the gate's saturation: the paper's gate, started at g = 1/2 (W = 0)
        "rk2_gated_tableau": Variant(
            "RK2-block (learnable gamma), gate starts as RK2 (W = 0, g = 1/2)",
            _encoder_block("rk2", "gated", ode_gate_init="tableau"),
        ),
        "residual_x2": Variant(
            "Residual, 6 encoder layers (RK2's encoder FLOPs)",
            {**_encoder_block("euler"), "encoder_layers": 6},
        ),
        "residual_x4": Variant(
            "Residual, 12 encoder layers (RK4's encoder FLOPs)",
            {**_encoder_block("euler"), "encoder_layers": 12},
        ),
    },
    depth_flags=("decoder_layers",),
    depths=(3,),
    metrics=(Metric("BLEU"), Metric("chrF")),
    seeds=(0, 1, 2, 3, 4),
    paper_gap={**WMT14_BASE_GAPS, "rk2_gated_authors": WMT14_BASE_GAPS["rk2_gated"]},
)

# --------------------------------------------------------------------------------------------
# tatoeba_depth: does an RK block buy the gains of a deeper encoder? That can only show where a deeper
# residual encoder is better (on Multi30k the 12-layer one is behind the 3-layer one), so a test bed with more data:
# Tatoeba En-De (../shared/data/tatoeba_de_en: real pairs of short everyday sentences, several times Multi30k's
# tokens), multi30k_paired's recipe, the data and the budget aside (3,000 updates of 2,048-token batches, twice
# Multi30k's 1,500: fewer epochs of this larger corpus). The probe (experiments.depth_gate) runs in three stages, each
# row's runs on seeds no other stage uses:
#   1. schedules: every row (residual encoders of 3, 6 and 12 layers; RK2 and RK4 blocks in the 3-layer encoder)
#      trains once per schedule of TATOEBA_SCHEDULES on TATOEBA_TUNING_SEED; a row's schedule is the one with the
#      lowest validation loss at its last update (the same effort, three runs, for every row);
#   2. the gate: residual encoders of 3, 6 and 12 layers on TATOEBA_GATE_SEEDS; depth helps where a deeper row is
#      ahead of the 3-layer one beyond noise (paired t-test, Holm over the two deeper rows);
#   3. the comparison, on fresh seeds (TATOEBA_FRESH_SEEDS), never the gate's: RK2 and RK4 against residual at 3
#      layers, always; and where the gate passed, RK at 3 layers against residual at 6 and 12 layers as a
#      non-inferiority test with margin TATOEBA_MARGIN BLEU.
# A GPU study: on the 2-core CPU one run would take hours.

TATOEBA_STEPS = 3000
TATOEBA_ROWS = {
    "residual": MULTI30K_PAIRED.variants["residual"],
    "rk2": MULTI30K_PAIRED.variants["rk2"],
    "rk4": MULTI30K_PAIRED.variants["rk4"],
    "residual_x2": Variant("Residual, 6 encoder layers", {**_encoder_block("euler"), "encoder_layers": 6}),
    "residual_x4": Variant("Residual, 12 encoder layers", {**_encoder_block("euler"), "encoder_layers": 12}),
}
TATOEBA_DEPTH_ROWS = ("residual", "residual_x2", "residual_x4")  # the gate's rows, the 3-layer one first
TATOEBA_RK_ROWS = ("rk2", "rk4")
# The recipe's schedule, then half the rate with twice the warm-up, twice over: deeper encoders may need gentler ones.
TATOEBA_SCHEDULES: dict[str, Flags] = {
    "s1": {"learning_rate": 2e-3, "warmup_steps": 300},
    "s2": {"learning_rate": 1e-3, "warmup_steps": 600},
    "s3": {"learning_rate": 5e-4, "warmup_steps": 1200},
}
TATOEBA_TUNING_SEED = 1000
# Sized by the power table (results/verdict.md, from the spread of multi30k_paired's H200 pairs, gives the power each
# count has): the gate for a depth gain of one BLEU (half of that would take several times the seeds), the fresh
# seeds for the smaller RK gaps of the paper.
TATOEBA_GATE_SEEDS = tuple(range(10))
TATOEBA_FRESH_SEEDS = tuple(range(100, 110))
TATOEBA_MARGIN = 0.5  # BLEU: RK at 3 layers "keeps a deeper encoder's gain" if it is no more than this behind


def tatoeba_variant(row: str, schedule: str) -> str:
    """The variant of a row trained with a schedule: ``residual_x4_s2``."""
    return f"{row}_{schedule}"


TATOEBA_DEPTH = Study(
    name="tatoeba_depth",
    description="Tatoeba En-De (162,896 short sentence pairs), its test split (3,408 pairs): sacreBLEU and chrF, "
    "beam 4, last 5 checkpoints averaged; multi30k_paired's recipe for 3,000 updates, one batch at one commit, runs "
    "paired by seed, commit, device and precision; residual encoders of 3, 6 and 12 layers, RK2 / RK4 blocks in the "
    "3-layer encoder, Euler decoder (3 layers), each row under three schedules (learning rate, warm-up).",
    # validation once, at the last update: the loss that picks a row's schedule
    common={
        **MULTI30K_PAIRED.common,
        "dataset": "tatoeba_de_en",
        "eval_strategy": "steps",
        "eval_steps": TATOEBA_STEPS,
    },
    sizes={"cpu": {**MULTI30K_PAIRED.sizes["cpu"], "max_steps": TATOEBA_STEPS}},
    variants={
        tatoeba_variant(row, schedule): Variant(
            f"{variant.label}, schedule {schedule}", {**variant.flags, **flags}
        )
        for schedule, flags in TATOEBA_SCHEDULES.items()
        for row, variant in TATOEBA_ROWS.items()
    },
    depth_flags=MULTI30K_PAIRED.depth_flags,
    depths=MULTI30K_PAIRED.depths,
    metrics=MULTI30K_PAIRED.metrics,
    seeds=TATOEBA_GATE_SEEDS,
    baseline=tatoeba_variant("residual", "s1"),
    paper_gap={tatoeba_variant(row, "s1"): WMT14_BASE_GAPS[row] for row in TATOEBA_RK_ROWS},
)
# --------------------------------------------------------------------------------------------
# multi30k_upcycle (beyond the paper): the trained residual models of `multi30k_paired` (3-layer encoder,
# seeds 0-2), converted to RK2 and RK4 encoder blocks that start as the residual blocks (learnable coefficients at
# (1, 0, ...): the same function, exactly), fine-tuned for the same updates as the residual model itself. Each run
# starts from its seed's residual model, so every variant pairs with `residual_ft` by seed; the from-scratch rows
# (residual, rk2, rk4 of `multi30k_paired`, 1,500 updates) are the reference for what the extra updates buy.
# The fine-tuning schedule is fresh (Adam's state is not in the saved model): a constant learning rate after a short
# warm-up, about the source schedule's last rate (2e-3 * sqrt(300 / 1500) = 8.9e-4) halved.

UPCYCLE_FINETUNE: Flags = {
    "upcycle": True,
    "encoder_ode_coefficients": "learnable",
    "ode_coefficients_init": "euler",
}
MULTI30K_UPCYCLE = Study(
    name="multi30k_upcycle",
    description="Multi30k En-De: each seed's trained residual model of multi30k_paired (3-layer encoder) fine-tuned "
    "N more updates as it is, or converted to RK2 / RK4 encoder blocks that start as its residual blocks "
    "(learnable gamma from (1, 0, ...)) and fine-tuned as long; test2016, beam 4, last 5 checkpoints averaged. "
    "Reference: the from-scratch rows of multi30k_paired.",
    common={
        **{k: v for k, v in MULTI30K_COMMON.items() if k not in ("preset", "vocab_size")},
        "max_tokens": 2048,
        "save_steps": 100,
        "learning_rate": 4e-4,
        "lr_scheduler_type": "constant_with_warmup",
        "warmup_steps": 50,
    },
    sizes={"cpu": {"max_steps": 500, "use_cpu": True, "precision": "auto"}},
    variants={
        "residual_ft": Variant("Residual, fine-tuned N updates", {}),
        "rk2_up": Variant(
            "RK2-block upcycled from residual (learnable gamma from (1, 0))",
            {**UPCYCLE_FINETUNE, "encoder_ode_method": "rk2"},
        ),
        "rk4_up": Variant(
            "RK4-block upcycled from residual (learnable gamma from (1, 0, 0, 0))",
            {**UPCYCLE_FINETUNE, "encoder_ode_method": "rk4"},
        ),
    },
    depth_flags=(),  # the depth is the source's (3-layer encoder and decoder); a label here
    depths=(3,),
    metrics=(Metric("BLEU"), Metric("chrF")),
    baseline="residual_ft",
    source="runs/experiments/multi30k_paired/cpu/residual-3-seed{seed}",
    reference=("multi30k_paired", {"residual_ft": "residual", "rk2_up": "rk2", "rk4_up": "rk4"}),
)

# --------------------------------------------------------------------------------------------
# ablations on the Multi30k setting: Table "scale_function", Figure "components", Table "comparison"

ABLATION_VARIANTS: dict[str, Variant] = {
    "residual": Variant("Residual", _encoder_block("euler")),
    # Table "scale_function"
    # With F the whole layer (SAN+FFN), the layer applied twice is y + F1 + F(y + F1): RK2 gamma = 1's own
    # equation (row `rk2_ones`), yet the paper's rows differ (28.51 vs 28.77). The authors' code's only
    # weight-sharing schema repeats each sublayer: SAN twice, then FFN twice, each with its residual.
    "weight_sharing": Variant(
        "Weight sharing (SAN twice, then FFN twice; no RK)",
        _encoder_block("weight_sharing", encoder_ode_function="sublayers"),
    ),
    "rk2": Variant("RK2 (gamma = 1/2)", _encoder_block("rk2")),
    "rk2_ones": Variant("RK2 gamma = 1", _encoder_block("rk2", "ones")),
    "rk2_learnable": Variant("RK2 learnable scalars", _encoder_block("rk2", "learnable")),
    "rk2_sigmoid_sigmoid": Variant("RK2 sigmoid-sigmoid", _encoder_block("rk2", "gated_independent")),
    "rk2_gated": Variant("RK2 gated (paper)", _encoder_block("rk2", "gated")),
    "rk2_tanh_tanh": Variant("RK2 tanh-tanh", _encoder_block("rk2", "gated_tanh")),
    # Figure "components": what F is, RK2-gated
    "f_san": Variant("F = SAN", _encoder_block("rk2", "gated", encoder_ode_function="attention")),
    "f_ffn": Variant("F = FFN", _encoder_block("rk2", "gated", encoder_ode_function="ffn")),
    "f_san_and_ffn": Variant(
        "F = SAN and FFN separately", _encoder_block("rk2", "gated", encoder_ode_function="sublayers")
    ),
    # Table "comparison": other ODE designs
    "leapfrog": Variant("Leapfrog", {**_encoder_block("euler"), "encoder_layer_connections": "leapfrog"}),
    "multistep": Variant("Multistep", {**_encoder_block("euler"), "encoder_layer_connections": "multistep"}),
    "dlcl": Variant(
        "DLCL (residual blocks)", {**_encoder_block("euler"), "encoder_layer_connections": "learnable_dense"}
    ),
    "polynet": Variant("PolyNet", _encoder_block("polynet")),
    "rk4": Variant("RK4", _encoder_block("rk4")),
}

ABLATIONS = Study(
    name="ablations",
    description="Ablations on the Multi30k setting (cpu size), plain stacking unless the row says otherwise.",
    common={**MULTI30K_COMMON, "encoder_layer_connections": "residual"},
    sizes=MULTI30K_SIZES,
    variants=ABLATION_VARIANTS,
    depth_flags=("encoder_layers", "decoder_layers"),
    depths=(3,),
    metrics=(Metric("BLEU"), Metric("chrF")),
    seeds=(0,),
)

# --------------------------------------------------------------------------------------------
# gec and cnndm: residual vs RK4 at a small scale

GEC = Study(
    name="gec",
    description="Grammatical error correction: W&I+FCE train, M2 F0.5 on CoNLL-2013 (its first 500 sentences "
    "at cpu size) and GLEU on JFLEG dev (all 754, 4 references) (small scale).",
    common={
        "task": "gec",
        "dataset": "wi_locness+fce",
        "preset": "base",
        "vocab_size": 8000,
        "max_source_length": 96,
        "max_target_length": 96,
        "word_dropout": 0.1,
        "adam_beta2": 0.997,
        "lr_scheduler_type": "inverse_sqrt",
        "eval_strategy": "no",
        "save_strategy": "steps",
        "save_total_limit": 1,  # a checkpoint to resume from
        "predict_with_generate": True,
        "num_beams": 4,
        "logging_steps": 50,
        "per_device_eval_batch_size": 32,
    },
    sizes={
        "cpu": {
            **SMALL_SEQ2SEQ,
            "max_tokens": 2048,
            "max_steps": 1500,
            "save_steps": 250,
            "learning_rate": 2e-3,
            "warmup_steps": 300,
            "use_cpu": True,
            "bf16": True,
            "max_test_samples": 500,
        },
        "paper": {
            "max_tokens": 4096,
            "max_steps": 20000,
            "save_steps": 2000,
            "learning_rate": 2e-3,
            "warmup_steps": 4000,
            "bf16": True,
        },
    },
    variants={"residual": MULTI30K.variants["residual"], "rk4": MULTI30K.variants["rk4"]},
    depth_flags=("encoder_layers", "decoder_layers"),
    depths=(3,),
    metrics=(
        Metric("M2 F0.5", digits=4),
        Metric("M2 precision", digits=4),
        Metric("M2 recall", digits=4),
        Metric("JFLEG GLEU"),
    ),
    seeds=(0,),
    test_corpora=("conll2013",),
    extra_tests=(
        ExtraTest(
            "jfleg",
            "gleu",
            "gec/jfleg/dev.src.gz",
            tuple(f"gec/jfleg/dev.ref{i}.gz" for i in range(4)),
            metrics={"gleu": "JFLEG GLEU"},
        ),
    ),
)

CNNDM = Study(
    name="cnndm",
    description="Summarization on the shared CNN/DailyMail subset: ROUGE-1/2/L (small scale).",
    common={
        "task": "summarization",
        "dataset": "cnndm",
        "preset": "base",
        "vocab_size": 8000,
        "max_source_length": 400,
        "max_target_length": 100,
        "adam_beta2": 0.997,
        "lr_scheduler_type": "inverse_sqrt",
        "eval_strategy": "no",
        "save_strategy": "steps",
        "save_total_limit": 1,  # a checkpoint to resume from
        "predict_with_generate": True,
        "num_beams": 4,
        "length_penalty": 2.0,
        "logging_steps": 50,
        "per_device_eval_batch_size": 16,
    },
    sizes={
        # Reading the first 400 tokens, the cpu-size model wrote no summary at all (commit 6ba22aa); the lead
        # of an article holds most of its summary, so the cpu size reads 200 tokens
        # (twice the articles per 4K-token batch) for twice the updates.
        "cpu": {
            **SMALL_SEQ2SEQ,
            "max_source_length": 200,
            "max_tokens": 4096,
            "max_steps": 2000,
            "save_steps": 250,
            "learning_rate": 2e-3,
            "warmup_steps": 300,
            "use_cpu": True,
            "bf16": True,
            "max_test_samples": 300,
        },
        "paper": {
            "max_tokens": 4096,
            "max_steps": 30000,
            "save_steps": 2000,
            "learning_rate": 2e-3,
            "warmup_steps": 4000,
            "bf16": True,
        },
    },
    variants={"residual": MULTI30K.variants["residual"], "rk4": MULTI30K.variants["rk4"]},
    depth_flags=("encoder_layers", "decoder_layers"),
    depths=(3,),
    # ROUGE-Lsum (summary-level LCS over sentences) is what the official ROUGE-1.5.5 scripts, and so the paper's
    # RG-L, report for CNN/DM; ROUGE-L here is rouge_score's LCS over the whole text.
    metrics=(Metric("ROUGE1"), Metric("ROUGE2"), Metric("ROUGEL"), Metric("ROUGELSUM")),
    seeds=(0,),
)

STUDIES: dict[str, Study] = {
    study.name: study
    for study in (PTB, PTB_PILOT, PTB_LONG, PTB_PAPER, MULTI30K, MULTI30K_PAIRED, MULTI30K_UPCYCLE)
    + (TATOEBA_DEPTH, ABLATIONS, GEC, CNNDM)
}
