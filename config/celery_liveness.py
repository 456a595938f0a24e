"""Worker liveness: a worker that no longer consumes is found, and restarted.

A worker can stay alive and consume nothing: after a broker outage it may
never subscribe again (celery/celery#10205: the crash that
config/celery_redis.py fixes), it may wait in a warm shutdown for a task that
cannot be acked, or it may be frozen. Its process is there, so neither a
supervisor that waits for an exit nor a Kubernetes restart policy notices, and
`celery inspect ping` costs a full Django start per probe.

So each worker proves it consumes. With WORKER_LIVENESS_FILE set, a consumer
bootstep publishes a ping to a queue of the worker's own every
WORKER_LIVENESS_INTERVAL_SECONDS, through the broker, and consumes it on the
worker's own broker connection, in its main process (so a pool busy with long
rollouts does not hold it up). Each ping it receives touches the file. A file
older than a few intervals means the worker has not consumed a message for
that long: restart it.

    python -m config.celery_alive /tmp/worker-alive --max-age 60   # exit 0 fresh, 1 stale

That check (config/celery_alive.py) is the workers' liveness probe in deploy/
and docker-compose.yml; scripts/supervise.py does the same for `make run`
(--liveness).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from pathlib import Path

logger = logging.getLogger(__name__)

PATH_ENV = "WORKER_LIVENESS_FILE"
INTERVAL_ENV = "WORKER_LIVENESS_INTERVAL_SECONDS"
DEFAULT_INTERVAL_SECONDS = 10.0

# -- in the worker ---------------------------------------------------------------


def install(app) -> None:
    """Adds the ping step to the worker's consumer when WORKER_LIVENESS_FILE is set."""
    if os.environ.get(PATH_ENV):
        app.steps["consumer"].add(_ping_step())


def _ping_step():
    # Celery imports only in the worker: the check above must stay cheap.
    from celery import bootsteps
    from kombu import Consumer, Queue

    class LivenessPing(bootsteps.StartStopStep):
        requires = ("celery.worker.consumer.tasks:Tasks",)

        def __init__(self, parent, **kwargs):
            super().__init__(parent, **kwargs)
            self.path = Path(os.environ[PATH_ENV])
            self.interval = float(os.environ.get(INTERVAL_ENV) or DEFAULT_INTERVAL_SECONDS)
            # Pings left in the queue by an earlier process of this worker prove nothing.
            self.nonce = uuid.uuid4().hex
            self.consumer = self.channel = self.tref = self.queue = None

        def start(self, c):
            self.queue = Queue(f"liveness.{c.hostname}", durable=False, auto_delete=True)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.channel = c.connection.channel()
            self.consumer = Consumer(
                self.channel, queues=[self.queue], callbacks=[self.received], accept=["json"]
            )
            self.consumer.consume()
            self.app = c.app
            self.tref = c.timer.call_repeatedly(self.interval, self.send)
            self.send()

        def send(self):
            # Through the app's producer pool, not the consumer's connection: the ping
            # must cross the broker and come back on the connection that consumes tasks.
            try:
                with self.app.producer_or_acquire() as producer:
                    producer.publish(
                        {"nonce": self.nonce, "sent": time.time()},
                        # The default exchange: straight to the queue. A named one
                        # would drop it on the embedded broker, whose bindings
                        # live in each process's memory.
                        exchange="",
                        routing_key=self.queue.name,
                        declare=[self.queue],
                        serializer="json",
                        retry=False,
                    )
            except Exception as error:  # noqa: BLE001 - a broker away now is what the file shows
                logger.debug("liveness ping not sent: %s", error)

        def received(self, body, message):
            message.ack()
            if isinstance(body, dict) and body.get("nonce") == self.nonce:
                self.path.touch()

        def stop(self, c):
            if self.tref is not None:
                self.tref.cancel()
                self.tref = None
            for closing in (self.consumer, self.channel):
                if closing is not None:
                    # The connection may be gone already.
                    with contextlib.suppress(Exception):
                        closing.close()
            self.consumer = self.channel = None

        shutdown = stop

    return LivenessPing
