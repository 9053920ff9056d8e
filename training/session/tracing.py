"""--trace_steps: a Chrome trace of some of a worker's own steps, and the
bytes each traced step moved between the worker and the ps tasks."""

import os
import re

import tensorflow as tf

from training.runtime import tf_compat

tf1 = tf.compat.v1


class TraceStepsHook(tf1.train.SessionRunHook):
  """Writes a Chrome trace of some of this worker's own steps into train_dir.

  FULL_TRACE: every op of the step on every device it touched, the ps tasks'
  reads and applies and the transfers included. TensorFlow's ProfilerHook
  traces global steps; this the worker's own, one file each per worker.
  """

  def __init__(self, steps, train_dir, task_index):
    """Args: steps: local step numbers, from 1; task_index: this worker's."""
    self._steps = set(steps)
    self._train_dir = train_dir
    self._task_index = task_index
    self._local_step = 0

  def before_run(self, run_context):
    self._local_step += 1
    if self._local_step in self._steps:
      return tf1.train.SessionRunArgs(None, options=tf1.RunOptions(
          trace_level=tf1.RunOptions.FULL_TRACE))
    return None

  def after_run(self, run_context, run_values):
    if self._local_step not in self._steps:
      return
    stats = run_values.run_metadata.step_stats
    path = os.path.join(self._train_dir, 'trace_worker%d_step%d.json' % (
        self._task_index, self._local_step))
    with open(path, 'w') as f:
      f.write(tf_compat.chrome_trace(stats))
    pulled, pushed = transfer_bytes(
        stats, '/job:worker/replica:0/task:%d/' % self._task_index)
    print('Worker %d: wrote the trace of its step %d to %s; the step pulled '
          '%d bytes from the ps tasks and pushed %d' % (
              self._task_index, self._local_step, path, pulled, pushed),
          flush=True)


# The label of a transfer in a step's stats: `[18432B] [248.2Mb/s]
# edge_77_Cast_4 from /job:ps/replica:0/task:0/device:CPU:0 to /job:...`
# (its size rounded, `[0.3MB]`, for large ones: the exact size is the
# RecvTensor's output allocation).
TRANSFER = re.compile(r'^\[[\d.]+[KMG]?B\] .* from (\S+) to (\S+)$')


def transfer_bytes(step_stats, worker):
  """(bytes from the ps tasks to worker, bytes from worker to them) in a
  traced step, from its RecvTensor records (the ps side's only when a ps
  sent its stats back in time)."""
  pulled = pushed = 0
  for device in step_stats.dev_stats:
    for node in device.node_stats:
      match = TRANSFER.match(node.timeline_label)
      if node.node_name != 'RecvTensor' or not match:
        continue
      size = sum(o.tensor_description.allocation_description.requested_bytes
                 for o in node.output)
      source, dest = match.groups()
      if source.startswith('/job:ps/') and dest.startswith(worker):
        pulled += size
      elif source.startswith(worker) and dest.startswith('/job:ps/'):
        pushed += size
  return pulled, pushed
