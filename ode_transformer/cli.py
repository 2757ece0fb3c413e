"""The console commands of ``pyproject.toml`` (``ode-train``, ``ode-translate``, ...).

Each runs a module's ``main``. What a user can fix ends the command with one line on stderr and exit code 2,
not a traceback: a third-party module missing because an extra was not installed (the extra named), and the
``OSError`` / ``ValueError`` our tools raise for bad input (a missing file, a damaged ``.gz``, a full disk, ...),
whose messages name the problem and the fix. Where such an error was raised by a library rather than by one of
the project's own checks, its traceback is kept in a file the line names (an unexpected ``ValueError`` after
hours of training must not lose it; only the newest few such files are kept), and ``ODE_TRACEBACK=1`` prints it
instead. A refusal by the project's own checks (an occupied folder, a second writer, a bad file named) keeps none. Ctrl-C
(SIGINT) ends it with one line too, ``PROG: interrupted; ADVICE`` (how to resume, from the ``KeyboardInterrupt``'s
message where the module gives one) and exit code 130 (128 + SIGINT, as shells report it). A closed
output pipe (``ode-translate ... | head``) ends the command quietly. ``python -m ode_transformer.translate`` and the other
modules keep Python's traceback: that is the developer's path.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import sys
import tempfile
import traceback
import urllib.parse
from pathlib import Path

# positive_int, the argparse type of every command's counts, is defined beside the kept parsers that rebuild it;
# the commands' modules import it from here
from .parsers import check_arguments
from .parsers import positive_int as positive_int

OWN_PACKAGES = ("ode_transformer", "modeling_ode", "train", "hub")
KEPT_TRACEBACKS = 10
"""How many ``ode-*.traceback`` files the temporary folder keeps: the newest; older ones are deleted."""
_running_command: str | None = None  # the console command being run, set by _launch


def install_command(extra: str | None = None) -> str:
    """How to install the package (with an extra): it is not on PyPI, so from a clone, or from a wheel built
    there with ``python -m build``."""
    suffix = f"[{extra}]" if extra else ""
    return f"pip install '.{suffix}' in a clone of ode-transformer, or pip install 'ode_transformer-*.whl{suffix}'"


def guide(name: str, folder: str = "docs") -> str:
    """Where the guide ``name`` (``data-and-tests.md``) is: ``docs/`` in a clone, the package's ``docs/`` folder in
    an install (pyproject ships the guides), so that a message naming it names a file the user has. ``folder`` is
    another shipped folder of the repository (``results``, which ships ``verdict.md``)."""
    package = Path(__file__).resolve().parent
    for where in (package.parent / folder, package / folder):
        if (where / name).is_file():
            return str(where / name)
    return f"{folder}/{name} of the ode-transformer repository"


def program_name(module: str) -> str:
    """The name a command's usage and error lines give: the console command running (``ode-train``), else
    ``python -m MODULE``."""
    return _running_command or f"python -m {module}"


def _traceback_wanted() -> bool:
    """``ODE_TRACEBACK=1``: a user's error re-raises with its traceback instead of ending in one line."""
    return os.environ.get("ODE_TRACEBACK", "0") not in ("", "0")


def report_user_error(module: str, error: BaseException) -> int:
    """For a module's ``main`` that catches what its user can fix: ``PROG: error: MESSAGE`` on stderr, and exit
    code 2 (argparse's for a usage error) to return. ``ODE_TRACEBACK=1`` raises the error instead."""
    if _traceback_wanted():
        raise error
    print(f"{program_name(module)}: error: {error}", file=sys.stderr)
    return 2


INTERRUPTED = 130
"""Exit code of a command stopped by Ctrl-C (128 + SIGINT, what a shell reports for a process it killed)."""


def report_interrupt(module: str, interrupt: KeyboardInterrupt) -> int:
    """For a module's ``main`` that catches Ctrl-C: ``PROG: interrupted; ADVICE`` on stderr (the advice is the
    interrupt's message: where the work stands and how to resume it), and exit code 130 to return.
    ``ODE_TRACEBACK=1`` raises the interrupt instead."""
    if _traceback_wanted():
        raise interrupt
    advice = str(interrupt) or "nothing was written; run the command again"
    print(f"{program_name(module)}: interrupted; {advice}", file=sys.stderr)
    return INTERRUPTED


