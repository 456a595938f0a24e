"""A database world built once for a test module instead of once per test.

pytest-django wraps each non-transactional test in a transaction that it rolls
back. A module whose every test starts from the same costly world (rollouts
executed against stand-in replicas, say) builds it once inside an outer
transaction: each test's transaction is then a savepoint inside it, so its
writes still roll back to the world, and the world itself rolls back when the
module's tests are done. Transactional tests (`transaction=True`) cannot run
inside it, and pytest tears module fixtures down before a worker moves on to
another module.

    @pytest.fixture(scope="module")
    def world(django_db_setup, django_db_blocker):
        with kept_for_the_module(django_db_blocker):
            yield build_the_world()
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import transaction


@contextmanager
def kept_for_the_module(django_db_blocker) -> Iterator[None]:
    """Rows written inside stay for every test of the module, then roll back."""
    with django_db_blocker.unblock():
        outer = transaction.atomic()
        outer.__enter__()
        try:
            yield
        finally:
            transaction.set_rollback(True)
            outer.__exit__(None, None, None)
