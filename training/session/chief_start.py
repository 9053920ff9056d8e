"""What the chief says and checks before its session: the data it trains
on, what it resumes, a changed schedule of the learning rate, a run already
at --max_steps, and what each ps holds."""

import sys

import tensorflow as tf

from training.graph import placement
from training.storage import checkpoints
from training.storage import partial_restore
from training.storage import records

tf1 = tf.compat.v1


def chief_start(train_dir, data, new_data, max_steps, num_ps, schedule,
                shadows, *, standardize=True):
  """What the chief says and checks before its session: the data it trains
  on (records.check_data_record), what it resumes, a schedule of the
  learning rate that changed, a run already at max_steps, and what each ps
  holds.

  Args:
    train_dir: --train_dir, made.
    data: data_layout.identity() of --data_dir.
    new_data: --new_data.
    max_steps: --max_steps.
    num_ps: The ps tasks.
    schedule: The learning_rate.Schedule of this run.
    shadows: {moving average: its weight}: the averages a checkpoint of an
      earlier release may lack and that start from their weights.
    standardize: --standardize, recorded for scripts/export_model.py with
      the class names (records.write_export).

  Returns:
    The checkpoints.Resume to resume from, or None.
  """
  resume = checkpoints.resume_point(train_dir, tf1.global_variables(),
                                    say_as_chief,
                                    partial_restore.can_rebuild(shadows))
  unused = resume and partial_restore.unused_line(resume.path,
                                                  tf1.global_variables())
  if unused:
    say_as_chief(unused)
  records.check_data_record(train_dir, data, resume, new_data,
                                say_as_chief)
  records.check_schedule_record(train_dir, schedule, resume,
                                    say_as_chief)
  records.write_export(train_dir, data['data_dir'], standardize=standardize)
  if resume and resume.step >= max_steps:
    say_as_chief('%s is at global step %d, at or past --max_steps=%d: '
                 'nothing to train, it stops at once (raise --max_steps to '
                 'train on, or --fresh_start to start over)' % (
                     resume.path, resume.step, max_steps))
  for line in placement.describe_loads(tf1.global_variables(), num_ps):
    say_as_chief(line)
  return resume


def say_as_chief(line):
  """Prints one of the chief's notes about its checkpoints."""
  print('Worker 0: %s' % line, file=sys.stderr, flush=True)
