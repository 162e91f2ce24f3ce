"""The stages a codec chains (``int4:block=64|zstd``): ``base`` holds the stage kinds and their shared
section readers; each other module implements one family (cast, quantize, signmag, sparsify, lowrank,
lossless). ``registry.STAGES`` maps spec names to these classes."""
