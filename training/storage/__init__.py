"""What lives on disk: the checkpoints in --train_dir, resuming one that
lacks or holds extra variables, what a run records beside them (and what
earlier releases wrote), the CIFAR-10 files' layout, and their download.

May import: runtime, cluster, graph.
"""
