"""The cluster's description and each task's share of it: the host lists
and TF_CONFIG, each task's session config (devices, threads), free ports
for a local cluster, and the planner's model of how fast a cluster
trains.

May import: runtime.
"""