def output_problem(output: str | None, inputs: dict[str, str | list[str] | None]) -> str | None:
    """Why ``--output`` cannot be written (its folder is missing, it is a folder, or it is one of the command's
    own input files, which it would replace), else None: checked before the work, not after it. ``inputs``:
    flag -> path(s); ``-`` (standard input/output) is never a file."""
    if output in (None, "-"):
        return None
    target = Path(output).resolve()
    if not target.parent.is_dir():
        return f"--output {output}: its folder {Path(output).parent} does not exist"
    if target.is_dir():
        return f"--output {output} is a folder: give a file name in it"
    for flag, paths in inputs.items():
        for path in [paths] if isinstance(paths, str) else paths or []:
            if path != "-" and Path(path).resolve() == target:
                return f"--output {output} is the {flag} file: writing it would replace that input; give another name"
    return None


def _fail(message: str) -> None:
    print(message, file=sys.stderr)
    sys.exit(2)


def _own_code_folders() -> list[Path]:
    folders = []
    for name in ("ode_transformer", "ode_transformer.train", "ode_transformer.hub", "modeling_ode"):
        module = sys.modules.get(name)
        folders += [Path(path).resolve() for path in getattr(module, "__path__", [])]
    return folders


def raised_by_own_check(error: BaseException) -> bool:
    """Whether ``error`` was raised by the project's own code (a check that names the problem and the fix), not
    inside a library or the standard library (an unexpected failure, whose traceback is worth keeping)."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return False
    raised_in = Path(frames[-1].filename).resolve()
    # a `raise` of the project's: a builtin failing on a project line (zip, int(...)) is no check of its own
    explicit = (frames[-1].line or "").lstrip().startswith("raise")
    return explicit and any(raised_in.is_relative_to(folder) for folder in _own_code_folders())


def _prune_tracebacks(keep: int = KEPT_TRACEBACKS) -> None:
    """Delete this user's ``ode-*.traceback`` files in the temporary folder but the newest ``keep``."""
    folder = Path(tempfile.gettempdir())
    mine = []
    for path in folder.glob("ode-*.traceback"):
        try:
            stat = path.stat()
        except OSError:
            continue
        if stat.st_uid == os.getuid():
            mine.append((stat.st_mtime_ns, path))
    for _, path in sorted(mine, reverse=True)[keep:]:
        Path(path).unlink(missing_ok=True)


def _keep_traceback(command: str) -> str:
    """Write the traceback being handled to a temporary file; where it is, in words (on a full disk: nowhere).
    Older traceback files beyond the newest :data:`KEPT_TRACEBACKS` are deleted."""
    path = None
    try:
        with tempfile.NamedTemporaryFile(
            "w", prefix=f"{command}-", suffix=".traceback", delete=False
        ) as file:
            path = file.name
            traceback.print_exc(file=file)
    except OSError:  # the error being reported may well be a full disk
        if path is not None:
            Path(path).unlink(missing_ok=True)
        return "the traceback could not be written either"
    with contextlib.suppress(OSError):
        _prune_tracebacks()
    return f"traceback in {path}"


HUB_COMMANDS = ("ode-train", "ode-translate")
"""The commands that may download from the Hub (a dataset, a model id): they check once that it is reachable."""
HUB_CHECK_SECONDS = 3.0
HUB_UNREACHABLE_ENV = "ODE_HUB_UNREACHABLE"
"""Set to 1 beside ``HF_HUB_OFFLINE=1`` by :func:`go_offline_if_hub_unreachable` (child processes inherit both), so
that a message tells a Hub that cannot be reached from an offline mode the user chose."""


def _hub_routes(endpoint: urllib.parse.SplitResult) -> list[tuple[str | None, int]]:
    """The (host, port) pairs a request to ``endpoint`` may first connect to, the likelier first: the proxy the
    environment or the system names for its scheme (``HTTPS_PROXY``, else ``ALL_PROXY``, either case), unless
    ``NO_PROXY`` exempts the endpoint's host, and the endpoint itself. Both are tried: the Hub client's HTTP
    library reads ``NO_PROXY`` and the system proxy in ways urllib does not (``.huggingface.co``, CIDR ranges),
    and behind a proxy there may be no direct route. A proxy address with a malformed port is left out."""
    import urllib.request  # here, not at the top: --help never checks the Hub, and this module is on its path

    direct = (endpoint.hostname, endpoint.port or (443 if endpoint.scheme == "https" else 80))
    proxies = urllib.request.getproxies()
    proxy = proxies.get(endpoint.scheme) or proxies.get("all")
    if not proxy:
        return [direct]
    proxy_url = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    default_port = {"https": 443}.get(proxy_url.scheme, 1080 if proxy_url.scheme.startswith("socks") else 80)
    try:
        through_proxy = (proxy_url.hostname, proxy_url.port or default_port)
    except ValueError:  # a port that is no number, or out of range
        return [direct]
    bypassed = urllib.request.proxy_bypass_environment(endpoint.hostname or "", proxies)
    return [direct, through_proxy] if bypassed else [through_proxy, direct]


