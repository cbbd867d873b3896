"""Attacks and drills against a running server, and what they cost its good clients: a
product of its own beside the load generator (``milliserve.bench``).

- ``attack_runner``: a catalogue entry, its result, and the one loop that runs every
  catalogue with the good clients calling from another process (``bystanders``), each
  attack's window closed by one rule (``window_closed``);
- ``target``: the server attacked; ``generation_wire``: a generation server's requests;
- ``tensor_attacks``, ``h2_attacks``, ``llm_attacks``: the catalogues (tensor inputs,
  HTTP/2 frames, generation requests);
- ``stop_drills``: clients in a closed loop while the server stops or a worker is killed;
- ``cache_drill``: a Redis response cache under load and a busy neighbour;
- ``process_probe``: a server's CPU and memory from /proc, and when it is quiet again.

Used by ``tests/e2e`` (assertions) and ``benchmarks/attack_suite.py`` (figures).
"""
