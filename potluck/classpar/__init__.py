"""Class parallelism: sensAI sub-networks (one per class group) and erasure-coded serving.

A K-class CNN is split into G sub-networks that never talk to each other (Wang et al., MLSys 2021):
classes are grouped by even k-means on the teacher's mean penultimate features (``grouping``), each
group's copy of the teacher is pruned by APoZ on that group's images (``prune``) and retrained as a
(|g|+1)-way classifier, 0 meaning "not my group" (``subnet``); a query fans out and the |g| scores of
each group are merged back into class order (``merge``). ``code`` adds a systematic Cauchy erasure code
(robust class parallelism, Yang et al. 2020): any K of n = K + r coded replies decode the scores.

Pure and single-machine: no networking, nothing from ``peer`` or ``coordinator``. See
docs/class-parallel.md.
"""

from __future__ import annotations
