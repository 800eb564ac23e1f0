"""A broker per test run: ``serve()`` and the pytest plugin (fixtures ``oncebus_server``, ``oncebus_namespace``).

::

    from oncebus.testing import serve

    with serve() as server:                      # or: async with serve() as server
        server.create_queue("orders", requires_duplicate_detection=True)
        ...  # ServiceBusClient.from_connection_string(server.connection_string)
        server.stats("orders")["duplicates_dropped"]
        server.advance(timedelta(minutes=11))   # past the 10-minute window, without sleeping
        server.arm_fault("lost-ack", "orders")   # the next send is stored, its acknowledgement lost
        server.crash()                           # SIGKILL, then serve again on the same data and port
        ns = server.create_namespace()           # isolated: its own entities, dedup keys and clock
        ns.connection_string                     # the broker's, SharedAccessKeyName=RootManageSharedAccessKey@<ns>

``serve()`` starts ``oncebus serve --port 0`` on a temporary data directory, in a
subprocess (default) or in a thread of this process (``mode="thread"``), and stops
it and removes what it created on exit. The pytest plugin (installed with the
package) gives each test a fresh namespace on one broker per session (per xdist
worker); see :mod:`oncebus.testing.plugin`.
"""

from __future__ import annotations

from oncebus.testing._client import BrokerGoneError
from oncebus.testing._namespaces import IsolatedNamespace
from oncebus.testing._server import MODES, BrokerStartError, Mode, OncebusServer, serve

__all__ = ["MODES", "BrokerGoneError", "BrokerStartError", "IsolatedNamespace", "Mode", "OncebusServer", "serve"]
