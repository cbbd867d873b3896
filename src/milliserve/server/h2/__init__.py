"""milliserve's HTTP/2 transport (RFC 9113, cleartext, server side), under the gRPC layer.

- ``frames``: wire constants, a frame's bytes, the errors that end a connection;
- ``stream``: one request stream, and the layer above as the connection sees it;
- ``header_blocks``: HEADERS and CONTINUATION into decoded header lists;
- ``hpack_codec``, ``hpack_tables``: HPACK (RFC 7541), bounded while it decodes;
- ``flow``: receive windows granted per message, within per-connection and listener budgets;
- ``answers``: answers written as the client's windows allow;
- ``limits``: what a connection may hold, rates of control frames, what was stopped;
- ``turns``: how much of the event loop the connections of a listener take per turn;
- ``h2_connection``: one client connection (``Http2Protocol``), holding the parts above.

It knows nothing of gRPC or models: ``server/grpc/calls.py`` sees a ``Stream`` per request.
"""
