"""One gradient accumulator a ps: SyncReplicasOptimizer given each ps's
gradients as one tensor.

SyncReplicasOptimizer keeps an accumulator for every variable, so every
worker's step runs one apply on the ps for each (and the ps first splits
what the worker sent into as many pieces): the ps's work per worker step
grows with the variables, not the bytes. Here the worker joins the
gradients of each ps's variables into one flat tensor, which
SyncReplicasOptimizer takes as the gradient of one stand-in variable
(PsVariables) into one accumulator; the chief's update splits the average
back on that ps (SplitOptimizer) and applies it as before. The update is
the same arithmetic on the same values (tests/test_optimizer.py: a packed
cluster updates as one process).
"""

import collections

import tensorflow as tf

tf1 = tf.compat.v1


ALIGN = 16  # float32s in 64 bytes, TensorFlow's (Eigen's) alignment.


class PsVariables:
  """What SyncReplicasOptimizer sees of the variables of one ps: a name
  (its accumulator's is made from it), a device and a flat shape."""

  def __init__(self, variables, name):
    self.variables = variables
    self.device = variables[0].device
    self.name = name
    size = sum(v.shape.num_elements() for v in variables)
    # Zeros to a whole number of 64 bytes: a piece of that size, first in
    # the pack the ps receives, is taken out of it with no copy (a Slice
    # aligned on 64 bytes shares its input's buffer; a SplitV copies).
    self.padding = -size % ALIGN
    self._shape = tf.TensorShape([size + self.padding])

  def get_shape(self):
    return self._shape


def by_ps(variables):
  """[PsVariables], one for each ps the variables are on, in their order."""
  groups = collections.OrderedDict()
  for var in variables:
    groups.setdefault(var.device, []).append(var)
  return [PsVariables(group, 'ps_gradients_%d:0' % (
      tf.DeviceSpec.from_string(device).task or 0))
          for device, group in groups.items()]


def join(grads_and_vars):
  """[(one ps's gradients joined, its PsVariables)], joined where the
  gradients are (on the worker). Variables without a gradient are left
  out, as SyncReplicasOptimizer leaves them."""
  grads = {v.ref(): g for g, v in grads_and_vars if g is not None}
  joined = []
  for ps in by_ps([v for _, v in grads_and_vars if v.ref() in grads]):
    pieces = [grads[v.ref()] for v in ps.variables]
    with tf1.device(pieces[0].device):
      flat = [tf.reshape(g, [-1]) for g in pieces]
      if ps.padding:
        flat.append(tf.zeros([ps.padding], flat[0].dtype))
      joined.append((tf.concat(flat, 0, name='ps_gradients'), ps))
  return joined


class SplitOptimizer:
  """The optimizer SyncReplicasOptimizer wraps, given each ps's aggregated
  gradients as one tensor: splits them, on that ps, to their variables and
  has the optimizer apply them."""

  def __init__(self, opt):
    self._opt = opt

  def compute_gradients(self, *args, **kwargs):
    return self._opt.compute_gradients(*args, **kwargs)

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    split = []
    for joined, ps in grads_and_vars:
      with tf1.device(ps.device):
        pieces = tf.split(joined, [v.shape.num_elements()
                                   for v in ps.variables] + [ps.padding])
        split += [(tf.reshape(p, v.shape), v)
                  for p, v in zip(pieces, ps.variables)]
    return self._opt.apply_gradients(split, global_step=global_step,
                                     name=name)

  def get_slot(self, *args, **kwargs):
    return self._opt.get_slot(*args, **kwargs)

  def get_slot_names(self, *args, **kwargs):
    return self._opt.get_slot_names(*args, **kwargs)

  def variables(self):
    return self._opt.variables()
