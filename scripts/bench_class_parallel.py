"""Class parallelism (sensAI) and its erasure-coded variant: acceptance S1-S4 and R1-R3 of issue 20.

- S1: test accuracy of the merged sub-networks for G in {2, 5, 10} against the unsplit baseline CNN.
- S2: each sub-network's MACs over the baseline's, against 1.5/G.
- S3: G = 2 single-input latency, two single-threaded worker processes, against the baseline served by
  one such process over the same pipes (``_classpar_latency.py``); in-process forward times beside it.
- S4: reply bytes per query (4 K) beside a 2-stage model-parallel split's activation bytes and latency.
- R1: (n, K) = (12, 10) systematic Cauchy code, every one of the C(12, 10) = 66 subsets of replies
  decoded in float64 from real sub-network scores: the largest relative error and argmax agreement.
- R2: seeded Monte Carlo of ``--queries`` queries; a worker takes weight x (10 w.p. 0.1 else 1) x
  (1 + 0.1 Exp(1)); median latency of 2 group parities (weight 5) over uncoded, 2x replication and the
  full-weight (12, 10) Cauchy code printed too.
- R3: G = 10 and G = 5 sub-networks, (G + 2, G) Cauchy code, 2 random stragglers per query: accuracy
  decoded from the first G replies against the no-straggler accuracy (must be equal); uncoded with the
  same stragglers printed as the baseline.

    PYTHONPATH=. python scripts/bench_class_parallel.py [--epochs 8] [--retrain-epochs 6] [--budget 1.5]
        [--widths 12,16,24,32] [--distill 0] [--json]

With ``--json`` the last line is one JSON object with ``acc_baseline``, ``acc_grouped`` (per G),
``latency_ratio_g2``, ``r1_max_rel_err``, ``r2_median_ratio``, ``r3_coded_equals_clean`` and the rest.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _classpar_latency import in_process_ms, measure
from _classpar_serve import serve_with_killed

from potluck.classpar import code, data, grouping, merge, model, subnet

GROUPS = (2, 5, 10)


def train(
    args: argparse.Namespace,
) -> tuple[dict[str, object], model.SmallCNN, dict[int, list[subnet.Subnet]]]:
    train_set, test_set = data.train_test(args.train_per_class, args.test_per_class, seed=args.seed)
    torch.manual_seed(args.seed)
    teacher = model.SmallCNN(args.widths)
    t0 = time.perf_counter()
    model.fit(teacher, train_set.x, train_set.y, epochs=args.epochs, seed=args.seed)
    base_macs = model.model_macs(teacher)
    acc_base = merge.accuracy(model.predict(teacher, test_set.x), test_set.y)
    print(
        f"baseline: {teacher.widths}, {base_macs} MACs, acc {acc_base:.4f} ({time.perf_counter() - t0:.1f} s)"
    )
    feats = model.mean_class_features(teacher, train_set.x, train_set.y, train_set.num_classes).numpy()
    out: dict[str, object] = {"acc_baseline": acc_base, "baseline_macs": base_macs}
    acc: dict[str, float] = {}
    ratio: dict[str, float] = {}
    subnets: dict[int, list[subnet.Subnet]] = {}
    for g in GROUPS:
        t0 = time.perf_counter()
        groups = grouping.even_kmeans(feats, g, seed=args.seed)
        budget = args.budget * base_macs / g
        subnets[g] = [
            subnet.build_subnet(
                teacher,
                train_set,
                grp,
                macs_budget=budget,
                epochs=args.retrain_epochs,
                lr=args.retrain_lr,
                distill=args.distill,
                seed=i,
            )
            for i, grp in enumerate(groups)
        ]
        acc[str(g)] = merge.accuracy(merge.grouped_scores(subnets[g], test_set.x), test_set.y)
        ratio[str(g)] = max(s.macs for s in subnets[g]) / base_macs
        ok1 = acc[str(g)] >= acc_base - 0.015
        ok2 = ratio[str(g)] <= 1.5 / g
        print(
            f"G={g:2d} groups {groups}: acc {acc[str(g)]:.4f} (S1 {'ok' if ok1 else 'MISS'}), "
            f"max subnet MACs {ratio[str(g)]:.3f} x baseline vs 1.5/G={1.5 / g:.3f} "
            f"(S2 {'ok' if ok2 else 'MISS'}) "
            f"({time.perf_counter() - t0:.1f} s)"
        )
    out |= {"acc_grouped": acc, "subnet_macs_ratio": ratio}
    out["test"] = test_set
    return out, teacher, subnets


def latency(teacher: model.SmallCNN, subs: list[subnet.Subnet], x: torch.Tensor, k: int) -> dict[str, float]:
    res = measure(teacher, [s.model for s in subs], x)
    res["baseline_forward_ms"] = in_process_ms(teacher, x, 200)
    res["subnet_forward_ms"] = max(in_process_ms(s.model, x, 200) for s in subs)
    ratio = res["class_parallel_ms"] / res["baseline_ms"]
    # with one free core per worker the query would take the slowest sub-network's forward plus the same
    # pipe round trip the baseline pays: an estimate, printed beside the measurement, never instead of it
    ipc = res["baseline_ms"] - res["baseline_forward_ms"]
    res["latency_ratio_g2_free_cores_est"] = (res["subnet_forward_ms"] + ipc) / res["baseline_ms"]
    print(
        f"S3 G=2 latency: {res['class_parallel_ms']:.3f} ms vs baseline {res['baseline_ms']:.3f} ms "
        f"= {ratio:.3f}x "
        f"(target <= 0.75: {'ok' if ratio <= 0.75 else 'MISS'}); in-process forward "
        f"{res['subnet_forward_ms']:.3f} vs {res['baseline_forward_ms']:.3f} ms, "
        f"so {res['latency_ratio_g2_free_cores_est']:.3f}x estimated with a free core per worker"
    )
    print(
        f"S4 bytes/query: class parallel {res['class_parallel_reply_bytes']:.0f} B (4K = {4 * k}); "
        f"2-stage split {res['split_activation_bytes']:.0f} B activation + {res['split_reply_bytes']:.0f} B, "
        f"{res['split_ms']:.3f} ms"
    )
    return res | {"latency_ratio_g2": ratio}


def latency_only(args: argparse.Namespace) -> dict[str, float]:
    """S3 alone at ``--widths``: untrained weights (latency does not depend on them), each of the two
    sub-networks the baseline with every width scaled so that its MACs are 1/2 of the baseline's."""
    torch.manual_seed(args.seed)
    teacher = model.SmallCNN(args.widths, 10).eval()
    base = model.model_macs(teacher)
    scale = 1.0
    while model.macs([max(2, round(w * scale)) for w in args.widths], 6) > base / 2:
        scale -= 0.01
    widths = [max(2, round(w * scale)) for w in args.widths]
    half = subnet.Subnet(model.SmallCNN(widths, 6).eval(), [0, 1, 2, 3, 4], model.macs(widths, 6))
    print(f"S3 only: baseline {args.widths} {base} MACs, sub-networks {widths} ({half.macs / base:.2f}x)")
    x = torch.randn(1, 1, data.SIDE, data.SIDE)
    return latency(teacher, [half, half], x, 10)


