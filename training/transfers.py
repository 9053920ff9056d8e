"""The transfer packing: each kind of tensor crosses once per ps a step.

Every tensor that crosses between a worker and a ps costs both ends CPU of
its own (docs/performance.md, "Transfers"). pack() rewires a worker's built
graph so that a step sends the weights of each ps as one tensor, their
gradients back as one, the BatchNorm batch statistics as one, and each
variable's value once to each task that reads it. The arithmetic is the same
ops on the same values: tests/test_transfers.py checks that a packed and a
plain step make the same update. --nopack_transfers leaves the graph as the
article builds it.

This module is the suite's only user of TensorFlow's private API: the
packing's rewiring, and what the suite cannot do without: tf-slim's name for
a tensor, the writer of Chrome traces, the name a slice of a partitioned
variable is saved under. Each use says what breaks
if TensorFlow changes it; tests/test_transfers.py fails then and names the
transfers that are no longer packed.
"""

import collections

import tensorflow as tf
from tensorflow.python.client import timeline
from tensorflow.python.framework import ops as framework_ops
from tensorflow.python.training import training_util

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
  one_step_read(tf1.train.get_global_step())
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
  # outside a cond and a rewired input inside one fails the graph's import.
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


def one_step_read(global_step):
  """Gives TensorFlow's hooks one plain read of the global step.

  StopAtStepHook, CheckpointSaverHook and SummarySaverHook fetch the global
  step every step through a tensor TensorFlow makes once per graph: a
  tf.cond that checks it is initialized, split between its ps and the
  worker. In a session made ready it always is: registered first, this read
  is the one they all fetch.
  """
  # Private: training_util.GLOBAL_STEP_READ_KEY, the collection of that
  # tensor. If it goes, the hooks make their cond again (6 transfers a step).
  if tf1.get_collection(training_util.GLOBAL_STEP_READ_KEY):
    return
  with tf1.colocate_with(global_step):
    read = tf.identity(global_step.read_value(), name='global_step_read')
  tf1.add_to_collection(training_util.GLOBAL_STEP_READ_KEY, read)


def _group_token_waits(graph):
  """A synchronous worker dequeues its token (on the global step's ps) after
  every accumulator took its gradient: a control edge from each, a transfer
  each from another ps. One group per ps is the same wait."""
  for op in graph.get_operations():
    if not (op.type == 'QueueDequeueV2' and
            op.name.endswith('sync_token_q_Dequeue')):
      continue
    by_device = collections.OrderedDict()
    for dep in op.control_inputs:
      by_device.setdefault(dep.device, []).append(dep)
    groups = []
    for device, deps in by_device.items():
      with tf1.device(device):
        groups.append(tf.group(*deps, name='gradients_taken'))
    # Private: Operation._remove_all_control_inputs / _add_control_inputs.
    # If they go, this raises AttributeError; --nopack_transfers runs
    # without.
    op._remove_all_control_inputs()  # pylint: disable=protected-access
    op._add_control_inputs(groups)  # pylint: disable=protected-access


def chrome_trace(step_stats):
  """A traced step's stats as Chrome's trace format (JSON text)."""
  # Private: tensorflow.python.client.timeline, TensorFlow's own writer of
  # it. If it goes, --trace_steps fails at import of this module.
  return timeline.Timeline(step_stats).generate_chrome_trace_format()


def tf_slim_compat():
  """Lets tf-slim build BatchNorm on TensorFlow 2.21; call before importing
  tf_slim.

  tf-slim 1.1.0 (its last release) tests isinstance(x, ops.Tensor) in its
  layers, and TensorFlow's framework ops module no longer has Tensor:
  slim.batch_norm raised AttributeError. The old name points at the public
  class.
  """
  # Private: tensorflow.python.framework.ops, the module tf-slim reads. If
  # it goes, tf-slim itself no longer imports.
  if not hasattr(framework_ops, 'Tensor'):
    framework_ops.Tensor = tf.Tensor


def saved_name_and_shape(var):
  """(name, shape) under which var is saved in a checkpoint: a slice of a
  partitioned variable is saved as part of the full variable."""
  # Private: Variable._save_slice_info, the Saver's own record of a slice.
  # If it goes, a partitioned variable looks whole and a resume with 2 ps
  # or more says its checkpoint does not fit.
  info = getattr(var, '_save_slice_info', None)
  if info is not None:
    return info.full_name, list(info.full_shape)
  return var.op.name, var.shape.as_list()
