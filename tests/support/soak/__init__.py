"""The soak harness (bench/soak.py, `make soak`): the production-like stack under mixed,
continuous load on every door while faults are injected at random, from a seed.

- `stack.py`: a private PostgreSQL cluster, the deployment's processes (topology.py),
  HAProxy in front of the Daphnes, a relay between the Daphnes and Redis that can stall
  or refuse (`relay.py`);
  `settings.py` and `retention.py`: what the stack runs with that the tests' does not;
- `plan.py`: what each call is (small or heavy, when it is cancelled, its timeout);
- `ledger.py`: every call on every door, its frames and its answers, on one clock;
- `doors/`: one driver per door (ABP, JSON-RPC, MCP on both wires, the Python client,
  a headless browser page through the embed bridge); `load.py` runs them all;
- `faults.py`: the fault schedule and the injector;
- `rows.py`: the job rows, read continuously (lost, duplicated, past their deadline);
- `invariants.py`: what must hold, checked on the ledger and the rows;
- `memory.py`: RSS samples and their slope per 1,000 calls;
- `report.py`: the Jepsen-like report, as text and JSON;
- `run.py`: one soak on a running stack; `main.py`: the stack up, the soak, the stack
  down, the report.
"""
