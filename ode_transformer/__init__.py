"""The ODE Transformer's one import name for its tools: ``ode_transformer.train`` (training, translating,
scoring) and ``ode_transformer.hub`` (model cards, export, upload). The model itself is ``modeling_ode``.

The repository keeps ``train/`` and ``hub/`` as top-level folders (``python -m train.run`` works in a clone);
a ``pip install`` puts them inside this package, so no generic top-level ``train``/``hub`` lands in
site-packages. In a clone the folders sit next to this one, and the package's search path is extended to
them: ``import ode_transformer.train`` then works the same in a clone and after an install.

The helpers most users want are importable from here: :func:`load_for_generation` and :func:`generate_texts`
(translate, summarise or correct a list of texts; transformers 5 has no seq2seq pipelines).
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent
if not (_HERE / "train").is_dir():  # a clone: train/ and hub/ are siblings of this folder
    __path__.append(str(_HERE.parent))

__all__ = ["generate_texts", "load_for_generation"]


def __getattr__(name: str):
    # Lazy: importing ode_transformer.train.data need not import torch and the model.
    if name in __all__:
        from .train import translate

        return getattr(translate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
