"""The checkpoints in --train_dir: making the directory, --fresh_start,
which checkpoint to resume from, and what a failed write leaves.

Restoring a checkpoint of another model fails deep inside a session with a
long traceback (the chief) or not at all (the evaluator would skip it
forever); both check the names and shapes first and stop with one line. A
checkpoint that lacks only what the code can rebuild (an earlier release's,
without the moving averages: records.py) is resumed, not refused.
A checkpoint whose files are damaged (truncated by a crash or a full disk)
is skipped for the newest one that reads back whole, and never deleted. A
save that fails (disk full, read-only, quota) leaves the last good
checkpoint as it was; its own temporary files are removed.
"""

import collections
import errno
import glob
import os
import re
import shutil

import tensorflow as tf

from training.runtime import log_filter
from training.runtime import tf_compat

tf1 = tf.compat.v1


class TrainDirError(Exception):
  """--train_dir cannot be used; reported in one line."""


class WriteError(Exception):
  """A checkpoint could not be written; reported in one line."""


class LostPsError(WriteError):
  """A checkpoint could not be written because a ps was lost, where no
  recovery follows (at the end); a restart resumes (exit status 3)."""


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

  A slice of a partitioned variable (see placement) is saved as part of
  the full variable.
  """
  return tf_compat.saved_name_and_shape(var)


def mismatch(checkpoint, variables, can_rebuild=lambda var: False):
  """Returns why variables cannot be restored from checkpoint, or None.

  Args:
    checkpoint: Its path.
    variables: The variables to restore.
    can_rebuild: Whether a variable missing from the checkpoint can be made
      without it (the moving average of a weight, from the weight).

  Raises:
    tf.errors.OpError, ValueError: when the checkpoint cannot be read.
  """
  saved = dict(tf.train.list_variables(checkpoint))
  for var in variables:
    name, shape = saved_name_and_shape(var)
    if saved.get(name) != shape and not (name not in saved and
                                         can_rebuild(var)):
      return '%s: %s in the checkpoint, %s here' % (
          name, saved.get(name, 'missing'), shape)
  return None


def missing_from(checkpoint, variables):
  """The variables that checkpoint does not hold, in their order."""
  saved = dict(tf.train.list_variables(checkpoint))
  return [v for v in variables if saved_name_and_shape(v)[0] not in saved]


def unreadable(checkpoint):
  """Returns why checkpoint cannot be read back whole, or None.

  Reads every tensor: a truncated or corrupted data file reads its index
  fine and fails only here (or, later, deep inside a restore).
  """
  try:
    reader = tf.train.load_checkpoint(checkpoint)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)
  # The reader's C++ errors arrive as Python's: a short read as IndexError.
  except (tf.errors.OpError, ValueError, IndexError, RuntimeError) as e:
    return log_filter.first_line(e)
  return None


def step_of(checkpoint):
  """The step in a checkpoint's name, model.ckpt-STEP; -1 without one."""
  match = re.search(r'-(\d+)$', checkpoint)
  return int(match.group(1)) if match else -1


def candidates(train_dir):
  """The checkpoints in train_dir, newest first.

  Those the `checkpoint` file lists and every model.ckpt-N.index beside it:
  a damaged or missing `checkpoint` file must not hide (and later let a new
  run overwrite) the checkpoints themselves.
  """
  found = {p[:-len('.index')] for p in glob.glob(
      os.path.join(glob.escape(train_dir), 'model.ckpt-*.index'))}
  try:
    state = tf.train.get_checkpoint_state(train_dir)
  except (tf.errors.OpError, ValueError):
    state = None
  if state:
    found.update(p for p in state.all_model_checkpoint_paths
                 if os.path.exists(p + '.index'))
  return sorted(found, key=step_of, reverse=True)


def newest_readable(train_dir):
  """Returns (the newest checkpoint that reads back whole or None,
  [(path, why) of each newer one that does not])."""
  skipped = []
  for checkpoint in candidates(train_dir):
    problem = unreadable(checkpoint)
    if problem is None:
      return checkpoint, skipped
    skipped.append((checkpoint, problem))
  return None, skipped


# What the chief resumes from: the checkpoint's path, the global step in
# it, the variables it lacks that the chief rebuilds ([] for a checkpoint of
# this release), and the older checkpoints beside it, oldest first.
Resume = collections.namedtuple('Resume', 'path step missing older')


