"""Where the model's variables live: spread over the ps tasks by size.

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


def device_setter(cluster, worker_device):
  """replica_device_setter: variables by bytes over the cluster's ps tasks."""
  return tf1.train.replica_device_setter(
      worker_device=worker_device, ps_device='/job:ps/cpu:0',
      cluster=cluster, ps_strategy=GreedyByBytes(cluster.num_tasks('ps')))


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
