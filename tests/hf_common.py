"""Transformers' own common model tests (`ModelTesterMixin`, `ConfigTester`), fetched at test time.

The tests are not part of the `transformers` wheel; they ship in its source distribution on the package
registry. :func:`import_common_tests` downloads the sdist of the *installed* transformers version with pip
(into `.cache/transformers-tests/<version>/` under the repository root, reused by later runs), extracts
only the top-level `tests/*.py` into a package `hf_transformers_tests` there (so it cannot clash with this
repository's own `tests/`), and adds three small shim modules of our own for the test modules the sdist
lacks but `test_modeling_common.py` / `test_configuration_common.py` import relatively:

- `generation/test_utils.py`: an empty `GenerationTesterMixin` (generation is covered by our own tests);
- `exporters/test_export.py`: an empty `ExportTesterMixin` (the base of `ModelTesterMixin`);
- `utils/test_configuration_utils.py`: `config_common_kwargs`, a non-default value for every common
  `PreTrainedConfig` field, which `ConfigTester.check_config_arguments_init` sets and reads back.

Nothing from the sdist is committed: `.cache/` is git-ignored. When the registry cannot be reached (or the
installed version is not published, e.g. a dev build) :class:`CommonTestsUnavailable` is raised with the
reason, and the test module fails loudly (:func:`unavailable_message` says how to provide the sources), unless
`ODE_SKIP_HF_COMMON_TESTS=1` turns that into a skip.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

import transformers
from filelock import FileLock

__all__ = [
    "SKIP_ENV",
    "CommonTestsUnavailable",
    "PACKAGE",
    "cache_dir",
    "import_common_tests",
    "unavailable_message",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "hf_transformers_tests"
SKIP_ENV = "ODE_SKIP_HF_COMMON_TESTS"
"""Set to 1 to skip (instead of fail) transformers' common tests when their sources cannot be fetched."""
_COMPLETE = ".complete"

_GENERATION_SHIM = '''"""Shim (ode-transformer): the sdist does not ship tests/generation/test_utils.py.

An empty mixin: ModelTesterMixin only checks `issubclass(..., GenerationTesterMixin)` in
`test_generation_tester_mixin_inheritance`; generation (cached vs uncached, beam search) is tested by the
project's own tests.
"""


class GenerationTesterMixin:
    pass
'''

_EXPORT_SHIM = '''"""Shim (ode-transformer): the sdist does not ship tests/exporters/test_export.py.

`ModelTesterMixin` derives from `ExportTesterMixin`; this empty base adds no export tests.
"""


class ExportTesterMixin:
    pass
'''

_CONFIG_UTILS_SHIM = '''"""Shim (ode-transformer): the sdist does not ship tests/utils/test_configuration_utils.py.

`ConfigTester.check_config_arguments_init` builds a config from these kwargs and checks each is read back;
every value differs from the `PreTrainedConfig` default. (`dtype` is given as a string; the tester expects
`torch.float16` back.)
"""

config_common_kwargs = {
    "return_dict": False,
    "output_hidden_states": True,
    "output_attentions": True,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "architectures": ["BertModel"],
    "id2label": {0: "label"},
    "label2id": {"label": "0"},
    "problem_type": "regression",
}
'''

_SHIMS = {
    "generation/__init__.py": "",
    "generation/test_utils.py": _GENERATION_SHIM,
    "exporters/__init__.py": "",
    "exporters/test_export.py": _EXPORT_SHIM,
    "utils/__init__.py": "",
    "utils/test_configuration_utils.py": _CONFIG_UTILS_SHIM,
}


class CommonTestsUnavailable(RuntimeError):
    """The common tests could not be fetched; the message says why."""


def cache_dir(version: str | None = None) -> Path:
    """`.cache/transformers-tests/<version>/` under the repository root (`TRANSFORMERS_TESTS_CACHE` overrides)."""
    root = os.environ.get("TRANSFORMERS_TESTS_CACHE")
    base = Path(root) if root else REPO_ROOT / ".cache" / "transformers-tests"
    return base / (version or transformers.__version__)


