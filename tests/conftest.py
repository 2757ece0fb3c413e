"""Shared pytest configuration for the project's tests."""

# --- transformers' common model tests (tests/test_modeling_hf_common.py) ---------------------------------------
# The test modules fetched from the transformers sdist (tests/hf_common.py) mark some tests with markers that
# transformers' own conftest.py registers; register them here too so that collection does not warn.
_TRANSFORMERS_TEST_MARKERS = {
    "both_cpus": "runs on a mocked AVX2-only CPU and again on one with native bf16 (tests/mocked_cpus.py)",
    "accelerate_tests": "transformers common tests: needs accelerate on an accelerator",
    "flash_attn_test": "transformers common tests: needs Flash Attention 2",
    "flash_attn_3_test": "transformers common tests: needs Flash Attention 3",
    "flash_attn_4_test": "transformers common tests: needs Flash Attention 4",
    "torch_compile_test": "transformers common tests: exercises torch.compile",
}


def pytest_configure(config):
    for name, description in _TRANSFORMERS_TEST_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")


# --- the shared corpora ------------------------------------------------------------------------------------------
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def shared_data():
    """The shared corpora folder (`train.data.data_root()`: $ODE_DATA_DIR or ../shared/data); skips without it."""
    from ode_transformer.train.data import data_root

    root = data_root()
    if not root.is_dir():
        pytest.skip(f"shared data not found at {root} (set ODE_DATA_DIR)")
    return root


# --- the device (and dtype) the model tests run on ------------------------------------------------------------------
# The model, cache, generation and training tests build their models and inputs on `device`, so the same tests run
# on a GPU wherever there is one (benchmarks/gpu_suite.py runs them there in fp32 and bf16).
import os  # noqa: E402

import torch  # noqa: E402

TEST_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@pytest.fixture(scope="session")
def device() -> torch.device:
    """$ODE_TEST_DEVICE (e.g. `cuda:1`, `cpu`), else CUDA when available, else the CPU."""
    name = os.environ.get("ODE_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@pytest.fixture(scope="session")
def dtype() -> torch.dtype:
    """$ODE_TEST_DTYPE (`float32`, the default, or `bfloat16`): the dtype of the models of the tests whose checks
    hold in any precision (the same tokens with and without a cache)."""
    name = os.environ.get("ODE_TEST_DTYPE", "float32")
    if name not in TEST_DTYPES:
        raise pytest.UsageError(f"ODE_TEST_DTYPE={name!r}; one of {', '.join(TEST_DTYPES)}")
    return TEST_DTYPES[name]


# --- the CPU the tests see (tests/mocked_cpus.py) ------------------------------------------------------------------
# Every test sees an AVX2-only CPU, whatever the machine: `--precision auto` then trains in fp32 everywhere, and the
# suite takes the same paths on any CI machine. Session-wide, so module-scoped training fixtures see it too; child
# processes get it from ONEDNN_MAX_CPU_ISA=AVX2, PyTorch's own switch, which ode_transformer.precision honours.
# `@pytest.mark.both_cpus` runs a test once more on a CPU with native bf16 (the `cpu_kind` parameter): where the CPU
# kind decides something (the precision a run resolves, what it says about it). A whole training run twice only where
# bf16 training itself is the subject (the LM run, an exact resume): elsewhere the second run re-checks a decision
# that the precision tests already pin, at minutes of emulated bf16 on an AVX2-only machine.
from mocked_cpus import CPUS, pretend  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def avx2_only_cpu():
    with pytest.MonkeyPatch.context() as monkeypatch:
        pretend(monkeypatch, *CPUS["avx2"])
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
        yield


def pytest_generate_tests(metafunc):
    if metafunc.definition.get_closest_marker("both_cpus"):
        metafunc.parametrize("cpu_kind", ["avx2", "native_bf16"], indirect=True)


@pytest.fixture(autouse=True)
def cpu_kind(request, monkeypatch) -> str:
    """The kind of CPU this test sees: `avx2` unless a `both_cpus` test is running as `native_bf16`."""
    kind = getattr(request, "param", "avx2")
    if kind != "avx2":
        pretend(monkeypatch, *CPUS[kind])
    return kind


# --- what the tests of the tools share -------------------------------------------------------------------------------
@pytest.fixture
def refused(capsys):
    """``refused(main, *args)`` runs a command's ``main(*args)`` (or a console command, ``cli.translate``), which must
    end the process (``SystemExit``) with exit code 2, a refusal, or ``code``; returns what it wrote on stderr."""

    def refuse(main, *args, code: int = 2) -> str:
        with pytest.raises(SystemExit) as exit_:
            main(*args)
        assert exit_.value.code == code
        return capsys.readouterr().err

    return refuse


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny models: more only add synchronisation, and under `pytest -n 2` on
    two cores they oversubscribe the CPU. Restored after the module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- inductor's compiled kernels ------------------------------------------------------------------------------------
@pytest.fixture(scope="session", autouse=True)
def inductor_cache_of_this_run(tmp_path_factory):
    """One inductor cache for this run's compiles (both xdist workers and their children share it): tests compile
    from nothing, as on a fresh machine, whatever another run or torch version left in the user's cache."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")


# --- one worker for the tests that share a built fixture -------------------------------------------------------------
@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(items):
    """Under `pytest -n 2 --dist loadgroup` (`make test`), the tests of a module that share a module- or
    session-scoped fixture of that module (a trained model, its exported graphs, a finished run) are one group:
    xdist runs them on one worker, one after another, so the fixture is built once, not once per worker."""
    for item in items:
        module = getattr(item, "module", None)
        definitions = getattr(item, "_fixtureinfo", None)
        if module is None or definitions is None or item.get_closest_marker("xdist_group"):
            continue
        if any(
            defs[-1].scope in ("module", "session") and defs[-1].func.__module__ == module.__name__
            for defs in definitions.name2fixturedefs.values()
        ):
            item.add_marker(pytest.mark.xdist_group(module.__name__))
