"""The actor of the edit history: who makes a transaction's edits, told to the triggers.

The history itself (``TaskHistory``) and the definition versions (``TaskVersion``) are written by
database triggers (``sql/schema.sql``) in the transaction of each change; the only thing Python adds
is the name of the admin user, passed as the transaction-local setting ``scheduling.actor``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections, transaction
from django.db.transaction import TransactionManagementError

from scheduling.sql import queries

#: Longest actor name kept (``TaskHistory.actor``; Django's username is 150 characters).
ACTOR_LIMIT = 150


def set_actor(actor: str, using: str = "default") -> None:
    """Name ``actor`` as the author of the current transaction's edits, for the history triggers.

    Transaction-local (``set_config(..., true)``): it ends with the transaction. Raises
    TransactionManagementError outside an atomic block, where the setting would end with the
    statement that sets it.
    """
    connection = connections[using]
    if not connection.in_atomic_block:
        raise TransactionManagementError("set_actor needs an atomic block: the setting is local")
    with connection.cursor() as cursor:
        cursor.execute(queries["set_actor"], [actor[:ACTOR_LIMIT]])


@contextmanager
def acting(actor: str, using: str = "default") -> Iterator[None]:
    """Run the body in a transaction whose edits the history records as made by ``actor``.

    An empty ``actor`` records nothing more than the SQL role (the triggers' default).
    """
    with transaction.atomic(using=using):
        if actor:
            set_actor(actor, using)
        yield
