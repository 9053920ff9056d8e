"""What a run records in --train_dir beside its checkpoints, and checks when
it resumes: the data it trains on (data.json) and the learning rate's
schedule (learning_rate.json).

A resumed run on other data, or with another schedule, says so in one line
(or stops, for other data without --new_data) instead of mixing them
silently.
"""

import json
import os

from training import data_layout
from training import earlier_releases
from training import learning_rate
from training.checkpoints import TrainDirError


# Where the chief records what the run trains on (data_layout.identity).
DATA_RECORD = 'data.json'


def check_data_record(train_dir, found, resume, new_data, say):
  """Records in train_dir the training set a run trains on; stops a chief
  that would resume it on another one.

  Args:
    train_dir: --train_dir, made.
    found: data_layout.identity() of --data_dir.
    resume: The checkpoints.Resume the chief resumes, or None.
    new_data: --new_data: resume on other data (fine-tuning), recorded.
    say: Called with one line: what it trains on.

  Raises:
    TrainDirError: resuming on data other than the recorded one, without
      new_data; or when the record cannot be written.
  """
  path = os.path.join(train_dir, DATA_RECORD)
  try:
    with open(path) as f:
      recorded = json.load(f)
    recorded = recorded if data_layout.describe(recorded) else None
  except (OSError, ValueError, TypeError, KeyError):
    recorded = None  # A new run, one from before the record, or a damaged one.
  if resume and recorded and recorded['sha256'] != found['sha256']:
    if not new_data:
      raise TrainDirError(
          '--train_dir=%s was trained on %s, not on the --data_dir given, %s: '
          'pass the --data_dir it was trained on, another --train_dir, '
          '--fresh_start to start over, or --new_data to train it on this data' % (train_dir, data_layout.describe(recorded),
                    data_layout.describe(found)))
    say('--new_data: %s was trained on %s; it trains on %s from now on' % (
        train_dir, data_layout.describe(recorded),
        data_layout.describe(found)))
  else:
    say('training on %s%s' % (data_layout.describe(found),
                              earlier_releases.no_data_record(train_dir)
                              if resume and not recorded else ''))
    if recorded and recorded['sha256'] == found['sha256']:
      return
  try:
    with open(path + '.tmp', 'w') as f:
      json.dump(found, f, indent=1)
    os.replace(path + '.tmp', path)
  except OSError as e:
    raise TrainDirError('cannot write %s: %s' % (path, e.strerror))


# Where the chief records the learning rate's schedule the run trains with.
SCHEDULE_RECORD = 'learning_rate.json'


def check_schedule_record(train_dir, schedule, resume, say):
  """Records in train_dir the learning rate's schedule; says when a resumed
  run's is not the one it was trained with (a new --max_steps moves a cosine
  schedule; a new release may have other defaults).

  Args:
    train_dir: --train_dir, made.
    schedule: The learning_rate.Schedule of this run.
    resume: The checkpoints.Resume the chief resumes, or None.
    say: Called with one line.

  Raises:
    TrainDirError: when the record cannot be written.
  """
  path = os.path.join(train_dir, SCHEDULE_RECORD)
  try:
    with open(path) as f:
      recorded = json.load(f)
    if not isinstance(recorded, dict):
      raise ValueError('not a record')
  except FileNotFoundError:
    recorded = None  # A new run, or one from an earlier release.
  except (OSError, ValueError) as e:
    recorded = {}  # Damaged: nothing to compare with.
    if resume:
      say('%s cannot be read (%s): it is written again, with this run\'s '
          'learning rate' % (path, e))
  changed = (learning_rate.changes(recorded, schedule)
             if resume and recorded != {} else [])
  if changed:
    say('%s was trained with %s; from global step %d on it follows this '
        'one (%s); give every task the earlier flags to keep %s' % (
            train_dir, 'another learning-rate schedule' if recorded else
            earlier_releases.SCHEDULE_SAID, resume.step, ', '.join(changed),
            'it' if recorded else 'it: ' + earlier_releases.SCHEDULE_FLAGS))
  if recorded == schedule._asdict():
    return
  try:
    with open(path + '.tmp', 'w') as f:
      json.dump(schedule._asdict(), f, indent=1)
    os.replace(path + '.tmp', path)
  except OSError as e:
    raise TrainDirError('cannot write %s: %s' % (path, e.strerror))
