"""The ODE Transformer's one import name for its tools: ``ode_transformer.train`` (training, translating,
scoring) and ``ode_transformer.hub`` (model cards, export, upload). The model itself is ``modeling_ode``.

The repository keeps ``train/`` and ``hub/`` as top-level folders; the package maps them to
``ode_transformer.train`` and ``ode_transformer.hub`` (pyproject's ``package-dir``), in an install and in a clone's
editable install (``make setup``) alike, so each module has one name and no generic top-level ``train`` or ``hub``
lands in site-packages. A clone runs ``python -m ode_transformer.train.run`` or the console commands.

The helpers most users want are importable from here: :func:`load_for_generation` and :func:`generate_texts`
(translate, summarise or correct a list of texts; transformers 5 has no seq2seq pipelines).
"""

from __future__ import annotations

__all__ = ["generate_texts", "load_for_generation"]


def __getattr__(name: str):
    # Lazy: importing ode_transformer.train.data need not import torch and the model.
    if name in __all__:
        from . import translate

        return getattr(translate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
