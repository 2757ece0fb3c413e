"""The integrity of a model's weights file, and the guards `save_pretrained` and `from_pretrained` keep around it.

- A truncated or empty `model.safetensors` is refused by name (`check_safetensors_file`) before transformers'
  loader fails inside its deserializer.
- `ode-export` records a digest of the weights (`record_weights_digest`) in the file's metadata and in the folder's
  JSON files; `from_pretrained` checks that they agree, holding the weights file open across the load, so that a
  reader that loads while an export replaces the folder does not take one export's config with another's weights.
- Weights holding NaN or infinity (a diverged run) are named (`non_finite_tensors`, `non_finite_message`).

`WeightsFileGuards` is the model classes' base before `PreTrainedModel` that adds these checks to loading and
saving. The modeling file imports this module, so an exported folder ships it beside the model as remote code: it
imports torch and transformers only.
"""

import hashlib
import json
import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import logging

__all__ = [
    "WEIGHTS_DIGEST",
    "WeightsFileGuards",
    "check_safetensors_file",
    "non_finite_message",
    "non_finite_tensors",
    "record_weights_digest",
    "weights_digest",
]

logger = logging.get_logger(__name__)


def check_safetensors_file(path: Path) -> dict:
    """The JSON header of a safetensors file, which must hold its 8-byte header size, the header and every tensor's
    bytes; a truncated or empty file is refused by name before the loader fails inside its deserializer."""
    size = path.stat().st_size
    problem, header = None, None
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            problem = f"it holds {size} bytes"
        else:
            (header_size,) = struct.unpack("<Q", head)
            try:
                header = json.loads(f.read(header_size)) if 8 + header_size <= size else None
            except ValueError:
                header = None
            if header is None:
                problem = "its header is cut off or not JSON"
            else:
                end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
                if 8 + header_size + end > size:
                    problem = f"it holds {size} bytes, its header announces {8 + header_size + end}"
    if problem:
        raise OSError(
            f"{path} is truncated or not a safetensors file ({problem}); copy or save the model again "
            "(a checkpoint folder can be replaced by an earlier complete one)."
        )
    return header


WEIGHTS_DIGEST = "weights_digest"
"""The key of the digest of an exported folder's weights (`ode-export`), in its `model.safetensors`' metadata and in
its `config.json`, `generation_config.json` and `tokenizer_config.json`: `from_pretrained` checks that they agree."""
_CHUNK = 1 << 24  # bytes of tensor data hashed or copied at a time


def _safetensors_header(path: Path) -> tuple[int, dict]:
    """The header size and header of the safetensors file `path` (checked whole first)."""
    check_safetensors_file(path)
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return size, json.loads(f.read(size))


def weights_digest(path: str | os.PathLike) -> str | None:
    """The weights digest the safetensors file `path` records in its metadata (from its header alone), or None."""
    _, header = _safetensors_header(Path(path))
    return (header.get("__metadata__") or {}).get(WEIGHTS_DIGEST)


def record_weights_digest(path: str | os.PathLike) -> str:
    """Compute the digest of the weights in the safetensors file `path` (sha256 of its tensors' names, dtypes,
    shapes and bytes) and record it in the file's metadata; the digest. The header is written anew, the tensor
    bytes are copied as they are, and the new file replaces the old one in one rename."""
    path = Path(path)
    size, header = _safetensors_header(path)
    metadata = header.pop("__metadata__", None) or {}
    digest = hashlib.sha256(json.dumps(header, sort_keys=True).encode("utf-8"))
    with open(path, "rb") as f:
        f.seek(8 + size)
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    header["__metadata__"] = {**metadata, WEIGHTS_DIGEST: digest.hexdigest()}
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # the tensor data stays aligned to 8 bytes
    temporary = path.with_name(f".{path.name}.digest")
    try:
        with open(path, "rb") as source, open(temporary, "wb") as target:
            target.write(struct.pack("<Q", len(encoded)) + encoded)
            source.seek(8 + size)
            while chunk := source.read(_CHUNK):
                target.write(chunk)
        os.chmod(temporary, path.stat().st_mode & 0o777)
        os.replace(temporary, path)
    finally:
        Path(temporary).unlink(missing_ok=True)
    return digest.hexdigest()


def _weights_version(path: Path) -> tuple | None:
    """Which file `path` is (device, inode, size, modification time) and the weights digest its header records,
    both read through one open file, so that a rename between two reads by name cannot pair one file's identity
    with another's digest; None where there is no file."""
    with _held_weights(path) as version:
        return version


@contextmanager
def _held_weights(path: Path) -> Iterator[tuple | None]:
    """:func:`_weights_version` of `path`, the file held open until the block ends: while it is, no file that
    replaces it can get its inode number (file systems give a deleted file's number to the next new one), so a
    version read in the block equals this one only for the same, unchanged file."""
    try:
        f = open(path, "rb")  # noqa: SIM115 (held open for the caller's block)
    except FileNotFoundError:
        yield None
        return
    with f:
        stat = os.fstat(f.fileno())
        try:
            (size,) = struct.unpack("<Q", f.read(8))
            metadata = json.loads(f.read(size)).get("__metadata__") or {}
        except (struct.error, ValueError, AttributeError):  # not a safetensors header: no digest recorded
            metadata = {}
        yield (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns), metadata.get(WEIGHTS_DIGEST)


