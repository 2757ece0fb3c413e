"""Sharing ODE Transformer models: model cards, Hub-ready export with remote code, upload, and conversion of
the authors' fairseq checkpoints. See `hub/README.md`."""
