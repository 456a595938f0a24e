"""Extension points that other apps register into at start-up (AppConfig.ready).

The registry must not import serving; serving subscribes here instead, so
deprecating a version can retire it from deployments without a circular import.
Hooks run inside the transition's transaction and must only enqueue work
(transaction.on_commit), never call out over the network.
"""

after_version_transition: list = []

# Called as hook(version) inside the registration transaction, for new versions only.
after_version_registered: list = []

# (name, callable returning {"ok": bool, ...}) pairs shown by the health endpoint.
health_checks: list = []

# Extra panels on the adapter page: callables (actor, adapter) -> a context dict
# with a "template" key (rendered at the end of the page), or None.
adapter_page_panels: list = []
