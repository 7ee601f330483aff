"""The fingerprint of each piece of Flower code fedx's changes rely on, in each checked release.

A fingerprint is the first 16 hex digits of the SHA-256 of the code's source
(``inspect.getsource``); ``None``: that release has no such code. One table
for every change (:data:`fedx.flower.CHECKED_FLWR` names the releases): each
change names the code it relies on, and takes their fingerprints from here
(:func:`flower_code`). ``tests/unit/test_flower_changes.py`` checks the installed
release's against Flower's code; docs/flower-changes.md lists them.
"""

#: ``{"module:qualified.name": {release: fingerprint or None}}``.
FINGERPRINTS: dict[str, dict[str, str | None]] = {
    "flwr.simulation.ray_transport.ray_actor:VirtualClientEngineActor": {
        "1.41.0": "a64283908b1ec170",
        "1.42.0": "a64283908b1ec170",
    },
    "flwr.server.superlink.fleet.vce.vce_api:worker": {
        "1.41.0": "60f308688ba34fb5",
        "1.42.0": "60f308688ba34fb5",
    },
    "flwr.server.superlink.linkstate.in_memory_linkstate:InMemoryLinkState.store_message_ins": {
        "1.41.0": "a2b78afac51dc4a2",
        "1.42.0": "a2b78afac51dc4a2",
    },
    "flwr.server.superlink.linkstate.in_memory_linkstate:InMemoryLinkState.store_message_res": {
        "1.41.0": "52a4f7ccc70e8908",
        "1.42.0": "52a4f7ccc70e8908",
    },
    "flwr.server.superlink.linkstate.in_memory_linkstate:InMemoryLinkState.get_message_ins": {
        "1.41.0": "6547c8dcbc62e12f",
        "1.42.0": "6547c8dcbc62e12f",
    },
    "flwr.server.superlink.fleet.vce.vce_api:put_message_into_state": {
        "1.41.0": "3622eb5bfcd9cd1a",
        "1.42.0": "3622eb5bfcd9cd1a",
    },
    "flwr.server.superlink.fleet.vce.backend.raybackend:RayBackend": {
        "1.41.0": "2ad67054433feddf",
        "1.42.0": "2ad67054433feddf",
    },
    "flwr.server.superlink.fleet.vce.backend.backend:Backend": {
        "1.41.0": "b12e9f514dd36767",
        "1.42.0": "b12e9f514dd36767",
    },
    "flwr.server.superlink.fleet.vce.vce_api:start_vce": {
        "1.41.0": "2d5e267f893950a7",
        "1.42.0": "2d5e267f893950a7",
    },
    "flwr.simulation.ray_transport.ray_actor:pool_size_from_resources": {
        "1.41.0": "dec698571d396dc8",
        "1.42.0": "dec698571d396dc8",
    },
    "flwr.server.superlink.fleet.vce.vce_api:run_api": {
        "1.41.0": "f85c0cd6e902752f",
        "1.42.0": "f85c0cd6e902752f",
    },
    "flwr.server.superlink.fleet.vce.vce_api:add_messages_to_queue": {
        "1.41.0": "953f4bd41a931a77",
        "1.42.0": "953f4bd41a931a77",
    },
    "flwr.supernode.start_client_internal:start_client_internal": {
        "1.41.0": "9e89a6eb68fbec68",
        "1.42.0": "9e89a6eb68fbec68",
    },
    "flwr.supernode.start_client_internal:_pull_and_store_message": {
        "1.41.0": "eaf5d0e36dc34e4c",
        "1.42.0": "eaf5d0e36dc34e4c",
    },
    "flwr.supernode.start_client_internal:_push_messages": {
        "1.41.0": "00bb86faffdec114",
        "1.42.0": "00bb86faffdec114",
    },
    "flwr.supernode.nodestate.in_memory_nodestate:InMemoryNodeState._store_error_replies": {
        "1.41.0": "3af03090bfae3ea7",
        "1.42.0": "3af03090bfae3ea7",
    },
    "flwr.supernode.servicer.runtime.runtime_handlers:pull_messages": {
        "1.41.0": "49089949d9fd1246",
        "1.42.0": "49089949d9fd1246",
    },
    "flwr.supercore.corestate.in_memory_corestate:InMemoryCoreState.finish_task": {
        "1.41.0": "74802c12902fb68b",
        "1.42.0": "74802c12902fb68b",
    },
    "flwr.supercore.retry.http_retry:make_simple_http_retry_invoker": {
        "1.41.0": "49e12326a4b17e26",
        "1.42.0": "49e12326a4b17e26",
    },
    "flwr.superlink.servicer.fleet.fleet_handlers:get_run": {
        "1.41.0": "004ad390c8b38c0e",
        "1.42.0": "004ad390c8b38c0e",
    },
    "flwr.supernode.nodestate.in_memory_nodestate:InMemoryNodeState.store_message_and_object_tree": {
        "1.41.0": "6712f3c6442a9092",
        "1.42.0": "6712f3c6442a9092",
    },
    "flwr.supercore.corestate.in_memory_corestate:InMemoryCoreState.store_object": {
        "1.41.0": "2f952e079f4dadd4",
        "1.42.0": "2f952e079f4dadd4",
    },
    "flwr.supernode.servicer.runtime.runtime_handlers:push_messages": {
        "1.41.0": "f0b01d8d3c43d44a",
        "1.42.0": "f0b01d8d3c43d44a",
    },
    "flwr.supernode.servicer.runtime.runtime_handlers:push_object": {
        "1.41.0": "c6dad970cb51b02b",
        "1.42.0": "c6dad970cb51b02b",
    },
    "flwr.supercore.inflatable.inflatable_utils:pull_objects": {
        "1.41.0": "31bb2de46b450e6a",
        "1.42.0": "31bb2de46b450e6a",
    },
    "flwr.supercore.inflatable.inflatable_utils:pull_and_inflate_object_from_tree": {
        "1.41.0": "139811483a15e4a6",
        "1.42.0": "139811483a15e4a6",
    },
    "flwr.supercore.inflatable.inflatable_utils:get_num_workers": {
        "1.41.0": "d738f7dba5bff74b",
        "1.42.0": "d738f7dba5bff74b",
    },
    "flwr.supercore.inflatable.inflatable_utils:push_objects": {
        "1.41.0": "5893dafc584a46c8",
        "1.42.0": "5893dafc584a46c8",
    },
    "flwr.supercore.inflatable.inflatable_utils:push_object_contents_from_iterable": {
        "1.41.0": "89d2efe1cf720c91",
        "1.42.0": "89d2efe1cf720c91",
    },
    "flwr.supercore.superexec.run_superexec:run_superexec": {
        "1.41.0": "d11f4e7fbc8f0b12",
        "1.42.0": "91e7a33c5b898f33",
    },
    "flwr.supercore.superexec.run_superexec:_get_task_poll_interval": {
        "1.41.0": "032c4beb47964e73",
        "1.42.0": "032c4beb47964e73",
    },
    "flwr.supercore.superexec.executor.factory:get_executor": {
        "1.41.0": "891abfc53747803d",
        "1.42.0": "891abfc53747803d",
    },
    "flwr.supercore.superexec.executor.types:Executor": {
        "1.41.0": "c6d3173df690f03e",
        "1.42.0": "c6d3173df690f03e",
    },
    "flwr.supercore.superexec.executor.types:ExecutionSpec": {
        "1.41.0": "a52aad6399c9a5ec",
        "1.42.0": "a52aad6399c9a5ec",
    },
    "flwr.supernode.runtime.run_clientapp:run_clientapp": {
        "1.41.0": "6ce09559f3a2f5dc",
        "1.42.0": "6ce09559f3a2f5dc",
    },
    "flwr.supernode.cli.flwr_clientapp:flwr_clientapp": {
        "1.41.0": "9e02b412fb895b05",
        "1.42.0": "9e02b412fb895b05",
    },
    "flwr.cli.install:install_from_fab": {
        "1.41.0": "481bd04cde582322",
        "1.42.0": "481bd04cde582322",
    },
    "flwr.cli.install:validate_and_install": {
        "1.41.0": "628b69fb852ae858",
        "1.42.0": "628b69fb852ae858",
    },
    "flwr.supernode.runtime.run_clientapp:pull_task_input": {
        "1.41.0": "5607a23e1673ee87",
        "1.42.0": "5607a23e1673ee87",
    },
    "flwr.supercore.heartbeat:HeartbeatSender._run": {
        "1.41.0": "b176ff96c68dbee2",
        "1.42.0": "b176ff96c68dbee2",
    },
    "flwr.superlink.main:_get_middleware": {
        "1.41.0": "acdbc2dce1520f8f",
        "1.42.0": "911d5e2a5aaf11ec",
    },
    "flwr.superlink.routers.control.middlewares:ControlSensitiveResponseMiddleware": {
        "1.41.0": "25cca938600324c2",
        "1.42.0": "25cca938600324c2",
    },
    "flwr.superlink.routers.control.middlewares:ControlAuthenticationMiddleware": {
        "1.41.0": "1495e41d9bbbd25d",
        "1.42.0": "1495e41d9bbbd25d",
    },
    "flwr.superlink.routers.control.middlewares:ControlLicenseMiddleware": {
        "1.41.0": "0f57194171e921a3",
        "1.42.0": "0f57194171e921a3",
    },
    "flwr.superlink.routers.control.middlewares:ControlEventLogMiddleware": {
        "1.41.0": "d8db2d506ca7d0c5",
        "1.42.0": "d8db2d506ca7d0c5",
    },
    "flwr.superlink.routers.control.middlewares:_is_control_path": {
        "1.41.0": "bfb5469e9013b256",
        "1.42.0": "bfb5469e9013b256",
    },
    "flwr.superlink.routers.fleet.node_auth:NodeAuthMiddleware": {
        "1.41.0": "36b9ef8b482a1722",
        "1.42.0": "36b9ef8b482a1722",
    },
    "flwr.superlink.routers.fleet.middlewares:FleetEventLogMiddleware": {
        "1.41.0": "4466ecde96fb2315",
        "1.42.0": "4466ecde96fb2315",
    },
    "flwr.supercore.routers.runtime.tracing:RuntimeTracingMiddleware": {
        "1.41.0": "4f574b47f7f33cd8",
        "1.42.0": None,
    },
    "flwr.common.serde:recorddict_to_proto": {
        "1.41.0": "f1fcf5e8709af8a7",
        "1.42.0": "f1fcf5e8709af8a7",
    },
    "flwr.common.serde:recorddict_from_proto": {
        "1.41.0": "e77ea2318c034a71",
        "1.42.0": "e77ea2318c034a71",
    },
}


def flower_code(*names: str) -> dict[str, dict[str, str | None]]:
    """A change's ``FLOWER_CODE``: each of ``names`` with its fingerprint in each checked release."""
    return {name: FINGERPRINTS[name] for name in names}
