"""The docs' example runner leaves the interpreter as it found it (the process tier needs that)."""

from __future__ import annotations

import sys

from tests.doc_examples import run_example


def test_script_example_keeps_the_main_module() -> None:
    """An example with a main block does not remove sys.modules['__main__'] (spawn needs it)."""
    main = sys.modules["__main__"]
    run_example("script", 'if __name__ == "__main__":\n    print("ran")  # ran\n')
    assert sys.modules["__main__"] is main
