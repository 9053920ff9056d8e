"""Where the model's variables live, spread over the ps tasks by size, and
where their updates run: the moving averages and BatchNorm statistics on
the ps that holds them.

replica_device_setter's default strategy deals variables out round-robin in
creation order, which for this network puts the large conv kernel and
whatever follows it on one ps. Here, as TF1's GreedyLoadBalancingStrategy
(tf.contrib, gone from tf.compat.v1) and tf_cnn_benchmarks did, each variable
goes to the ps holding the fewest bytes so far. One kernel,
Conv2d_4a_3x3/weights, holds about 77% of the parameters, so no placement of
whole variables balances two ps: variables above MIN_SLICE_BYTES are
partitioned across the ps tasks first, the TF1 way, with a variable_scope
partitioner. A partitioned variable is saved as slices of one full variable,
so its checkpoint restores into any number of ps, and into the evaluator's
graph, which has none.
"""

import tensorflow as tf

tf1 = tf.compat.v1

# A variable of more than this many bytes is split, into ceil(bytes / this)
# slices but never more than there are ps tasks (min_max_variable_partitioner's
# rule): 64 KiB keeps small variables whole, where splitting would cost a
# message per slice per step.
MIN_SLICE_BYTES = 64 << 10


def variable_bytes(op):
  """Returns the bytes of the variable that a variable op creates."""
  shape = tf.TensorShape(op.get_attr('shape'))
  return shape.num_elements() * tf.as_dtype(op.get_attr('dtype')).size


class GreedyByBytes:
  """A ps_strategy for replica_device_setter: the least-loaded ps, by bytes.

  Called once per variable op, in creation order; ties go to the lowest
  task index, so the first variable (the global step, and with it
  SyncReplicasOptimizer's queues) lands on ps 0.
  """

  def __init__(self, num_tasks):
    self.loads = [0] * num_tasks

  def __call__(self, op):
    task = self.loads.index(min(self.loads))
    self.loads[task] += variable_bytes(op)
    return task


def partitioner(num_ps):
  """Returns a variable_scope partitioner for num_ps ps tasks, or None.

  Splits along the last axis (a kernel's output channels), which every
  variable of the network has at least as many entries of as there are ps
  tasks to fill; min_max_variable_partitioner alone would split along the
  first axis, a 3x3 kernel's height, into at most 3 slices.
  """
  if num_ps < 2:
    return None  # One ps: the reference's plain, unpartitioned variables.

  def partition(shape, dtype):
    return tf1.min_max_variable_partitioner(
        max_partitions=num_ps, axis=max(0, shape.ndims - 1),
        min_slice_size=MIN_SLICE_BYTES)(shape, dtype)
  return partition


def ps_loads(variables, num_ps):
  """Returns [(variables, bytes)] per ps task, from where they were placed."""
  loads = [(0, 0)] * num_ps
  for var in variables:
    task = tf.DeviceSpec.from_string(var.device).task or 0
    count, size = loads[task]
    loads[task] = (count + 1,
                   size + var.shape.num_elements() * var.dtype.size)
  return loads


def describe_loads(variables, num_ps):
  """Returns one line per ps: how many variables and bytes it holds (none
  without a ps)."""
  if not num_ps:
    return []
  loads = ps_loads(variables, num_ps)
  total = sum(size for _, size in loads) or 1
  return ['ps %d holds %d variables, %d bytes (%.1f%%)' % (
      task, count, size, 100.0 * size / total)
          for task, (count, size) in enumerate(loads)]


class ColocatedAverages:
  """The weights' moving averages, each updated on the ps that holds it.

  ExponentialMovingAverage.apply builds its updates in the device scope it
  is called in (the worker, or for SyncReplicasOptimizer the global step's
  ps), so each update would read the weight and its average from where they
  live and write the average back. Built once per ps, for the variables it
  holds, an update reads and writes only what is there; what crosses is
  the global step, one scalar a ps, for the decay.
  """

  def __init__(self, averages):
    self.averages = averages

  def apply(self, var_list):
    """Returns an op that updates the average of every variable."""
    by_device = {}
    for var in var_list:
      by_device.setdefault(var.device, []).append(var)
    updates = []
    for device, variables in by_device.items():
      with tf1.device(device):
        updates.append(self.averages.apply(variables))
    return tf.group(*updates, name='moving_averages')


def colocated_statistics_updates(update_ops):
  """BatchNorm's updates of its moving statistics, built again beside each
  statistic on its ps; returns (the updates, the batch statistics they take).

  tf-slim builds each update (assign_moving_average: moving -= (moving -
  batch) * (1 - decay)) where the layer is, so a step would read every
  moving statistic from its ps and write it back. The same arithmetic built
  with the statistic needs only the batch's value from the worker. Updates of
  another shape are kept as they are.

  Args:
    update_ops: The model's UPDATE_OPS.
  """
  variables = {v.handle.op.name: v for v in tf1.global_variables()}
  updates, batches = [], []
  for update in update_ops:
    # An op, or the _UnreadVariable a resource variable's assign_sub gives.
    op = update if isinstance(update, tf.Operation) else update.op
    handle, delta = op.inputs if op.type == 'AssignSubVariableOp' else (
        None, None)
    if (delta is None or delta.op.type != 'Mul' or
        delta.op.inputs[0].op.type != 'Sub' or
        handle.op.name not in variables):
      updates.append(update)
      continue
    difference, decay = delta.op.inputs
    decay = tf.get_static_value(decay)
    if decay is None:
      updates.append(update)
      continue
    batch = difference.op.inputs[1]
    var = variables[handle.op.name]
    with tf1.colocate_with(var):
      rate = tf.constant(decay, var.dtype.base_dtype)
      updates.append(var.assign_sub((var.read_value() - batch) * rate,
                                    read_value=False))
    batches.append(batch)
  return updates, batches
