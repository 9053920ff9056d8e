"""The machinery the article does not have, one module a responsibility.

The article's files sit at the top of the repository (train_distributed.py,
cifar10_input.py, cifar10_model.py, cifar10_eval.py) and use this package;
nothing here imports them. docs/code.md says which module owns what.
Importing the package loads no TensorFlow: log_filter must start first.
"""
