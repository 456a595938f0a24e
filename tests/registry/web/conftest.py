"""Page tests share the adapter they look at (tests/support/pages.py)."""

from tests.support.pages import contracts, v1  # noqa: F401 (fixtures)
