"""Who of the cluster is there and keeps pace: liveness, the workers that
joined and the chief, the chief's watch on the other workers, stragglers
set aside, and the end of a run (the ps waits for every worker's word).

May import: runtime, cluster, graph, storage.
"""