def go_offline_if_hub_unreachable(timeout: float = HUB_CHECK_SECONDS) -> bool:
    """Where neither ``HF_HUB_OFFLINE`` nor ``TRANSFORMERS_OFFLINE`` is set, try a TCP connection to the Hub
    (``HF_ENDPOINT``'s host, else huggingface.co) and to the proxy that requests to it may go through
    (``_hub_routes``); where every one fails, set ``HF_HUB_OFFLINE=1`` for this process, before huggingface_hub,
    datasets and transformers read it, so that they answer from their local caches at once instead of retrying
    each request (offline, ode-train's Hub dataset fallback repeated its warnings for most of a minute before its
    one line). Returns whether it went offline."""
    if os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"):
        return False
    for host, port in _hub_routes(
        urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    ):
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            return False
        except OSError:  # no name resolution, no route, refused, timed out: try the other route
            continue
    os.environ["HF_HUB_OFFLINE"] = os.environ[HUB_UNREACHABLE_ENV] = "1"
    return True


def _set(variable: str) -> bool:
    """Whether an environment variable is set to true, as huggingface_hub reads ``HF_HUB_OFFLINE``."""
    return os.environ.get(variable, "").strip().lower() in ("1", "on", "yes", "true")


def hub_unreachable(name: str) -> tuple[str, str]:
    """Why the Hub repository ``name`` (a model or dataset id) cannot be loaded, given that no copy of it is
    cached, and the way to load it from a cache, both in words for a message (never an exception's class name):
    the Hub cannot be reached from this machine, or the user set ``HF_HUB_OFFLINE`` themselves."""
    chosen = (_set("HF_HUB_OFFLINE") or _set("TRANSFORMERS_OFFLINE")) and not _set(HUB_UNREACHABLE_ENV)
    if chosen:
        variable = "HF_HUB_OFFLINE" if _set("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
        return f"{variable} is set and no copy of {name} is cached", f"unset {variable} to download it"
    return (
        f"the Hugging Face Hub cannot be reached from this machine (no network, or a proxy or firewall in the "
        f"way) to download {name}, and no copy of it is cached",
        "load it once where the Hub is reachable, copy the Hugging Face cache (HF_HOME, by default "
        "~/.cache/huggingface) here and set HF_HUB_OFFLINE=1",
    )


def _launch(command: str, module: str, extra: str | None) -> None:
    global _running_command
    _running_command = command
    try:
        # --help and a refused flag are answered from the kept flags, before torch and transformers load
        check_arguments(command, sys.argv[1:])
        if command in HUB_COMMANDS:
            go_offline_if_hub_unreachable()
        status = importlib.import_module(f"ode_transformer.{module}").main()
    except ModuleNotFoundError as error:  # at import, or a lazy import inside main
        missing = (error.name or "").split(".")[0]
        if extra is None or not missing or missing in OWN_PACKAGES:
            raise
        _fail(
            f"{command}: needs the {missing!r} package: install the [{extra}] extra ({install_command(extra)})"
        )
    except KeyboardInterrupt as interrupt:
        status = report_interrupt(module, interrupt)
    except BrokenPipeError:  # the reader closed the pipe: stop writing, and let exit not write again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except (OSError, ValueError) as error:
        if _traceback_wanted():
            raise
        if raised_by_own_check(error):  # a refusal that names its problem and fix: nothing more to keep
            _fail(f"{command}: error: {error}")
        # a library's message may span lines (transformers' offline one)
        one_line = " ".join(str(error).split())
        _fail(f"{command}: error: {one_line} ({_keep_traceback(command)}; ODE_TRACEBACK=1 prints it)")
    finally:
        _running_command = None
    sys.exit(status or 0)


def train() -> None:
    _launch("ode-train", "train.run", "train")


def translate() -> None:
    _launch("ode-translate", "translate", None)  # the core install suffices


def evaluate() -> None:
    _launch("ode-evaluate", "train.evaluate_predictions", "train")


def export() -> None:
    _launch("ode-export", "hub.export", "hub")


def model_card() -> None:
    _launch("ode-model-card", "hub.model_card", "hub")


def push() -> None:
    _launch("ode-push", "hub.push", "hub")
