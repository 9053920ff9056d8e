"""What a run records in --train_dir for scripts/export_model.py: whether
its images were standardized, and its class names (export.json).

The exported model takes raw uint8 images, so it must preprocess them as
training did (--standardize), and it answers with class names, those of
the data the run trained on (batches.meta.txt). The chief writes the record
when it starts; a train_dir of an earlier release has none, and the
exporter then asks for --standardize or --nostandardize and --class_names.
No TensorFlow here.
"""

import json
import os

from training import data_layout
from training.checkpoints import TrainDirError

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


def write(train_dir, data_dir, *, standardize):
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
  if read(train_dir) == record:
    return
  try:
    with open(path + '.tmp', 'w', encoding='utf-8') as f:
      json.dump(record, f, indent=1, ensure_ascii=False)
    os.replace(path + '.tmp', path)
  except OSError as e:
    raise TrainDirError('cannot write %s: %s' % (path, e.strerror))


def read(train_dir):
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
