"""The embedded Celery broker: kombu's SQLAlchemy transport on a SQLite file.

It replaced kombu's filesystem transport, whose reader could open a message
file that a producer had not finished writing (a JSONDecodeError in
`kombu/transport/filesystem.py _get`, and the worker died with "Unrecoverable
error"). Here a message is a row, written and taken in transactions, so a
reader never sees half of one.

Four things differ from kombu's stock `sqla+` transport (the first three for SQLite only):
- WAL with synchronous=NORMAL and a long busy timeout: web, beat and three
  workers write the file at once, and a lock wait must never surface as an
  error (`database is locked` is a connection error to kombu: a reconnect
  loop in the worker, a failed publish in the web process).
- A message is deleted when it is taken, not kept with visible=False forever
  (kombu never makes such rows visible again; unacked messages of a worker
  that shuts down are re-published as new rows), so the file stays small.
- The polling interval comes from the transport options (kombu hands every
  option to `create_engine`, which refuses unknown ones).
- A queue that another process created between this one's lookup and its
  insert is used, not an error: kombu guards the create with a lock of one
  process only, so producers starting together failed their first publish
  with "UNIQUE constraint failed: kombu_queue.name".

Used through the `sqlite://` broker URL scheme, registered in config/celery.py.
Like every kombu virtual transport it is at-most-once for a worker that is
SIGKILLed with a task in hand; serving's sweeper re-enqueues such rollouts and
every other task is periodic.
"""

from __future__ import annotations

import sqlite3
import time
from json import loads
from queue import Empty

from kombu.transport import sqlalchemy as kombu_sqla
from kombu.utils.encoding import bytes_to_str
from sqlalchemy import create_engine, event, text
from sqlalchemy.exc import IntegrityError, OperationalError

# Seconds a connection waits for another process's write lock before failing.
BUSY_TIMEOUT_SECONDS = 60
OWN_OPTIONS = ("polling_interval",)


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    if isinstance(dbapi_connection, sqlite3.Connection):
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()


class Channel(kombu_sqla.Channel):
    def _open(self):
        # Processes that start together on a new file race to create the tables; the
        # loser's "table already exists" is harmless, and the next try sees them.
        attempt = 0
        while True:
            try:
                return super()._open()
            except OperationalError:
                attempt += 1
                if attempt >= 20:
                    raise
                time.sleep(0.05 * attempt)

    def _get_or_create(self, queue):
        try:
            return super()._get_or_create(queue)
        except IntegrityError:
            # The other process's row is committed: it is the queue.
            self.session.rollback()
            return self.session.query(self.queue_cls).filter(self.queue_cls.name == queue).one()

    def _engine_from_config(self):
        url = self.connection.client.hostname
        options = {
            key: value
            for key, value in self.connection.client.transport_options.items()
            if key not in OWN_OPTIONS
        }
        if not url.startswith("sqlite"):
            return super()._engine_from_config()
        options.setdefault("connect_args", {}).setdefault("timeout", BUSY_TIMEOUT_SECONDS)
        for key in ("callback", "errback", "max_retries", "retry_errors"):
            options.pop(key, None)
        for key in ("interval_start", "interval_step", "interval_max"):
            options.pop(key, None)
        engine = create_engine(url, **options)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine

    def _visible(self, queue_id):
        return (
            self.session.query(self.message_cls.id)
            .filter(self.message_cls.queue_id == queue_id)
            .filter(self.message_cls.visible.is_(True))
        )

    def _get(self, queue):
        obj = self._get_or_create(queue)
        try:
            if self.session.bind.name == "sqlite":
                # An empty queue is found by a read, which takes no lock in WAL mode:
                # every worker polls each of its queues 50 times a second, and when
                # each poll took the write lock, beat's and the web's publishes
                # queued behind them (tests/stress/test_embedded_broker.py).
                found = self._visible(obj.id).limit(1).first()
                self.session.rollback()  # ends the read, so its snapshot is not kept
                if found is None:
                    raise Empty()
                # Takes the write lock before reading, so two workers never take one row.
                self.session.execute(text("BEGIN IMMEDIATE TRANSACTION"))
            message = (
                self.session.query(self.message_cls)
                .with_for_update()
                .filter(self.message_cls.queue_id == obj.id)
                .filter(self.message_cls.visible.is_(True))
                .order_by(self.message_cls.sent_at, self.message_cls.id)
                .limit(1)
                .first()
            )
            if message is None:
                raise Empty()
            payload = loads(bytes_to_str(message.payload))
            self.session.delete(message)
            self.session.commit()
            return payload
        except BaseException:
            # A failed statement leaves the session unusable until rolled back.
            self.session.rollback()
            raise


# How long one drain of the worker's loop polls before it returns. Celery's loop for
# transports without a socket (synloop) asks for 2 s and looks for a shutdown only
# between drains, so SIGTERM waited up to 2 s before the worker even began to stop.
DRAIN_WINDOW_SECONDS = 0.25


class Transport(kombu_sqla.Transport):
    Channel = Channel
    # kombu's virtual transports sleep this long when every queue is empty.
    polling_interval = 0.1

    def drain_events(self, connection, timeout=None):
        # A caller that asked to block (None) still blocks.
        if timeout is not None and timeout > DRAIN_WINDOW_SECONDS:
            timeout = DRAIN_WINDOW_SECONDS
        return super().drain_events(connection, timeout=timeout)
