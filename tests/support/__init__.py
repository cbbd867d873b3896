"""What milliserve's own test suite shares beyond ``milliserve.testing`` (the public
helpers): probes of the suite's models (``probes``), a transport to drive a protocol
in-process (``transport``) and the browser the edge tests and
benchmarks/edge.py load pages in (``browser``). Not installed with the package."""