def _download_sdist(version: str, into: Path) -> Path:
    """`pip download` the sdist of transformers==version (the registry pip is configured for, nothing else)."""
    into.mkdir(parents=True, exist_ok=True)
    existing = sorted(into.glob(f"transformers-{version}.tar.gz"))
    if existing:
        return existing[0]
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        "--disable-pip-version-check",
        "--retries",
        "2",
        "--timeout",
        "30",
        "-d",
        str(into),
        f"transformers=={version}",
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise CommonTestsUnavailable(
            f"could not download the transformers=={version} sdist with pip: {error}"
        ) from error
    found = sorted(into.glob(f"transformers-{version}.tar.gz"))
    if result.returncode != 0 or not found:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise CommonTestsUnavailable(
            f"could not download the transformers=={version} sdist from the package registry "
            f"(`pip download` exit {result.returncode}): {' | '.join(tail)}"
        )
    return found[0]


def _extract_tests(sdist: Path, version: str, package_dir: Path) -> None:
    """Top-level `tests/*.py` of the sdist -> package_dir, plus `__init__.py` and our shims."""
    prefix = f"transformers-{version}/tests/"
    package_dir.mkdir(parents=True)
    count = 0
    with tarfile.open(sdist, "r:gz") as archive:
        for member in archive.getmembers():
            name = member.name[len(prefix) :] if member.name.startswith(prefix) else ""
            if not member.isfile() or not name.endswith(".py") or "/" in name:
                continue
            data = archive.extractfile(member).read()
            (package_dir / name).write_bytes(data)
            count += 1
    needed = ("test_modeling_common.py", "test_configuration_common.py")
    missing = [name for name in needed if not (package_dir / name).is_file()]
    if missing:
        raise CommonTestsUnavailable(
            f"{sdist.name} has no tests/{', tests/'.join(missing)} ({count} files found)"
        )
    # Empty, like transformers' own tests/__init__.py (test_configuration_common executes it as a module).
    (package_dir / "__init__.py").write_text("")
    for relative, text in _SHIMS.items():
        path = package_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def prepare_common_tests(version: str | None = None) -> Path:
    """Make sure `<cache>/<version>/hf_transformers_tests` exists; returns the folder to put on sys.path."""
    version = version or transformers.__version__
    root = cache_dir(version)
    root.mkdir(parents=True, exist_ok=True)
    package_dir = root / PACKAGE
    with FileLock(str(root / ".lock"), timeout=900):  # pytest-xdist workers share the cache
        if (package_dir / _COMPLETE).is_file():
            return root
        sdist = _download_sdist(version, root / "sdist")
        staging = Path(tempfile.mkdtemp(prefix=f"{PACKAGE}-", dir=root))
        try:
            _extract_tests(sdist, version, staging / PACKAGE)
            (staging / PACKAGE / _COMPLETE).write_text(f"transformers=={version} ({sdist.name})\n")
            shutil.rmtree(package_dir, ignore_errors=True)
            (staging / PACKAGE).rename(package_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return root


def unavailable_message(error: CommonTestsUnavailable) -> str:
    """Why the common tests cannot run and how to make their sources available."""
    version = transformers.__version__
    return (
        f"transformers' common tests are unavailable: {error}\n"
        f"Make them available: let pip reach the package registry once (the sources are cached in "
        f"{cache_dir(version)}), or put transformers-{version}.tar.gz (the sdist) in {cache_dir(version) / 'sdist'}, "
        f"or point TRANSFORMERS_TESTS_CACHE at the cache of an earlier run. Set {SKIP_ENV}=1 to skip them instead."
    )


def import_common_tests() -> tuple[ModuleType, ModuleType]:
    """(`test_modeling_common`, `test_configuration_common`) of the installed transformers version."""
    root = str(prepare_common_tests())
    if root not in sys.path:
        sys.path.insert(0, root)
    modeling = importlib.import_module(f"{PACKAGE}.test_modeling_common")
    configuration = importlib.import_module(f"{PACKAGE}.test_configuration_common")
    return modeling, configuration
