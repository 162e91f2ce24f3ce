"""What tests and benchmarks share to start swarms on fake networks: in-process groups of real p2pd
daemons (``p2p``), a trained swarm of trainers in one process (``training``), hostile stand-ins for
trust tests and benchmarks (``hostile``), job files (``jobs``), a job started through the CLI with
undialable addresses (``starts``), and the tick-tock reference problem (``ticktock``). Real potluck code
throughout; only the network is fake. Scripts import the library only, this room included."""
