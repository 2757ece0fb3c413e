"""Sharing ODE Transformer models: model cards, Hub-ready export with remote code, upload, and conversion of
the authors' fairseq checkpoints. See `hub/README.md`."""

if __name__ != "ode_transformer.hub":  # one name per module: never loaded a second time as `hub`
    raise ImportError(
        f"import ode_transformer.hub (python -m ode_transformer.hub.MODULE), not {__name__}: the package maps "
        "this folder to that name; in a clone, `make setup` (pip install -e .) installs it"
    )