def resume_point(train_dir, variables, say, can_rebuild=lambda var: False):
  """The checkpoint the chief resumes from: the newest readable one.

  Args:
    train_dir: --train_dir.
    variables: The model's variables, which it must hold, but for those it
      can rebuild.
    say: Called with one line for each damaged checkpoint skipped.
    can_rebuild: See mismatch().

  Returns:
    A Resume, or None to start from scratch (no checkpoint at all).

  Raises:
    TrainDirError: when it is of another model, or none of the checkpoints
      there can be read.
  """
  checkpoint, skipped = newest_readable(train_dir)
  for path, problem in skipped:
    say('cannot read the checkpoint %s (%s); it is left as it is' % (
        path, problem))
  if checkpoint is None:
    if skipped:
      raise TrainDirError(
          'none of the %d checkpoint(s) in --train_dir=%s can be read: move '
          'them away to start over, or --fresh_start to delete them' % (
              len(skipped), train_dir))
    return None
  problem = mismatch(checkpoint, variables, can_rebuild)
  if problem:
    raise TrainDirError(
        '--train_dir=%s holds a checkpoint of a different model (%s): use '
        'another --train_dir, or --fresh_start to delete it' % (train_dir,
                                                                problem))
  # Damaged ones are newer: left alone, and replaced when their step is
  # saved again.
  older = sorted((p for p in candidates(train_dir)
                  if step_of(p) < step_of(checkpoint)), key=step_of)
  return Resume(checkpoint, int(tf.train.load_variable(checkpoint,
                                                       'global_step')),
                missing_from(checkpoint, variables), older)


def save(saver, session, train_dir, step, **kwargs):
  """Writes model.ckpt-N, N the global step the checkpoint holds.

  In a cluster the step is read before the save, and the chief's sync
  thread (synchronous) or the other workers (asynchronous) can apply an
  update in between: the checkpoint would hold a later step than its name,
  and everything that reads names (the resume, the evaluator, which keeps
  the newest) would be off by that many. The step it holds is read back
  from the files and, where it differs, the files are renamed to it.

  Args:
    saver: The Saver that writes it.
    session: The session whose variables it saves.
    train_dir: --train_dir.
    step: The global step read before the save.
    **kwargs: For Saver.save (write_meta_graph).

  Returns:
    The checkpoint's path.
  """
  prefix = os.path.join(train_dir, 'model.ckpt')
  path = saver.save(session, prefix, global_step=step, **kwargs)
  held = int(tf.train.load_variable(path, 'global_step'))
  if held == step:
    return path
  named = '%s-%d' % (prefix, held)
  for old in glob.glob(glob.escape(path) + '.*'):
    os.replace(old, named + old[len(path):])
  paths = [p for p in saver.last_checkpoints if p not in (path, named)]
  saver.recover_last_checkpoints(paths + [named])
  tf1.train.update_checkpoint_state(
      train_dir, named, all_model_checkpoint_paths=paths + [named])
  return named


def keep_newest(saver, train_dir):
  """Deletes the checkpoints the saver keeps beyond its max_to_keep.

  A Saver deletes one old checkpoint per save, of those it has itself
  written or was told of (recover_last_checkpoints): told of a train_dir
  that already holds more (an earlier release forgot them at each
  restart), it would keep them all. Called after a save, so the newest
  checkpoint is always one just written.
  """
  paths = saver.last_checkpoints
  keep = saver.saver_def.max_to_keep
  if not keep or len(paths) <= keep:
    return
  for path in paths[:-keep]:
    try:
      tf1.train.remove_checkpoint(path)
    except (tf.errors.OpError, OSError):
      pass  # Gone already (deleted by hand, say).
  saver.recover_last_checkpoints(paths[-keep:])
  tf1.train.update_checkpoint_state(
      train_dir, paths[-1], all_model_checkpoint_paths=paths[-keep:])


# What the OS says when a write cannot be done; TensorFlow ends its status
# message with it.
WRITE_FAILURES = [os.strerror(e) for e in (
    errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
    errno.EFBIG, errno.EIO)]
# TensorFlow's atomic writes (the `checkpoint` file, graph.pbtxt) go
# through NAME.tmp<uuid>, left behind when the write itself fails.
ATOMIC_TEMP = re.compile(r'^(checkpoint|graph\.pbtxt)\.tmp[0-9a-f]{32}$')


def write_failure(train_dir, step, error, lost=None):
  """Cleans up after a failed save of step; returns the WriteError to raise.

  Removes what the save wrote: model.ckpt-STEP_temp/ (where the shards go
  before they are merged) and TensorFlow's atomic-write temporaries. The
  checkpoints themselves are not touched.

  Args:
    train_dir, step: Where, and of which step (None: the last, its step
      not read).
    error: The save's TensorFlow error.
    lost: Why, when the cause is a lost task of the cluster (the ps tasks
      that cannot be reached, liveness.lost_ps): a LostPsError.
  """
  if step is not None:
    shutil.rmtree(os.path.join(train_dir, 'model.ckpt-%d_temp' % step),
                  ignore_errors=True)
  for name in os.listdir(train_dir):
    if ATOMIC_TEMP.match(name):
      try:
        os.remove(os.path.join(train_dir, name))
      except OSError:
        pass
  text = str(error)
  cause = lost or next((f for f in WRITE_FAILURES if f in text),
                       log_filter.first_line(error))
  last, _ = newest_readable(train_dir)
  return (LostPsError if lost else WriteError)(
      'cannot write the %s in %s: %s. %s; %s' % (
          'last checkpoint' if step is None else
          'checkpoint of step %d' % step, train_dir, cause,
          'The last good checkpoint, %s, is kept' % last if last else
          'There is no earlier checkpoint',
          'start the lost task again, then this one: it resumes from there'
          if lost
          else 'free space or fix the directory, then restart to resume'))
