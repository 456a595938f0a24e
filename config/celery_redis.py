"""kombu's Redis transport, with one fix: a worker survives a Redis restart.

With Celery 5.7 / kombu 5.7 (the newest; celery/celery#10205, #10302), a
worker that loses its Redis connection while it holds an unacked task never
consumes again. The consumer's connection-error handler first calls
`connection.collect()`, which detaches the transport (`transport.client =
None`), and then `connection.close()`, which closes the channel; closing
restores the unacked messages through a new Redis client, whose parameters
come from `transport.client.hostname`: an AttributeError. That is not a
connection error, so instead of reconnecting the worker logs "Unrecoverable
error" and starts a warm shutdown. It takes no new task while it waits for the
ones in hand (a rollout retrying a replica can take minutes), and the
promotions made meanwhile wait too.

Here a channel whose transport is gone says so with a connection error, which
kombu already handles: the close goes on, the consumer reconnects and consumes
again. Nothing is lost by not restoring through a detached transport: the
unacked messages stay in Redis's unacked hash and kombu's restore_visible puts
them back on their queue after the visibility timeout (if the Redis that
restarted kept them at all; serving's sweeper re-sends lost rollouts either
way). An ack of a task that finishes after the reconnect goes to the old
channel and is logged as "Couldn't ack", for the same reason.

Registered for redis:// and rediss:// in config/celery.py, before any
connection is made.
"""

from __future__ import annotations

from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError


class TransportDetached(RedisConnectionError):
    """The channel's connection was closed and collected; it cannot reach Redis again."""


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous=False):
        if self.connection is None or self.connection.client is None:
            raise TransportDetached(
                "the broker connection was closed; a new one replaces this channel"
            )
        return super()._connparams(asynchronous=asynchronous)


class Transport(kombu_redis.Transport):
    Channel = Channel
