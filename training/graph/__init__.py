"""The training graph's machinery beyond the model: the learning rate, where
the variables live, mixed precision, SyncReplicasOptimizer's accumulators
one a ps, the transfers packed, and the protocol the tasks speak through
queues on the ps tasks.

May import: runtime, cluster.
"""
