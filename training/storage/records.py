"""What a run records in --train_dir beside its checkpoints, checked when
it resumes: the data it trains on (data.json), the learning rate's
schedule (learning_rate.json), and what scripts/export_model.py needs
(export.json: whether its images were standardized, its class names).

A resumed run on other data, or with another schedule, says so in one line
(or stops, for other data without --new_data) instead of mixing them
silently. The exported model takes raw uint8 images, so it must preprocess
them as training did, and it answers with the class names of the data the
run trained on (batches.meta.txt).

What earlier releases of the suite wrote that this one still reads:
  * No data.json: the chief says so (no_data_record) and writes it.
  * No learning_rate.json: the run trained with the reference's schedule
    (EARLIER_SCHEDULE); the chief says what changes and the flags that keep
    it.
  * No export.json: the exporter asks for --standardize or --nostandardize
    and --class_names.
  * A checkpoint without the moving averages of the weights (the releases
    before they were kept): the chief resumes it, each average starting
    from its weight (partial_restore.Rebuild; checkpoints.resume_point
    accepts it when told which variables can be rebuilt). The evaluator
    tests its weights as they are (cifar10_eval.has_averages).
  * More checkpoints than the Saver keeps (a release that forgot them at
    each restart): checkpoints.keep_newest deletes the oldest after the
    next save.
The release before the redesign (commit 1018504) saved every variable as
this one does (tests/test_release_checkpoint.py).
"""

import json
import os

from training.graph import learning_rate
from training.storage import data_layout
from training.storage.checkpoints import TrainDirError


def no_data_record(train_dir):
  """What the chief adds to the line on its data when the train_dir it
  resumes has no data.json."""
  return ('; %s did not say what it was trained on before (an earlier '
          'release)' % train_dir)


# The learning rate of the releases before --lr_schedule, in Schedule's
# fields (their other values are not known: they were the run's flags).
EARLIER_SCHEDULE = {'kind': 'exponential', 'scaling': 'none', 'warmup_steps': 0}
EARLIER_SCHEDULE_SAID = ('the learning rate of an earlier release (the reference\'s '
                 'exponential schedule, unscaled, no warmup)')
EARLIER_SCHEDULE_FLAGS = ('--lr_schedule=%(kind)s --lr_scaling=%(scaling)s '
                  '--warmup_steps=%(warmup_steps)d' % EARLIER_SCHEDULE)


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
                              no_data_record(train_dir)
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
  changed = (learning_rate.changes(
      EARLIER_SCHEDULE if recorded is None else recorded, schedule)
             if resume and recorded != {} else [])
  if changed:
    say('%s was trained with %s; from global step %d on it follows this '
        'one (%s); give every task the earlier flags to keep %s' % (
            train_dir, 'another learning-rate schedule' if recorded else
            EARLIER_SCHEDULE_SAID, resume.step, ', '.join(changed),
            'it' if recorded else 'it: ' + EARLIER_SCHEDULE_FLAGS))
  if recorded == schedule._asdict():
    return
  try:
    with open(path + '.tmp', 'w') as f:
      json.dump(schedule._asdict(), f, indent=1)
    os.replace(path + '.tmp', path)
  except OSError as e:
    raise TrainDirError('cannot write %s: %s' % (path, e.strerror))


# Where the chief records what an export needs.
EXPORT_RECORD = 'export.json'


def class_names(data_dir):
  """The class names of data_dir: the lines of its batches.meta.txt that
  are not blank (as data_layout.num_classes counts them), or '0'..'9'
  without one."""
  path = os.path.join(data_dir, data_layout.META_FILE)
  if os.path.isfile(path):
    with open(path, 'rb') as f:
      names = [line.decode('utf-8', 'replace').strip()
               for line in f.read().splitlines() if line.strip()]
    if names:
      return names
  return [str(i) for i in range(data_layout.NUM_CLASSES)]


def write_export(train_dir, data_dir, *, standardize):
  """Records in train_dir what an export of this run needs.

  Args:
    train_dir: --train_dir, made.
    data_dir: The data the run trains on.
    standardize: --standardize.

  Raises:
    TrainDirError: when the record cannot be written.
  """
  record = {'standardize': bool(standardize),
            'class_names': class_names(data_dir)}
  path = os.path.join(train_dir, EXPORT_RECORD)
  if read_export(train_dir) == record:
    return
  try:
    with open(path + '.tmp', 'w', encoding='utf-8') as f:
      json.dump(record, f, indent=1, ensure_ascii=False)
    os.replace(path + '.tmp', path)
  except OSError as e:
    raise TrainDirError('cannot write %s: %s' % (path, e.strerror))


def read_export(train_dir):
  """The record of train_dir: {'standardize': bool, 'class_names': [str]},
  or None when there is none (an earlier release) or it is damaged."""
  try:
    with open(os.path.join(train_dir, EXPORT_RECORD), encoding='utf-8') as f:
      record = json.load(f)
  except (OSError, ValueError):
    return None
  if (not isinstance(record, dict) or
      not isinstance(record.get('standardize'), bool) or
      not isinstance(record.get('class_names'), list) or
      not all(isinstance(n, str) for n in record['class_names'])):
    return None
  return record
