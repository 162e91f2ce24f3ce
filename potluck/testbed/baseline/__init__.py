"""The hivemind baseline of issue 15's headline benchmark: one ``hivemind.Optimizer`` peer per process,
training potluck's own job in pure data parallel (``scripts/wan_hivemind.py`` runs one peer,
``scripts/wan_hivemind_local.py`` a loopback swarm, ``scripts/bench_wan.py`` one in the emulated WAN).

Every peer trains the demo job (``testbed/demojob.py``) unless ``--job FILE`` names another: the WHOLE
model in its process, hivemind 1.1.12 averaging gradients. What is matched, and where it comes from:

- model: ``potluck.model.transformer.StageModel(spec, 0, n_layers, job.seed)``, the same per-layer
  seeded init as every potluck stage and the single-process reference (``potluck/model/reference.py``);
- data: ``potluck.model.data.load_dataset(job.data, ...)`` (the generated corpus, byte tokenizer); peer
  r of N takes sequences r, r + N, r + 2N, ... of the stream, which is ``TokenDataset.replica_batch``'s
  rule (replica r of R takes every R-th sequence of the global stream starting at r): disjoint across
  peers, and exactly ``replica_batch(step, r, N, P)`` while peers keep pace and N divides P;
- batch: an optimizer epoch averages ``target_batch_size = job.sequences_per_step`` sequences (the
  potluck job's global batch, 32 x 64 tokens for the demo job); each ``opt.step`` call brings one
  micro-batch (``job.batch.micro_batch_size`` sequences, 4) and its mean-token loss, as a potluck
  micro-batch; hivemind weights each call and each peer by its sample count, so the averaged gradient
  is the gradient of the global batch's mean loss, as in potluck's step;
- optimizer: ``potluck.model.optim.build_optimizer`` (AdamW, betas, eps, weight decay on matrices only,
  foreach=False), clipped by ``clip_coefficient`` on the averaged gradient's global norm, learning rate
  ``learning_rate(spec, epoch, total_epochs)`` (warm-up then cosine) as a hivemind scheduler, which
  hivemind steps once per epoch: epoch e runs at potluck's rate of step e. AdamW's state is created
  the way AdamW creates it (zeros, step 0), so hivemind skips its "virtual step" (a zero-gradient
  AdamW step at the full learning rate: weight decay applied once and Adam's bias correction shifted).

hivemind settings (``settings.HivemindSettings`` says why each value was chosen): gradient averaging,
not ``use_local_updates`` (which is local SGD plus parameter averaging, another algorithm than
potluck's synchronous step); ``target_group_size`` = N; matchmaking 2 s (the smallest value that
passes hivemind's own tuning rule on loopback) and averaging timeout 60 s (hivemind's internet example,
examples/albert); parameters averaged every epoch (hivemind's default); fp16 (``Float16Compression``)
or 8-bit (``SizeAdaptiveCompression``: ``Uniform8BitQuantization`` for tensors of at least
``--q8-threshold`` elements, fp16 below) on gradients and parameters alike.

Modules: ``settings`` (hivemind's options, light), ``peer`` (the p2p daemon, DHT barrier, hivemind's log
events, bounded shutdown), ``training`` (data shard, optimizer and schedule factories, the epoch loop and
its records), ``wire`` (bytes on the wire), ``worker`` (one peer's process: ``python -m
potluck.testbed.baseline.worker``), ``summary`` (the swarm's figures from every peer's records) and
``local`` (N workers on loopback).
"""
