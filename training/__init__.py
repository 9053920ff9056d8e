"""The machinery the article does not have, in six rooms, one concern each.

The article's files sit at the top of the repository (train_distributed.py,
cifar10_input.py, cifar10_model.py, cifar10_eval.py) and use this package;
nothing here imports them. Each room's __init__ says what it owns and which
rooms it may import, in this order, one way: runtime, cluster, graph,
storage, health, session. docs/code.md says which module owns what.
Importing the package loads no TensorFlow: log_filter must start first.
"""
