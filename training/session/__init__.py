"""A worker's session: its creation and recovery, the hooks MonitoredSession
runs (and in what order), what the chief says and checks before it, and
traced steps.

May import: runtime, cluster, graph, storage, health.
"""
