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

The weights go out the same way: every worker's step pulls all the weights
of a ps as one tensor, the same one until the next update. The update joins
them once, into a variable on that ps (joined_weights), which each step
reads whole: the ps no longer reads and joins every weight for every
worker's step. That variable is not saved: each session's start fills it
(fill_joined_weights), the chief's always, after it restored the weights.
A synchronous worker reads the global step's ps's joined weights as its
step ends, with its token, and keeps them for its next step in a copy of
its own (pulled_copy): the step asks that ps for nothing else.
"""

import collections

import tensorflow as tf

tf1 = tf.compat.v1


ALIGN = 16  # float32s in 64 bytes, TensorFlow's (Eigen's) alignment.
# A graph collection of (a ps's joined_weights variable, its weights in
# their order there).
JOINED_WEIGHTS = 'joined_weights'
# A graph collection of (a worker's copy of a ps's joined weights, that
# joined_weights variable).
PULLED_WEIGHTS = 'pulled_weights'


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
    grads_and_vars = list(grads_and_vars)  # SyncReplicasOptimizer's: a zip.
    split = []
    for joined, ps in grads_and_vars:
      with tf1.device(ps.device):
        pieces = tf.split(joined, [v.shape.num_elements()
                                   for v in ps.variables] + [ps.padding])
        split += [(tf.reshape(p, v.shape), v)
                  for p, v in zip(pieces, ps.variables)]
    update = self._opt.apply_gradients(split, global_step=global_step,
                                       name=name)
    # The weights' next pull, joined once (SyncReplicasOptimizer puts the
    # workers' tokens after this op: no step reads them before).
    with tf.control_dependencies([update]):
      refreshed = [_refresh(*_make_joined_weights(ps))
                   for _, ps in grads_and_vars]
    return tf.group(update, *refreshed)

  def get_slot(self, *args, **kwargs):
    return self._opt.get_slot(*args, **kwargs)

  def get_slot_names(self, *args, **kwargs):
    return self._opt.get_slot_names(*args, **kwargs)

  def variables(self):
    return self._opt.variables()


def largest_first(items, size):
  """items, the largest (by size(item)) first, ties in their order: the
  order a pack joins its pieces in (transfers.send_packed)."""
  return sorted(items, key=lambda item: -size(item))


def _make_joined_weights(ps):
  """(a variable on ps's device for its weights joined, those weights in
  their order there: the largest first)."""
  weights = largest_first(ps.variables, lambda v: v.shape.num_elements())
  task = tf.DeviceSpec.from_string(ps.device).task or 0
  with tf1.device(ps.device):
    # Not in a collection the Saver or the init ops take: filled by
    # fill_joined_weights, refreshed by each update.
    joined = tf1.Variable(
        tf.zeros([sum(v.shape.num_elements() for v in weights)]),
        trainable=False, collections=[], use_resource=True,
        name='joined_weights_%d' % task)
  tf1.add_to_collection(JOINED_WEIGHTS, (joined, weights))
  return joined, weights


def _refresh(joined, weights):
  """An op that joins weights into joined, on its ps."""
  with tf1.device(joined.device):
    return joined.assign(tf.concat([tf.reshape(v.value(), [-1])
                                    for v in weights], 0), read_value=False)


def joined_variable(weights, device):
  """The joined_weights variable on device that holds exactly weights
  (variable refs, in the pack's order), or None: what a synchronous
  worker's step pulls from that ps instead of its weights one by one."""
  for joined, held in tf1.get_collection(JOINED_WEIGHTS):
    if (tf.DeviceSpec.from_string(joined.device) ==
        tf.DeviceSpec.from_string(device) and
        [v.ref() for v in held] == list(weights)):
      return joined
  return None


def read_joined(joined, name='joined_weights'):
  """One read of a joined_weights variable, on its ps: one op, named."""
  with tf1.device(joined.device):
    return tf.raw_ops.ReadVariableOp(resource=joined.handle,
                                     dtype=joined.dtype, name=name)


def pulled_copy(joined, dtype, device):
  """A variable on device (a worker) for joined's value as dtype, kept from
  one step's end to the next step: a local variable (not saved), filled at
  each session's start (fill_pulled_weights)."""
  with tf1.device(device):
    copy = tf1.Variable(tf.zeros(joined.shape, dtype), trainable=False,
                        collections=[tf1.GraphKeys.LOCAL_VARIABLES],
                        use_resource=True, name='pulled_weights')
  tf1.add_to_collection(PULLED_WEIGHTS, (copy, joined))
  return copy


def fill_pulled_weights(after=()):
  """An op that fills each pulled copy from its ps, after the ops after
  (the token this worker takes): at a session's start, once the joined
  weights are filled and the local step set; and when a worker set aside
  takes a token again."""
  fills = []
  for copy, joined in tf1.get_collection(PULLED_WEIGHTS):
    with tf.control_dependencies(after):
      value = read_joined(joined, name='pulled_weights_fill')
    with tf1.device(copy.device):
      fills.append(copy.assign(tf.cast(value, copy.dtype), read_value=False))
  return tf.group(*fills)


def fill_joined_weights(*, chief):
  """An op for a worker's session start: fills each ps's joined weights.
  The chief's always (it may have just restored the weights); another
  worker's only where they are not filled yet (a new ps), so that a worker
  that joins while the chief's update runs leaves its refresh alone."""
  fills = []
  for joined, weights in tf1.get_collection(JOINED_WEIGHTS):
    fill = lambda joined=joined, weights=weights: _refresh(joined, weights)
    fills.append(fill() if chief else tf1.cond(
        tf1.is_variable_initialized(joined), tf.no_op, fill))
  return tf.group(*fills)
