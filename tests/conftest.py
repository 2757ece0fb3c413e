"""Shared pytest configuration for the project's tests."""

# --- transformers' common model tests (tests/test_modeling_hf_common.py) ---------------------------------------
# The test modules fetched from the transformers sdist (tests/hf_common.py) mark some tests with markers that
# transformers' own conftest.py registers; register them here too so that collection does not warn.
_TRANSFORMERS_TEST_MARKERS = {
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
    from train.data import data_root

    root = data_root()
    if not root.is_dir():
        pytest.skip(f"shared data not found at {root} (set ODE_DATA_DIR)")
    return root
