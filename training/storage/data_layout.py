"""The CIFAR-10 binary files: their layout and their validation, without
TensorFlow.

cifar10_input (the trainer's and the evaluator's input pipeline) and
scripts/download_cifar10.py (which must not load TensorFlow: a failed
download is one line, with no TensorFlow log lines before it) both check the
data with these functions, so that what the downloader accepts is what the
trainer reads. cifar10_input re-exports every name here.
"""

import glob
import hashlib
import os
import re

import numpy as np

NUM_CLASSES = 10

# Record layout: 1 label byte, then 1024 red, 1024 green, 1024 blue bytes,
# each plane row-major 32x32.
cifar_label_bytes = 1
cifar_height = 32
cifar_width = 32
cifar_depth = 3
IMAGE_BYTES = cifar_height * cifar_width * cifar_depth
RECORD_BYTES = cifar_label_bytes + IMAGE_BYTES

TRAIN_PATTERN = 'data_batch_*.bin'
TEST_FILE = 'test_batch.bin'
# The class names, one a line (CIFAR-10's has 10, then blank lines).
META_FILE = 'batches.meta.txt'
MAX_CLASSES = 256  # What the label byte holds.


class DataError(ValueError):
  """The CIFAR-10 data on disk is missing or malformed."""


def data_files(data_dir, eval_data):
  """Returns the sorted list of files to read, checking that they exist.

  Args:
    data_dir: Directory holding `data_batch_*.bin` and `test_batch.bin`.
    eval_data: Python bool; True reads `test_batch.bin`, False the training
      files.

  Returns:
    A list of file paths, training files in numeric order.

  Raises:
    DataError: if the directory or the files are missing.
  """
  if not os.path.isdir(data_dir):
    raise DataError(
        'data directory %s does not exist: pass --data_dir=DIR holding the '
        'CIFAR-10 binary files, or make synthetic ones with '
        'scripts/make_synthetic_cifar10.py --data_dir=DIR' % data_dir)
  if eval_data:
    files = [os.path.join(data_dir, TEST_FILE)]
    if not os.path.isfile(files[0]):
      raise DataError('%s is missing: the test set of the CIFAR-10 binary '
                      'version is needed for evaluation' % files[0])
    return files
  files = glob.glob(os.path.join(data_dir, TRAIN_PATTERN))
  if not files:
    raise DataError('no %s in %s: --data_dir must hold the CIFAR-10 binary '
                    'files (cifar-10-batches-bin)' % (TRAIN_PATTERN, data_dir))
  return sorted(files, key=lambda f: [int(t) if t.isdigit() else t
                                      for t in re.split(r'(\d+)', f)])


def num_classes(data_dir):
  """Returns (number of classes, where it comes from): the names
  batches.meta.txt lists (your own images may have 2 or 200) and its path,
  or CIFAR-10's 10 and None without one.

  Raises:
    DataError: for a batches.meta.txt of more than MAX_CLASSES names.
  """
  path = os.path.join(data_dir, META_FILE)
  if not os.path.isfile(path):
    return NUM_CLASSES, None
  with open(path, 'rb') as f:
    names = [line for line in f.read().splitlines() if line.strip()]
  if len(names) > MAX_CLASSES:
    raise DataError('%s names %d classes, but a label byte holds at most %d'
                    % (path, len(names), MAX_CLASSES))
  return (len(names), path) if names else (NUM_CLASSES, None)


def count_records(files, classes=(NUM_CLASSES, None)):
  """Validates each file's size and labels; returns the number of records.

  Args:
    files: Paths of CIFAR-10 binary files.
    classes: num_classes() of their folder: labels go from 0 to its number
      minus 1.

  Returns:
    The total number of records in `files`.

  Raises:
    DataError: naming the first file whose size is not a positive multiple of
      the record size, or which holds a label byte of that number or more.
  """
  count, meta = classes
  total = 0
  for path in files:
    size = os.path.getsize(path)
    if size == 0 or size % RECORD_BYTES:
      raise DataError(
          '%s has %d bytes, not a positive multiple of the %d-byte CIFAR-10 '
          'record: the file is truncated or not CIFAR-10 binary data; '
          'download or generate it again' % (path, size, RECORD_BYTES))
    labels = np.fromfile(path, dtype=np.uint8).reshape(-1, RECORD_BYTES)[:, 0]
    bad = np.flatnonzero(labels >= count)
    if bad.size:
      raise DataError(
          '%s: record %d has label %d, but labels must be 0..%d (%s): the '
          'file is corrupt, or not CIFAR-10 data' % (
              path, bad[0], labels[bad[0]], count - 1,
              '%s names %d classes' % (meta, count) if meta else
              "CIFAR-10's 10 classes; for more, list their names in " +
              META_FILE))
    total += labels.size
  return total


def check_data(data_dir, eval_data):
  """Returns (files, number of records) after validating them.

  Args:
    data_dir: Directory of the CIFAR-10 binary files.
    eval_data: Python bool, True for the test set.

  Raises:
    DataError: with one line saying what is wrong and how to fix it.
  """
  files = data_files(data_dir, eval_data)
  return files, count_records(files, num_classes(data_dir))


def num_records(data_dir, eval_data):
  """Returns the number of records in the data files, from their sizes."""
  return sum(os.path.getsize(f) for f in data_files(data_dir, eval_data)
             ) // RECORD_BYTES


# Written beside the files by scripts/make_synthetic_cifar10.py: generated
# data is never taken for CIFAR-10.
SYNTHETIC_MARKER = 'SYNTHETIC.txt'
# The real CIFAR-10's training and test records.
CIFAR10_RECORDS = (50000, 10000)


def identity(data_dir):
  """What a training set is, to tell it from another one.

  Returns:
    A dict: 'data_dir' (absolute), 'kind' (what describe() says), 'files'
    ([name, records] of the training files, in order), 'records' (their
    sum) and 'sha256' (of their contents, in order: about 0.3 s for
    CIFAR-10's 150 MB).

  Raises:
    DataError: for missing or malformed files.
  """
  files, records = check_data(data_dir, eval_data=False)
  digest = hashlib.sha256()
  for path in files:
    with open(path, 'rb') as f:
      for block in iter(lambda f=f: f.read(1 << 22), b''):
        digest.update(block)
  return {'data_dir': os.path.abspath(data_dir),
          'kind': kind(data_dir),
          'files': [[os.path.basename(p), os.path.getsize(p) // RECORD_BYTES]
                    for p in files],
          'records': records, 'sha256': digest.hexdigest()}


def kind(data_dir):
  """'synthetic', 'CIFAR-10' (its record counts) or 'CIFAR-10 layout'
  (other data in its format: your own images, Fashion-MNIST...)."""
  if os.path.exists(os.path.join(data_dir, SYNTHETIC_MARKER)):
    return 'synthetic'
  try:
    counts = (num_records(data_dir, False), num_records(data_dir, True))
  except DataError:
    counts = None
  return 'CIFAR-10' if counts == CIFAR10_RECORDS else 'CIFAR-10 layout'


def describe(found):
  """One phrase for an identity(): 'synthetic data in DIR (5 files, 10000
  records, sha256 1a2b3c4d...)'."""
  return '%s data in %s (%d files, %d records, sha256 %s...)' % (
      found['kind'], found['data_dir'], len(found['files']),
      found['records'], found['sha256'][:12])
