"""Upload an exported folder to the Hugging Face Hub.

    python -m ode_transformer.hub.push FOLDER --repo-id USER/NAME [--private] [--dry-run] [--commit-message MSG]

Online: `HfApi().create_repo(exist_ok=True)` then `HfApi().upload_folder` (token from `hf auth login` or
HF_TOKEN). `--dry-run` lists exactly the files (and sizes) that would be uploaded and touches no network.
"""

from __future__ import annotations

import argparse
import fnmatch
from pathlib import Path

from ode_transformer.cli import program_name

__all__ = ["IGNORE_PATTERNS", "files_to_upload", "push_folder"]

# Never uploaded: VCS and cache folders, Python bytecode (upload_folder also skips .git/ and .cache/huggingface/).
IGNORE_PATTERNS = [
    ".git/*",
    "*/.git/*",
    ".cache/*",
    "*/.cache/*",
    "__pycache__/*",
    "*/__pycache__/*",
    "*.pyc",
    ".run.lock",  # a training run's lock files (train.checkpoints.LOCK_FILES)
    ".run.pid",
]


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
    without importing the Hub client's network code paths or contacting the Hub."""
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
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    info = api.upload_folder(
        folder_path=str(folder),
        repo_id=repo_id,
        repo_type="model",
        commit_message=commit_message,
        ignore_patterns=IGNORE_PATTERNS,
    )
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
    result = push_folder(args.folder, args.repo_id, args.private, args.dry_run, args.commit_message)
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