def unit_scores(subs: list[subnet.Subnet], x: torch.Tensor) -> np.ndarray:
    """(G, N, |g|) scores: what each systematic worker sends (float32, widened exactly)."""
    return np.stack([merge.group_scores(s, x).numpy().astype(np.float64) for s in subs])


def r1(scores: np.ndarray) -> dict[str, float]:
    c = code.systematic_cauchy(10, 2)
    replies = c.encode(scores)
    worst, agree = 0.0, True
    for rows in itertools.combinations(range(c.n), c.k):
        dec = c.decode(list(rows), replies[list(rows)])
        worst = max(worst, float(np.abs(dec - scores).max() / np.abs(scores).max()))
        agree &= bool((dec[:, :, 0].argmax(axis=0) == scores[:, :, 0].argmax(axis=0)).all())
    print(
        f"R1 (12,10) Cauchy, all 66 subsets on {scores.shape[1]} queries: "
        f"max rel err {worst:.2e}, argmax {agree}"
    )
    return {"r1_max_rel_err": worst, "r1_argmax_match": agree}


def r2(queries: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)

    def times(weights: np.ndarray) -> np.ndarray:
        slow = np.where(rng.random((queries, len(weights))) < 0.1, 10.0, 1.0)
        return weights * slow * (1.0 + 0.1 * rng.exponential(1.0, (queries, len(weights))))

    uncoded = times(np.ones(10)).max(axis=1)
    group = times(np.array([1.0] * 10 + [5.0, 5.0]))  # a group's 5 units + its parity: any 5 of 6
    grouped = np.maximum(
        np.sort(group[:, [0, 1, 2, 3, 4, 10]], axis=1)[:, 4],
        np.sort(group[:, [5, 6, 7, 8, 9, 11]], axis=1)[:, 4],
    )
    mds = np.sort(times(np.array([1.0] * 10 + [10.0, 10.0])), axis=1)[:, 9]  # any 10 of 12
    rep = times(np.ones(20))
    replicated = np.minimum(rep[:, :10], rep[:, 10:]).max(axis=1)
    med = {name: float(np.median(v)) for name, v in [("uncoded", uncoded), ("group", grouped), ("mds", mds)]}
    med["replication"] = float(np.median(replicated))
    ratio = med["group"] / med["uncoded"]
    print(
        f"R2 median latency ({queries} queries): uncoded {med['uncoded']:.2f}, 2 group parities (+20%) "
        f"{med['group']:.2f} = {ratio:.3f}x (target <= 0.6: {'ok' if ratio <= 0.6 else 'MISS'}), "
        f"(12,10) Cauchy (+20%, weight 10) {med['mds']:.2f}, "
        f"2x replication (+100%) {med['replication']:.2f}; "
        f"p99 uncoded {np.percentile(uncoded, 99):.2f} coded {np.percentile(grouped, 99):.2f}"
    )
    return {"r2_median_ratio": ratio} | {f"r2_median_{k}": v for k, v in med.items()}


