"""The data order: global, world-size invariant, resumable mid-epoch.

sampler.py        ``ElasticDistributedSampler`` (training) and ``ShardedEvalSampler`` (evaluation)
checkpoint.py     the train sampler's state in checkpoints
partner_pools.py  where mosaic and mixup partners are drawn from (``mosaic_partners``)
seeds.py          per-sample random streams and substitutes, functions of (seed, epoch, index)
"""
