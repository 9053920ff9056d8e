"""TensorFlow's and tf-slim's private API that the suite cannot do without.

Each use says what breaks if TensorFlow changes it. No flag can turn off
the two that every run needs: tf_slim_compat (without it the model's
BatchNorm does not build) and saved_name_and_shape (without it a resume
with 2 ps or more refuses its own checkpoint). The other two import their
private module when called, so that losing it breaks only what calls them:
chrome_trace, --trace_steps; one_step_read, the packing, which
--nopack_transfers turns off. The packing's own private uses are in
transfers.py.
"""

import tensorflow as tf
from tensorflow.python.framework import ops as framework_ops

tf1 = tf.compat.v1


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


def chrome_trace(step_stats):
  """A traced step's stats as Chrome's trace format (JSON text)."""
  # Private: tensorflow.python.client.timeline, TensorFlow's own writer of
  # it. If it goes, --trace_steps fails at its first traced step.
  from tensorflow.python.client import timeline  # pylint: disable=g-import-not-at-top
  return timeline.Timeline(step_stats).generate_chrome_trace_format()


def one_step_read(global_step):
  """Gives TensorFlow's hooks one plain read of the global step.

  StopAtStepHook, CheckpointSaverHook and SummarySaverHook fetch the global
  step every step through a tensor TensorFlow makes once per graph: a
  tf.cond that checks it is initialized, split between its ps and the
  worker. In a session made ready it always is: registered first, this read
  is the one they all fetch.
  """
  # Private: tensorflow.python.training.training_util.GLOBAL_STEP_READ_KEY,
  # the collection of that tensor. If it goes, the packing raises
  # ImportError or AttributeError; --nopack_transfers runs without.
  from tensorflow.python.training import training_util  # pylint: disable=g-import-not-at-top
  if tf1.get_collection(training_util.GLOBAL_STEP_READ_KEY):
    return
  with tf1.colocate_with(global_step):
    read = tf.identity(global_step.read_value(), name='global_step_read')
  tf1.add_to_collection(training_util.GLOBAL_STEP_READ_KEY, read)


def registered_step_read():
  """The read of the global step one_step_read registered, or None: the
  suite's own hooks fetch it too, so that a step reads the step once."""
  from tensorflow.python.training import training_util  # pylint: disable=g-import-not-at-top
  reads = tf1.get_collection(training_util.GLOBAL_STEP_READ_KEY)
  return reads[0] if reads else None