def r3(subs: list[subnet.Subnet], test: data.ImageSet, r: int, seed: int) -> tuple[bool, float, float, float]:
    groups = [s.group for s in subs]
    scores = unit_scores(subs, test.x)  # (G, N, |g|)
    c = code.systematic_cauchy(len(subs), r)
    replies = c.encode(scores)  # parity workers send float64
    rng = np.random.default_rng(seed)
    clean = merge.merge_scores([torch.from_numpy(s) for s in scores], groups).argmax(dim=1)
    coded = torch.empty_like(clean)
    uncoded = torch.empty_like(clean)
    for q in range(len(test)):
        arrival = rng.permutation(c.n)[: c.n - r]  # r stragglers never answer in time
        dec = c.decode(list(arrival), replies[arrival, q])
        coded[q] = merge.merge_scores([torch.from_numpy(d[None]) for d in dec], groups).argmax(dim=1)[0]
        missing = [torch.from_numpy(scores[u, q][None]) for u in range(len(subs))]
        for u in set(range(len(subs))) - set(arrival.tolist()):
            missing[u] = torch.full_like(missing[u], -1.0)  # a missing group scores below any softmax
        uncoded[q] = merge.merge_scores(missing, groups).argmax(dim=1)[0]
    acc = [float((p == test.y).double().mean()) for p in (clean, coded, uncoded)]
    return bool(torch.equal(clean, coded)), acc[0], acc[1], acc[2]


def serve(subs: list[subnet.Subnet], test: data.ImageSet, queries: int) -> dict[str, object]:
    """G = 5 sub-networks behind a (7, 5) Cauchy code on 7 worker processes, worker 0 killed."""
    x = test.x[:queries]
    clean = merge.grouped_scores(subs, x).argmax(dim=1).tolist()
    got = serve_with_killed(code.systematic_cauchy(len(subs), 2), subs, x, kill=0)
    same = got["serve_alive_preds"] == clean and got["serve_killed_preds"] == clean
    print(
        f"serve: {queries} queries over 7 worker processes, (7,5) Cauchy: {got['serve_alive_ms']:.2f} ms "
        f"median all alive, {got['serve_killed_ms']:.2f} ms with worker 0 killed; answers equal the "
        f"in-process ones: {same}"
    )
    return {"serve_killed_equals_clean": same, "serve_alive_ms": got["serve_alive_ms"]} | {
        "serve_killed_ms": got["serve_killed_ms"]
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=8, help="baseline training epochs")
    parser.add_argument("--retrain-epochs", type=int, default=6, help="sub-network retraining epochs")
    parser.add_argument("--retrain-lr", type=float, default=3e-3, help="sub-network Adam learning rate")
    parser.add_argument("--distill", type=float, default=0.0, help="weight of the teacher's soft targets")
    parser.add_argument(
        "--widths",
        type=lambda s: tuple(int(w) for w in s.split(",")),
        default=model.DEFAULT_WIDTHS,
        help="baseline conv widths, e.g. 32,64,96,128 (compute-bound: see docs/class-parallel.md)",
    )
    parser.add_argument("--budget", type=float, default=1.5, help="subnet MACs cap, x baseline / G")
    parser.add_argument("--train-per-class", type=int, default=300)
    parser.add_argument("--test-per-class", type=int, default=200)
    parser.add_argument("--queries", type=int, default=200_000, help="R2 Monte Carlo queries")
    parser.add_argument("--serve-queries", type=int, default=300, help="queries served with a worker killed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--latency-only", action="store_true", help="S3 and S4 alone at --widths, untrained")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    if args.latency_only:
        only = latency_only(args)
        if args.json:
            print(json.dumps(only, sort_keys=True))
        return
    res, teacher, subnets = train(args)
    test = res.pop("test")
    assert isinstance(test, data.ImageSet)
    res |= latency(teacher, subnets[2], test.x[:1], test.num_classes)
    res |= r1(unit_scores(subnets[10], test.x[:200]))
    res |= r2(args.queries, args.seed)
    equal = True
    for g in (10, 5):
        same, clean, coded, uncoded = r3(subnets[g], test, 2, args.seed)
        equal &= same and clean == coded
        print(
            f"R3 G={g}, 2 stragglers/query: coded acc {coded:.4f}, clean {clean:.4f} "
            f"(equal: {same}), uncoded {uncoded:.4f}"
        )
        res |= {f"r3_acc_clean_g{g}": clean, f"r3_acc_coded_g{g}": coded, f"r3_acc_uncoded_g{g}": uncoded}
    res["r3_coded_equals_clean"] = equal
    res |= serve(subnets[5], test, args.serve_queries)
    res["wall_s"] = time.perf_counter() - start
    print(f"total {res['wall_s']:.1f} s")
    if args.json:
        print(json.dumps(res, sort_keys=True))


if __name__ == "__main__":
    main()