def _digest_problem(folder: str | os.PathLike, model: PreTrainedModel, before: tuple | None) -> str | None:
    """Why `model`, just loaded from the local `folder`, may hold one export's config and another's weights;
    None where its config (and generation config) record no weights digest, or where they agree with the
    folder's `model.safetensors`, which was one unchanged file from `before` (:func:`_weights_version`, read
    before the load) to now. Comparing with the file after the load alone would miss weights read from a file
    that another export replaced with a copy of the first one's before the check."""
    recorded = {
        "config.json": getattr(model.config, WEIGHTS_DIGEST, None),
        "generation_config.json": getattr(getattr(model, "generation_config", None), WEIGHTS_DIGEST, None),
    }
    recorded = {name: digest for name, digest in recorded.items() if digest}
    after = _weights_version(Path(folder) / "model.safetensors")
    if not recorded or before is after is None:
        return None
    if before != after:
        digests = [(version[1] or "none")[:12] if version else "no file" for version in (before, after)]
        return (
            f"{folder}: its model.safetensors is another file after the load than before it (weights digest "
            f"{digests[0]} before, {digests[1]} after)"
        )
    held = after[1]
    wrong = [name for name, digest in recorded.items() if digest != held]
    if not wrong:
        return None
    return (
        f"{folder}: {' and '.join(wrong)} record the weights digest {recorded[wrong[0]][:12]}, but its "
        f"model.safetensors holds {held[:12] if held else 'none'}"
    )


def non_finite_tensors(weights: nn.Module | Mapping[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors (a model's parameters and buffers, or a state dict) that hold NaN or
    infinity: the one check of diverged weights, for the trainer's final save and for loading."""
    if isinstance(weights, nn.Module):  # tied weights once
        tensors = dict(weights.named_parameters())
        tensors.update(weights.named_buffers())
    else:
        tensors = weights
    return [
        name
        for name, tensor in tensors.items()
        # meta tensors (weights offloaded by a `device_map`) hold no values to check
        if tensor.is_floating_point()
        and tensor.device.type != "meta"
        and not bool(torch.isfinite(tensor).all())
    ]


def non_finite_message(subject: str | Path, names: Sequence[str]) -> str:
    """What every refusal or warning of diverged weights opens with: which weights, by name; the caller adds what
    follows and the fix."""
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f"{subject} holds non-finite weights (NaN or infinity) in {len(names)} tensors ({shown})"


class WeightsFileGuards:
    """The checks of a model's weights file around `PreTrainedModel`'s loading and saving: a base of the model
    classes placed before `PreTrainedModel`."""

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs) -> None:
        """`PreTrainedModel.save_pretrained`, without the weights digest: an exported folder's digest describes its
        weights file, not one saved anew (a field of the config, left at its default; an attribute of the
        generation config's own, removed), and is restored on the model after the save."""
        config_digest = self.config.weights_digest
        generation = getattr(self, "generation_config", None)  # the bare encoder-decoder has none
        generation_digest = getattr(generation, WEIGHTS_DIGEST, None)
        self.config.weights_digest = None
        if generation_digest is not None:
            delattr(generation, WEIGHTS_DIGEST)
        try:
            super().save_pretrained(save_directory, *args, **kwargs)
        finally:
            self.config.weights_digest = config_digest
            if generation_digest is not None:
                setattr(generation, WEIGHTS_DIGEST, generation_digest)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike | None, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`, refusing a truncated or empty local `model.safetensors` by name, and
        a local folder whose config and weights come from two exports (`ode-export` records a digest of the weights
        in both): a reader that loads while an export replaces the folder can take its files one from each. The
        weights file is read before the load and after it: it must be one unchanged file whose digest is the
        config's. Loaded again once; then refused in one line. Weights holding NaN or infinity are warned of."""
        folder = None
        if pretrained_model_name_or_path is not None:
            folder = Path(pretrained_model_name_or_path) / (kwargs.get("subfolder") or "")
            if (folder / "model.safetensors").is_file():
                check_safetensors_file(folder / "model.safetensors")

        def load():  # the model, and whether its files may come from two exports
            if folder is None:
                model = super(WeightsFileGuards, cls).from_pretrained(None, *args, **kwargs)
                return model, model[0] if isinstance(model, tuple) else model, None
            with _held_weights(folder / "model.safetensors") as before:
                model = super(WeightsFileGuards, cls).from_pretrained(
                    pretrained_model_name_or_path, *args, **kwargs
                )
                loaded = model[0] if isinstance(model, tuple) else model  # output_loading_info=True: a tuple
                return model, loaded, _digest_problem(folder, loaded, before)

        model, loaded, problem = load()
        if problem:
            logger.warning(f"{problem}: it was replaced while it loaded; loading it again")
            model, loaded, problem = load()
            if problem:
                raise OSError(
                    f"{problem}, loaded twice: its files come from two exports; load it again once the export "
                    "writing it has finished, or export the model again"
                )
        bad = non_finite_tensors(loaded)
        if bad:  # a diverged training run's model decodes to empty lines without a word otherwise
            logger.warning(
                f"{non_finite_message(pretrained_model_name_or_path, bad)}: its outputs are meaningless; use a "
                "checkpoint from before training diverged, or train again with a lower learning rate."
            )
        return model
