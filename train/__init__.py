"""Training utilities for the ODE Transformer (data, tokenizer, batching, ...)."""

if __name__ != "ode_transformer.train":  # one name per module: never loaded a second time as `train`
    raise ImportError(
        f"import ode_transformer.train (python -m ode_transformer.train.MODULE), not {__name__}: the package maps "
        "this folder to that name; in a clone, `make setup` (pip install -e .) installs it"
    )
