"""The checkpoints in --train_dir: making the directory, --fresh_start, and
whether the checkpoints there are of this model.

Restoring a checkpoint of another model fails deep inside a session with a
long traceback (the chief) or not at all (the evaluator would skip it
forever); both check the names and shapes first and stop with one line.
"""

import os
import shutil

import tensorflow as tf


class TrainDirError(Exception):
  """--train_dir cannot be used; reported in one line."""


def prepare(train_dir, is_chief, fresh_start):
  """Makes train_dir; the chief empties it first with fresh_start.

  Raises:
    TrainDirError: when it cannot be deleted, made or written.
  """
  action = 'create'
  try:
    if is_chief and fresh_start and os.path.exists(train_dir):
      action = 'delete'
      print('Worker 0: --fresh_start: deleting %s' % train_dir)
      shutil.rmtree(train_dir)
      action = 'create'
    os.makedirs(train_dir, exist_ok=True)
  except OSError as e:
    raise TrainDirError('cannot %s --train_dir=%s: %s' % (action, train_dir,
                                                         e.strerror))
  if is_chief and not os.access(train_dir, os.W_OK | os.X_OK):
    raise TrainDirError('--train_dir=%s is not writable: choose another '
                        'directory or fix its permissions' % train_dir)


def saved_name_and_shape(var):
  """Returns (name, shape) under which var is saved in a checkpoint.

  A slice of a partitioned variable (see ps_placement) is saved as part of
  the full variable.
  """
  info = getattr(var, '_save_slice_info', None)
  if info is not None:
    return info.full_name, list(info.full_shape)
  return var.op.name, var.shape.as_list()


def mismatch(checkpoint, variables):
  """Returns why variables cannot be restored from checkpoint, or None.

  Raises:
    tf.errors.OpError, ValueError: when the checkpoint cannot be read.
  """
  saved = dict(tf.train.list_variables(checkpoint))
  for var in variables:
    name, shape = saved_name_and_shape(var)
    if saved.get(name) != shape:
      return '%s: %s in the checkpoint, %s here' % (
          name, saved.get(name, 'missing'), shape)
  return None


def check_resumable(train_dir, variables):
  """Raises TrainDirError if train_dir's latest checkpoint is not of this
  model (variables), or cannot be read."""
  latest = tf.train.latest_checkpoint(train_dir)
  if not latest:
    return
  try:
    problem = mismatch(latest, variables)
  except (tf.errors.OpError, ValueError) as e:
    raise TrainDirError('cannot read the checkpoint %s (%s): use another '
                        '--train_dir or --fresh_start' % (
                            latest, str(e).splitlines()[0]))
  if problem:
    raise TrainDirError(
        '--train_dir=%s holds a checkpoint of a different model (%s): use '
        'another --train_dir, or --fresh_start to delete it' % (train_dir,
                                                                problem))
