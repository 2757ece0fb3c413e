"""The paper's decoding of translation, which both tools give a model: ``--task translation`` decodes with it (its
record in ``ode_transformer.train.tasks``), and ``ode-export`` writes it as the decoding defaults of an
encoder-decoder that has none of its own (``ode_transformer.hub.export``). A module of its own, free of torch, as
the task records are read by commands that import no torch (``ode-evaluate``)."""

from __future__ import annotations

from types import MappingProxyType

PAPER_TRANSLATION_DECODING = MappingProxyType({"num_beams": 4, "length_penalty": 0.6})
"""Appendix, table "dataset": the beam size and length penalty of WMT En-De (En-Ro used beam 5, length penalty
1.3)."""
