"""Resuming a checkpoint that lacks variables this run can make, or holds
some it does not use.

A checkpoint may lack the moving averages of the weights (an earlier
release wrote it: each starts from its weight) or momentum's accumulators
(a run with --optimizer=sgd wrote it: each starts at zero). A checkpoint
of a run with --optimizer=momentum resumed with --optimizer=sgd holds
accumulators this run leaves unused. Each case is said in one line.
"""

import tensorflow as tf

from training.storage import checkpoints

tf1 = tf.compat.v1

# MomentumOptimizer's name for its accumulator of a variable, var/Momentum.
ACCUMULATOR = 'Momentum'


def is_accumulator(var):
  """Whether var is momentum's accumulator of a variable."""
  return var.op.name.endswith('/' + ACCUMULATOR)


def can_rebuild(shadows):
  """The predicate checkpoints.resume_point takes: whether a variable a
  checkpoint lacks can be made here (an average in shadows, {moving
  average: its weight}, or an accumulator)."""
  return lambda var: var in shadows or is_accumulator(var)


def unused_line(checkpoint, variables):
  """The chief's line when checkpoint holds accumulators and none of
  variables is one (momentum resumed with plain SGD); None otherwise."""
  if any(is_accumulator(v) for v in variables):
    return None
  held = [name for name, _ in tf.train.list_variables(checkpoint)
          if name.endswith('/' + ACCUMULATOR)]
  if not held:
    return None
  return ('%s holds momentum\'s %d accumulators (--optimizer=momentum wrote '
          'it); --optimizer=sgd leaves them unused' % (checkpoint, len(held)))


class Rebuild:
  """Restores a checkpoint that lacks averages or accumulators, and makes
  them: each average from its weight, each accumulator at zero.

  Built before the graph is finalized, for the variables that checkpoint
  lacks: a Saver of the others, and an op that sets each missing average
  to its weight.
  """

  def __init__(self, missing, shadows):
    """Args: missing: the variables the checkpoint lacks, each an average
    or an accumulator; shadows: {moving average: its weight} of the
    model."""
    self.missing = set(missing)
    self.saver = tf1.train.Saver(
        [v for v in tf1.global_variables() if v not in self.missing],
        sharded=True)
    averages = [v for v in missing if v in shadows]
    self.init_missing = tf.group(*[
        v.assign(shadows[v], read_value=False) for v in averages])
    self._counts = [len({checkpoints.saved_name_and_shape(v)[0]
                         for v in self.missing if is_accumulator(v) == kind})
                    for kind in (False, True)]

  def restore(self, session, init_op, path):
    """Initializes every variable (accumulators at zero), restores what the
    checkpoint at path holds, sets the averages to their weights; returns
    the chief's line."""
    session.run(init_op)
    self.saver.restore(session, path)
    session.run(self.init_missing)
    averages, accumulators = self._counts
    made = []
    if averages:
      made.append('no moving averages of the weights (an earlier release '
                  'wrote it): resuming from it, the %d averages starting '
                  'from its weights' % averages)
    if accumulators:
      made.append('no momentum accumulators (--optimizer=sgd wrote it): '
                  'resuming from it, the %d accumulators starting at zero' %
                  accumulators)
    return '%s has %s' % (path, '; and '.join(made))
