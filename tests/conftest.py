import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="session")
def llamacpp_lib() -> str:
    """The CPU build's library folder of the peer llama.cpp (built on first use, ~2.5-6 min on
    2 cores, then cached); the tests that need it skip only when the peer source is absent."""
    from workbench.llamacpp.build import BuildError, build, find_source

    try:
        find_source()
    except BuildError as e:
        pytest.skip(str(e))
    return str(build())
