"""Search over placements: evaluation, local search on the true objective, and a genetic algorithm.

A candidate is a balanced partition of the active devices into S stage groups of R (plus spares). Its
value needs the pipelines (bottleneck matching between consecutive groups) and the stage order (open
path TSP over the matched-link matrix); `evaluate` computes both. Local search swaps two devices of
different groups, or a device with a spare, and scores the move on the true objective with the stage
order held fixed: only two group summaries and at most four matched links change. The order is
re-optimised after every pass. The genetic algorithm recombines partitions after aligning their group
labels (so "group 3" means the same thing in both parents) and polishes every child by local search.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

from potluck.coordinator.placement.objectives import Objective
from potluck.coordinator.placement.tsp import EXACT_LIMIT, open_path

_REL_EPS = 1e-9  # a move must improve by more than this fraction to count
# Inside the search, orders are exact up to this many stages (Held-Karp at 16 costs ~25 ms per call);
# the planner re-orders the final answer exactly up to tsp.EXACT_LIMIT.
SEARCH_EXACT_LIMIT = 10


@dataclass
class Candidate:
    groups: np.ndarray  # S x R device ids; row g is a stage group (unordered)
    spares: np.ndarray  # device ids left out
    stats: list[Any]  # objective.group_stat per group
    order: list[int]  # stage order: order[j] is the group at stage j
    edges: np.ndarray  # matched link time between order[j] and order[j+1]
    cost: float

    def key(self) -> tuple[tuple[int, ...], ...]:
        """Canonical form of the partition (for duplicate detection)."""
        return tuple(sorted(tuple(sorted(int(x) for x in g)) for g in self.groups))


def pair_matrix(obj: Objective, groups: np.ndarray) -> np.ndarray:
    s = groups.shape[0]
    pair = np.zeros((s, s))
    for a in range(s):
        for b in range(a + 1, s):
            pair[a, b] = pair[b, a] = obj.boundary(groups[a], groups[b])[0]
    return pair


def evaluate(
    obj: Objective, groups: np.ndarray, spares: np.ndarray, exact_limit: int = EXACT_LIMIT
) -> Candidate:
    """Full evaluation: group summaries, all matched links, best stage order (both directions tried).

    The order is exact (Held-Karp) up to `exact_limit` stages; screening passes a small limit.
    """
    groups = np.asarray(groups, dtype=np.int64)
    stats = [obj.group_stat(g) for g in groups]
    pair = pair_matrix(obj, groups)
    _, order = open_path(pair, exact_limit)
    best: Candidate | None = None
    for path in (order, order[::-1]):
        edges = np.array([pair[path[k], path[k + 1]] for k in range(len(path) - 1)])
        cost = obj.combine([stats[o] for o in path], edges)
        if best is None or cost < best.cost:
            best = Candidate(
                groups.copy(), np.asarray(spares, dtype=np.int64).copy(), stats, list(path), edges, cost
            )
    assert best is not None
    return best


def evaluate_in_order(obj: Objective, groups: np.ndarray, spares: np.ndarray) -> Candidate:
    """Evaluation that keeps row j of `groups` at stage j (re-planning must not reshuffle stages)."""
    groups = np.asarray(groups, dtype=np.int64)
    stats = [obj.group_stat(g) for g in groups]
    edges = np.array([obj.boundary(groups[k], groups[k + 1])[0] for k in range(len(groups) - 1)])
    cost = obj.combine(stats, edges)
    return Candidate(
        groups.copy(), np.asarray(spares, dtype=np.int64).copy(), stats, list(range(len(groups))), edges, cost
    )


def pipelines(obj: Objective, cand: Candidate) -> np.ndarray:
    """stages[j][i]: device at stage j of pipeline i, following bottleneck matchings along the order."""
    rows = [cand.groups[cand.order[0]].copy()]
    for j in range(1, len(cand.order)):
        nxt = cand.groups[cand.order[j]]
        _, col_of_row = obj.boundary(rows[-1], nxt)
        rows.append(nxt[np.asarray(col_of_row)])
    return np.stack(rows)


def _affected_edges(position: int, s: int) -> list[int]:
    return [k for k in (position - 1, position) if 0 <= k < s - 1]


def try_move(
    obj: Objective,
    cand: Candidate,
    where: np.ndarray,
    a_g: int,
    a_i: int,
    b_g: int,
    b_i: int,
    cutoff: float = np.inf,
) -> tuple[float, np.ndarray, np.ndarray | None, list[Any], np.ndarray]:
    """Cost after swapping groups[a_g][a_i] with groups[b_g][b_i] (b_g < 0: with spares[b_i]).

    `where[g]` is group g's position in the stage order. Returns (cost, new A, new B, stats, edges).
    With a finite `cutoff` and an objective monotone in its links, a move whose cheap lower bound
    (each changed link at least its row/column-minimum bound) already reaches `cutoff` returns inf
    without solving the matchings.
    """
    new_a = cand.groups[a_g].copy()
    u = new_a[a_i]
    new_b: np.ndarray | None = None
    stats = list(cand.stats)
    if b_g >= 0:
        new_b = cand.groups[b_g].copy()
        new_a[a_i], new_b[b_i] = new_b[b_i], u
        stats[b_g] = obj.group_stat(new_b)
    else:
        new_a[a_i] = cand.spares[b_i]
    stats[a_g] = obj.group_stat(new_a)
    s = len(cand.order)
    touched = set(_affected_edges(int(where[a_g]), s))
    if b_g >= 0:
        touched.update(_affected_edges(int(where[b_g]), s))
    edges = cand.edges.copy()

    def members(g: int) -> np.ndarray:
        if g == a_g:
            return new_a
        if g == b_g and new_b is not None:
            return new_b
        return cand.groups[g]

    blocks = {k: (members(cand.order[k]), members(cand.order[k + 1])) for k in touched}
    ordered = [stats[o] for o in cand.order]
    if np.isfinite(cutoff) and obj.monotone_in_links:
        for k, (ga, gb) in blocks.items():
            edges[k] = obj.boundary_floor(ga, gb)
        if obj.combine(ordered, edges) >= cutoff:
            return np.inf, new_a, new_b, stats, edges
    for k, (ga, gb) in blocks.items():
        edges[k] = obj.boundary(ga, gb)[0]
    cost = obj.combine(ordered, edges)
    return cost, new_a, new_b, stats, edges


def _moves(
    obj: Objective, cand: Candidate, rng: np.random.Generator, limit: int
) -> list[tuple[int, int, int, int]]:
    s, r = cand.groups.shape
    n_sp = len(cand.spares)
    total = s * r * (s - 1) * r // 2 + s * r * n_sp
    if total <= limit:
        moves: list[tuple[int, int, int, int]] = [
            (a, i, b, k) for a in range(s) for b in range(a + 1, s) for i in range(r) for k in range(r)
        ]
        moves += [(a, i, -1, k) for a in range(s) for i in range(r) for k in range(n_sp)]
        return [moves[x] for x in rng.permutation(len(moves))]
    # Too many: aim at the groups that hurt most and the slowest links, pair each with random others.
    worst = np.argsort([-obj.badness(st) for st in cand.stats])[:2].tolist()
    k_edge = int(np.argmax(cand.edges)) if len(cand.edges) else 0
    worst += [cand.order[k_edge], cand.order[min(k_edge + 1, s - 1)]]
    critical = sorted(set(worst))
    per = max(1, limit // (len(critical) * r))
    moves = []
    for a in critical:
        for i in range(r):
            for _ in range(per):
                b = int(rng.integers(-1 if n_sp else 0, s))
                if b == a:
                    continue
                k = int(rng.integers(0, n_sp if b < 0 else r))
                moves.append((a, i, b, k))
    return moves


def local_search(
    obj: Objective,
    cand: Candidate,
    rng: np.random.Generator,
    deadline: float,
    max_passes: int = 50,
    move_limit: int = 4000,
    reorder: bool = True,
    counter: list[int] | None = None,
) -> Candidate:
    """First-improvement swap descent on the true objective; order re-optimised after each pass.

    `counter[0]` (if given) accumulates the number of moves scored: a deterministic measure of work.
    """
    for _ in range(max_passes):
        improved = False
        where = np.empty(len(cand.order), dtype=np.int64)
        where[np.asarray(cand.order)] = np.arange(len(cand.order))
        for count, (a_g, a_i, b_g, b_i) in enumerate(_moves(obj, cand, rng, move_limit)):
            if count % 64 == 0 and time.monotonic() > deadline:
                break
            if counter is not None:
                counter[0] += 1
            cutoff = cand.cost * (1 - _REL_EPS)
            cost, new_a, new_b, stats, edges = try_move(obj, cand, where, a_g, a_i, b_g, b_i, cutoff)
            if cost < cutoff:
                if b_g < 0:
                    cand.spares[b_i] = cand.groups[a_g][a_i]
                cand.groups[a_g] = new_a
                if new_b is not None:
                    cand.groups[b_g] = new_b
                cand.stats, cand.edges, cand.cost = stats, edges, cost
                improved = True
        if reorder:
            refreshed = evaluate(obj, cand.groups, cand.spares, SEARCH_EXACT_LIMIT)
            if refreshed.cost <= cand.cost:
                cand = refreshed
        if not improved or time.monotonic() > deadline:
            break
    return cand


def random_partition(active: np.ndarray, s: int, r: int, rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(active)[: s * r].reshape(s, r)


def crossover(p1: Candidate, p2: Candidate, rng: np.random.Generator) -> np.ndarray:
    """Child partition: half of p1's groups kept whole, the rest from p2's label-aligned groups."""
    s, r = p1.groups.shape
    sets1 = [set(g.tolist()) for g in p1.groups]
    sets2 = [set(g.tolist()) for g in p2.groups]
    overlap = np.array([[len(a & b) for b in sets2] for a in sets1])
    _, match = linear_sum_assignment(-overlap)  # p2's group match[a] plays p1's group a
    keep: np.ndarray = np.asarray(rng.random(s) < 0.5)
    child: list[list[int]] = [[] for _ in range(s)]
    used: set[int] = set()
    for a in range(s):
        if keep[a]:
            child[a] = sorted(sets1[a])
            used |= sets1[a]
    for a in range(s):
        if not keep[a]:
            child[a] = [x for x in sorted(sets2[int(match[a])]) if x not in used]
            used |= set(child[a])
    active = np.concatenate([p1.groups.ravel(), p1.spares])
    free = [int(x) for x in rng.permutation(active) if int(x) not in used]
    # Fill short groups, preferring devices that p1 had in that group (keeps good blocks together).
    label1 = {int(x): a for a, g in enumerate(p1.groups) for x in g}
    for a in range(s):
        need = r - len(child[a])
        if need <= 0:
            continue
        pick = [x for x in free if label1.get(x) == a][:need]
        pick += [x for x in free if x not in pick][: need - len(pick)]
        child[a] += pick
        free = [x for x in free if x not in pick]
    return np.array(child, dtype=np.int64)


def mutate(groups: np.ndarray, rng: np.random.Generator, swaps: int) -> np.ndarray:
    out = groups.copy()
    s, r = out.shape
    if s < 2:
        return out  # one stage group: swaps inside it change nothing
    for _ in range(swaps):
        a, b = rng.choice(s, size=2, replace=False)
        i, k = rng.integers(0, r, size=2)
        out[a, i], out[b, k] = out[b, k], out[a, i]
    return out


@dataclass(frozen=True)
class GaConfig:
    population: int = 12
    generations: int = 1000
    patience: int = 15  # generations without a new best before giving up ...
    patience_moves: int = 20_000  # ... and at least this many scored moves (small instances: more gens)
    mutation_swaps: int = 2
    ls_passes: int = 2
    move_limit: int = 800


def genetic_search(
    obj: Objective,
    seeds: list[Candidate],
    rng: np.random.Generator,
    deadline: float,
    cfg: GaConfig,
    target: float = 0.0,
) -> tuple[Candidate, int, float]:
    """Steady-state GA seeded with `seeds`; returns (best candidate, generations run, when it was found).

    Stops at the deadline, after `cfg.patience` generations without a new best, or on reaching
    `target` (a lower bound: nothing better exists).
    """
    s, r = obj.n_stages, obj.n_replicas
    pool = np.sort(np.concatenate([seeds[0].groups.ravel(), seeds[0].spares]))
    pop = sorted(seeds, key=lambda c: c.cost)[: cfg.population]
    seen = {c.key() for c in pop}
    # Fill the population with perturbed seeds (short descents) and a few random partitions (diversity).
    tries = 0
    while len(pop) < cfg.population and time.monotonic() < deadline and tries < 4 * cfg.population:
        tries += 1
        if tries % 4 == 0 or not seeds:
            groups = random_partition(pool, s, r, rng)
        else:
            base = seeds[tries % len(seeds)].groups
            groups = mutate(base, rng, 1 + tries % max(2, r))
        cand = evaluate(obj, groups, np.setdiff1d(pool, groups), SEARCH_EXACT_LIMIT)
        cand = local_search(obj, cand, rng, deadline, cfg.ls_passes, cfg.move_limit)
        if cand.key() not in seen:
            pop.append(cand)
            seen.add(cand.key())
    gens = 0
    work = [0]
    work_at_best = 0
    found_at = time.monotonic()
    best_cost = min(c.cost for c in pop) if pop else np.inf
    stale = 0
    for _gen in range(cfg.generations):
        if time.monotonic() > deadline or len(pop) < 2:
            break
        if stale >= cfg.patience and work[0] - work_at_best >= cfg.patience_moves:
            break
        if best_cost <= target * (1 + 1e-9):
            break
        gens += 1
        stale += 1
        pop.sort(key=lambda c: c.cost)
        # Tournament of two for each parent: pressure toward good parents without losing diversity.
        picks = [min(rng.choice(len(pop), size=2, replace=False)) for _ in range(2)]
        if picks[0] == picks[1]:
            picks[1] = (picks[1] + 1) % len(pop)
        child_groups = mutate(crossover(pop[picks[0]], pop[picks[1]], rng), rng, cfg.mutation_swaps)
        child = evaluate(obj, child_groups, np.setdiff1d(pool, child_groups), SEARCH_EXACT_LIMIT)
        child = local_search(obj, child, rng, deadline, cfg.ls_passes, cfg.move_limit, counter=work)
        if child.key() in seen:
            continue
        seen.add(child.key())
        if child.cost < pop[-1].cost:
            pop[-1] = child
        if child.cost < best_cost * (1 - 1e-9):
            best_cost, stale, found_at, work_at_best = child.cost, 0, time.monotonic(), work[0]
    pop.sort(key=lambda c: c.cost)
    return pop[0], gens, found_at
