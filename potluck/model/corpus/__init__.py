"""A job's text corpus shipped over the swarm: read once on the job owner's machine, tokenized, shuffled
by document, cut into content-addressed token shards (``build``), described by a manifest whose
SHA-256 the signed job carries (``manifest``), and read by each peer from a memory-mapped file that
fills as it fetches the shards it needs (``tokens``). The fetching itself is the peer's
(``peer/feed.py``), over ``transfer/blobs.py``."""
