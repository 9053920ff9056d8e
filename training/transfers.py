"""The transfer packing: each kind of tensor crosses once per ps a step.

Every tensor that crosses between a worker and a ps costs both ends CPU of
its own (docs/performance.md, "Transfers"). pack() rewires a worker's built
graph so that a step sends the weights of each ps as one tensor, their
gradients back as one, the BatchNorm batch statistics as one, and each
variable's value once to each task that reads it. The arithmetic is the same
ops on the same values: tests/test_transfers.py checks that a packed and a
plain step make the same update. --nopack_transfers leaves the graph as the
article builds it.

The packing's rewiring uses TensorFlow's private API (the suite's other
uses, which it cannot do without, are in tf_compat.py). Each use says what
breaks if TensorFlow changes it; tests/test_transfers.py fails then and
names the transfers that are no longer packed.
"""

import collections

import tensorflow as tf

from training import sync_protocol
from training import tf_compat

tf1 = tf.compat.v1


def pack(*, fetches, gradients, statistics, transfer_dtype, sync):
  """Packs what a worker's training step sends; call once, after the whole
  training graph is built and before its session.

  Args:
    fetches: What a step runs (the train op, the tensors the loop fetches):
      only the edges of their ops are packed.
    gradients: The gradient tensors the optimizer applies (on the worker).
    statistics: The BatchNorm batch statistics the step sends to the ps
      tasks (on the worker); [] if none.
    transfer_dtype: What the weights and gradients cross as: tf.float32, or
      tf.bfloat16 (cast beside the sender, back to float32 beside the
      receiver; the ps accumulates and applies in float32).
    sync: Whether the graph has a SyncReplicasOptimizer.
  """
  tf_compat.one_step_read(tf1.train.get_global_step())
  consumers = _consumers(_ops_run_by(fetches))
  trainable = {v.ref() for v in tf1.trainable_variables()}
  groups = collections.OrderedDict()
  for var in tf1.global_variables() + tf1.local_variables():
    reads = [op.outputs[0] for op, _ in consumers.get(var.handle.ref(), ())
             if op.type == 'ReadVariableOp' and not op.control_inputs]
    cast = transfer_dtype if var.ref() in trainable else None
    _add_crossings(groups, reads, var.ref(), cast, consumers)
  for tensor in gradients:
    _add_crossings(groups, [tensor], tensor.ref(), transfer_dtype, consumers)
  for tensor in statistics:
    _add_crossings(groups, [tensor], tensor.ref(), None, consumers)
  for (source, dest, _, cast), by_key in groups.items():
    send_packed(list(by_key.values()), source=source, dest=dest, cast=cast)
  if sync:
    _group_token_waits(tf1.get_default_graph())


def _ops_run_by(fetches):
  """The ops that running fetches runs."""
  ops, todo = set(), [f if isinstance(f, tf.Operation) else f.op
                      for f in fetches]
  while todo:
    op = todo.pop()
    if op not in ops:
      ops.add(op)
      todo += [t.op for t in op.inputs] + list(op.control_inputs)
  return ops


def _consumers(ops):
  """{tensor ref: [(op, input index)]} for ops."""
  found = collections.defaultdict(list)
  for op in ops:
    for index, tensor in enumerate(op.inputs):
      found[tensor.ref()].append((op, index))
  return found


def _device(op):
  """The device TensorFlow's placer puts op on: beside the resource it
  takes (a variable's read has no device of its own), else with the op
  it is colocated with, else its own."""
  for tensor in op.inputs:
    if tensor.dtype == tf.resource:
      return _device(tensor.op)
  for group in op.colocation_groups():
    name = group.decode()[len('loc:@'):]
    if name != op.name:
      return _device(op.graph.get_operation_by_name(name))
  return tf.DeviceSpec.from_string(op.device).to_string()


def _task(device):
  spec = tf.DeviceSpec.from_string(device)
  return spec.job, spec.replica or 0, spec.task


def _in_control_flow(op):
  # Private: Operation._get_control_flow_context. If it goes, every op looks
  # outside a cond and a rewired input inside one fails the graph's import;
  # --nopack_transfers runs without.
  return op._get_control_flow_context() is not None  # pylint: disable=protected-access


def _add_crossings(groups, tensors, key, cast, consumers):
  """Records the edges from tensors (one value: reads of one variable, or
  one tensor) to ops of another task, grouped by (source device,
  destination device, dtype, cast): one piece of a pack per key."""
  for tensor in tensors:
    if (tensor.dtype == tf.resource or not tensor.shape.is_fully_defined()
        or _in_control_flow(tensor.op)):
      continue
    source = _device(tensor.op)
    for op, index in consumers.get(tensor.ref(), ()):
      dest = _device(op)
      if _task(dest) == _task(source) or _in_control_flow(op):
        continue
      cast_here = cast if cast and tensor.dtype == tf.float32 else None
      group = groups.setdefault((source, dest, tensor.dtype, cast_here),
                                collections.OrderedDict())
      # The first tensor of a key is the one sent; the key's other reads'
      # consumers take it too.
      group.setdefault(key, (tensor, []))[1].append((op, index))


def send_packed(pieces, *, source, dest, cast=None):
  """Sends tensors from one device to another as one tensor: flattened and
  joined on source, split and reshaped on dest, where each consumer's input
  is rewired to its piece.

  Args:
    pieces: [(tensor on source, [(op on dest that takes it, input index)])],
      of one dtype, each of a static shape.
    source, dest: The two devices.
    cast: A dtype to cross as (cast back after the split), or None.
  """
  with tf1.device(source):
    sent = [tf.cast(t, cast) if cast else t for t, _ in pieces]
    if len(pieces) > 1:
      sent = [tf.concat([tf.reshape(t, [-1]) for t in sent], 0,
                        name='packed')]
  with tf1.device(dest):
    if len(pieces) > 1:
      received = tf.split(sent[0], [t.shape.num_elements() for t, _ in pieces])
      received = [tf.reshape(r, t.shape) for r, (t, _) in zip(received, pieces)]
    else:
      received = sent
    if cast:
      received = [tf.cast(r, t.dtype) for r, (t, _) in zip(received, pieces)]
    for piece, (_, edges) in zip(received, pieces):
      for op, index in edges:
        # Private: Operation._update_input. If it goes, nothing is packed
        # and this raises AttributeError; --nopack_transfers runs without.
        op._update_input(index, piece)  # pylint: disable=protected-access


def _group_token_waits(graph):
  """A synchronous worker dequeues its token (on the global step's ps) after
  every accumulator took its gradient, and marks its progress there: a
  control edge from each, a transfer each from another ps. One group per ps
  is the same wait, and both take it."""
  waits = [op for op in graph.get_operations()
           if sync_protocol.is_token_dequeue(op) or
           sync_protocol.is_progress_mark(op)]
  groups = {}  # {the deps' names: their groups}.
  for op in waits:
    by_device = collections.OrderedDict()
    for dep in op.control_inputs:
      by_device.setdefault(dep.device, []).append(dep)
    key = tuple(sorted(dep.name for dep in op.control_inputs))
    if key not in groups:
      groups[key] = []
      for device, deps in by_device.items():
        with tf1.device(device):
          groups[key].append(tf.group(*deps, name='gradients_taken'))
    # Private: Operation._remove_all_control_inputs / _add_control_inputs.
    # If they go, this raises AttributeError; --nopack_transfers runs
    # without.
    op._remove_all_control_inputs()  # pylint: disable=protected-access
    op._add_control_inputs(groups[key])  # pylint: disable=protected-access
