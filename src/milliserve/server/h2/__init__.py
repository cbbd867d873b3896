"""milliserve's HTTP/2 transport (RFC 9113, cleartext, server side), under the gRPC layer.

- ``frames``: wire constants, a frame's bytes, the errors that end a connection;
- ``stream``: one request stream, and the layer above as the connection sees it;
- ``streams``: a connection's streams: opened, refused, fed DATA, reset, closed;
- ``header_blocks``: HEADERS and CONTINUATION into decoded header lists;
- ``hpack_codec``, ``hpack_tables``: HPACK (RFC 7541), bounded while it decodes;
- ``flow``: receive windows: the connection's, and those granted per message, within
  per-connection and listener budgets;
- ``peer_settings``: the SETTINGS exchange;
- ``pings``: the client's pings (with strikes) and the server's keepalive;
- ``answers``: answers written as the client's windows allow;
- ``limits``: what a connection may hold, rates of control frames, what was stopped;
- ``turns``: how much of the event loop the connections of a listener take per turn;
- ``h2_connection``: one client connection (``Http2Protocol``), holding the parts above.

It knows nothing of gRPC or models: ``server/grpc/calls.py`` sees a ``Stream`` per request.
"""
