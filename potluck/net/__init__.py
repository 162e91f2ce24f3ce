"""The hivemind runtime of both processes: the DHT node, read-only swarm access, the tagged mailbox, link
probes. The only package that talks to p2pd.
"""
