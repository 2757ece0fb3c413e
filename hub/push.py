"""Upload an exported folder to the Hugging Face Hub.

    python -m ode_transformer.hub.push FOLDER --repo-id USER/NAME [--private] [--dry-run] [--commit-message MSG]

Online: `HfApi().create_repo(exist_ok=True)` then `HfApi().upload_folder` (token from `hf auth login` or
HF_TOKEN). `--dry-run` lists exactly the files (and sizes) that would be uploaded and touches no network.

Only an exported folder is pushed: a training folder (checkpoints, optimizer states, trainer state, the pickled
training arguments) is refused, naming what would have left the machine. No network is one line, exit code 2.
"""

from __future__ import annotations

import argparse
import fnmatch
import socket
from pathlib import Path

from ode_transformer.cli import program_name, report_user_error

__all__ = ["IGNORE_PATTERNS", "TRAINING_PATTERNS", "HubUnreachable", "files_to_upload", "push_folder"]

# Never uploaded: VCS and cache folders, Python bytecode (upload_folder also skips .git/ and .cache/huggingface/).
IGNORE_PATTERNS = [
    ".git/*",
    "*/.git/*",
    ".cache/*",
    "*/.cache/*",
    "__pycache__/*",
    "*/__pycache__/*",
    "*.pyc",
    ".run.lock",  # a training run's lock files (ode_transformer.checkpoints.LOCK_FILES)
    ".run.pid",
]


# What only a training folder holds (ode-train's OUTPUT_DIR, transformers' Trainer output): never part of an
# export, and some of it (training_args.bin, the optimizer's and rng states) is pickled state, not a model.
TRAINING_PATTERNS = [
    "checkpoint-*/*",
    ".staging/*",
    "runs/*",
    "trainer_state.json",
    "training_args.bin",
    "optimizer.pt",
    "scheduler.pt",
    "scaler.pt",
    "rng_state*.pth",
    "*_results.json",
    "test_hypotheses.txt",
    "tokenizer/*",
]


class HubUnreachable(ConnectionError):
    """The Hub could not be reached (no network, a proxy, a DNS failure): one line, not the HTTP client's trace."""


def _network_error(error: BaseException) -> BaseException | None:
    """The connection failure behind ``error`` (its causes followed), whatever HTTP client raised it."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        names = {kind.__name__ for kind in type(error).__mro__}
        if isinstance(error, (ConnectionError, socket.gaierror, TimeoutError)) or names & {
            "ConnectError",
            "ConnectTimeout",
            "ConnectionError",
            "NetworkError",
            "TimeoutException",
            "OfflineModeIsEnabled",
            "NewConnectionError",
            "MaxRetryError",
            "ProxyError",
        }:
            return error
        error = error.__cause__ or error.__context__
    return None


def training_files(folder: str | Path) -> list[str]:
    """The files of ``folder`` that only a training run writes (:data:`TRAINING_PATTERNS`), sorted."""
    folder = Path(folder)
    return sorted(
        relative
        for path in folder.rglob("*")
        if path.is_file()
        and any(
            fnmatch.fnmatch(relative := path.relative_to(folder).as_posix(), p) for p in TRAINING_PATTERNS
        )
    )


def files_to_upload(folder: str | Path) -> list[tuple[str, int]]:
    """(path relative to the folder, size in bytes) of every file `push_folder` would upload, sorted."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} is not a folder.")
    out = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder).as_posix()
        if any(fnmatch.fnmatch(relative, pattern) for pattern in IGNORE_PATTERNS):
            continue
        out.append((relative, path.stat().st_size))
    return out


def push_folder(
    folder: str | Path,
    repo_id: str,
    private: bool = False,
    dry_run: bool = False,
    commit_message: str = "Upload ODE Transformer",
) -> list[tuple[str, int]] | str:
    """Upload `folder` to the model repo `repo_id` (created if needed). With `dry_run`, return the file list
    without importing the Hub client's network code paths or contacting the Hub.

    Raises:
        ValueError: ``folder`` is a training folder (its training files named), empty, or has no config.json.
        HubUnreachable: the Hub could not be reached.
    """
    training = training_files(folder) if Path(folder).is_dir() else []
    if training:
        tops = sorted({name.split("/")[0] + ("/" if "/" in name else "") for name in training})
        shown = ", ".join(tops[:6]) + (", ..." if len(tops) > 6 else "")
        raise ValueError(
            f"{folder} is a training folder: {len(training)} of its files are training state, not the model "
            f"({shown}), and would leave the machine; export it first (ode-export {folder} OUT_DIR) and push "
            "OUT_DIR"
        )
    files = files_to_upload(folder)
    if not files:
        raise ValueError(f"{folder} holds no files to upload.")
    if "config.json" not in {name for name, _ in files}:
        raise ValueError(
            f"{folder} has no config.json; export it first with `python -m ode_transformer.hub.export`."
        )
    if dry_run:
        return files
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        info = api.upload_folder(
            folder_path=str(folder),
            repo_id=repo_id,
            repo_type="model",
            commit_message=commit_message,
            ignore_patterns=IGNORE_PATTERNS,
        )
    except Exception as error:
        cause = _network_error(error)
        if cause is None:
            raise
        reason = (str(cause).splitlines() or [""])[0][:200]
        raise HubUnreachable(
            f"could not reach the Hugging Face Hub to push {repo_id} ({type(cause).__name__}: {reason}); check the "
            "network (or HF_ENDPOINT, a proxy) and run the command again; --dry-run lists the files without it"
        ) from None
    return str(info)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=program_name(__spec__.name), description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="folder written by `python -m ode_transformer.hub.export`")
    parser.add_argument("--repo-id", required=True, help="USER/NAME (or ORG/NAME) of the model repo")
    parser.add_argument("--private", action="store_true", help="create the repo as private")
    parser.add_argument(
        "--dry-run", action="store_true", help="list the files that would be uploaded; no network"
    )
    parser.add_argument("--commit-message", default="Upload ODE Transformer")
    args = parser.parse_args(argv)
    try:
        result = push_folder(args.folder, args.repo_id, args.private, args.dry_run, args.commit_message)
    except HubUnreachable as error:
        raise SystemExit(report_user_error(__spec__.name, error)) from None
    if args.dry_run:
        total = sum(size for _, size in result)
        print(
            f"dry run: would upload {len(result)} files ({_size(total)}) to {args.repo_id}"
            f"{' (private)' if args.private else ''}:"
        )
        for name, size in result:
            print(f"{size:>12d}  {name}")
    else:
        print(result)


if __name__ == "__main__":
    main()
