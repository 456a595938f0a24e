"""HAProxy as the front door: its configuration, rendered from a routing table,
and every exchange with a running HAProxy (the runtime API on a UNIX socket,
and hitless reloads through the master CLI). No other module talks to HAProxy.

The layout, one HAProxy per deployment (HAProxy 2.6, master-worker mode):
- the frontend checks the path, the key and the caller's limits on the
  headers, then buffers the request body (bounded), reads its JSON `model`
  (door.lua; routed only if it finished: docs/door.md#fail-closed) and looks
  it up in a map file: model -> backend;
- one backend per model (the base model's and one per adapter), with a server
  line for every replica, each READY, DRAIN or MAINT as the table says;
- a model that is not in the map gets vLLM's 404 (OpenAI's error shape).

What changes at runtime and how:
- a replica gains or loses an adapter, a swap drains one replica: `set server
  <backend>/<server> state ready|drain|maint` (no reload);
- an adapter is retired: `del map` (at once a 404; its backend goes at the next reload);
- an adapter or a replica is added: the configuration is written again and the
  master reloads it (`reload` on the master CLI). The master keeps the listening
  sockets, so no connection is refused; the old worker finishes its requests.

Files in the door's directory: haproxy.cfg, models.map, admin.sock (runtime
API), master.sock (master CLI), haproxy.pid (the master's pid), unavailable.http
(the 503 of a model no replica serves right now), lock (serialises every writer
on this host), held.map (the models whose new requests the door holds while
their only replica swaps: docs/door.md#holding) and the access maps (keys,
grants, catalog, door, upstream: mode 0600; upstream.map holds the replicas'
vLLM API key, base64).

The package, by job: config.py and the haproxy.cfg template (the
configuration), maps.py (the map files), runtime.py (the runtime API client)
and front_door.py (HAProxyFrontDoor, the FrontDoor that uses them). The agent
of a door that pulls its state is serving/door/agent.py.
"""

from serving.door.haproxy.config import Peer
from serving.door.haproxy.front_door import HAProxyFrontDoor
from serving.door.haproxy.runtime import DoorError

__all__ = ["DoorError", "HAProxyFrontDoor", "Peer"]
