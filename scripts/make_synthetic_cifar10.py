#!/usr/bin/env python3
"""Writes a synthetic dataset in the exact CIFAR-10 binary layout.

Files: data_batch_1.bin .. data_batch_5.bin, test_batch.bin and
batches.meta.txt, as in cifar-10-batches-bin. Each record is 1 label byte and
3072 image bytes (1024 red, 1024 green, 1024 blue, row-major 32x32).

Each image is a noisy background of one random colour with a shape of another
random colour at a random position and size. The class is the shape: filled
square, hollow square, disc, ring, plus, X, horizontal bar, vertical bar,
triangle pointing up, triangle pointing down. Every shape is symmetric under
a left-right flip, so the training augmentation keeps the labels true. The
network must find a shape of any colour anywhere in a noisy image: learnable,
but not by looking at one pixel or at the mean colour.

Deterministic for a given --seed and sizes. It writes SYNTHETIC.txt beside
the files, so that nothing takes them for CIFAR-10: the trainer records it
in --train_dir, and the evaluator and the local-cluster script say it. Its
default folder is not the one the real CIFAR-10 goes to.

  python scripts/make_synthetic_cifar10.py --data_dir=./synthetic-cifar-10-batches-bin
"""

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from training.storage import data_layout  # pylint: disable=g-import-not-at-top,wrong-import-position

NUM_CLASSES = 10
SIZE = 32
RECORD_BYTES = 1 + SIZE * SIZE * 3
NUM_TRAIN_FILES = 5
CLASS_NAMES = ['airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog',
               'horse', 'ship', 'truck']
NOISE_STDDEV = 16.0
MIN_RADIUS, MAX_RADIUS = 6, 9


def shape_masks(labels, dy, dx, r):
  """Returns bool masks [n, 32, 32]: where each record's shape is drawn.

  Args:
    labels: int [n], the shape of each record.
    dy, dx: float [n, 32, 32], pixel offsets from each record's shape centre.
    r: float [n, 1, 1], each shape's radius in pixels.
  """
  ay, ax = np.abs(dy), np.abs(dx)
  box = np.maximum(ay, ax)
  dist2 = dy ** 2 + dx ** 2
  inside = box <= r
  shapes = [
      inside,                                              # filled square
      inside & (box > r - 2),                              # hollow square
      dist2 <= r ** 2,                                     # disc
      (dist2 <= r ** 2) & (dist2 > (r - 2) ** 2),          # ring
      inside & ((ax <= 1) | (ay <= 1)),                    # plus
      inside & (np.abs(ax - ay) <= 1),                     # X
      (ax <= r) & (ay <= 1.5),                             # horizontal bar
      (ay <= r) & (ax <= 1.5),                             # vertical bar
      (ay <= r) & (ax <= (dy + r) / 2),                    # triangle, apex up
      (ay <= r) & (ax <= (r - dy) / 2),                    # triangle, apex down
  ]
  return np.choose(labels[:, None, None], shapes)


def make_records(num_records, rng):
  """Returns (labels uint8 [n], images uint8 [n, 3, 32, 32] in CHW order).

  Args:
    num_records: Number of records.
    rng: numpy Generator.
  """
  labels = rng.integers(0, NUM_CLASSES, size=num_records).astype(np.uint8)
  r = rng.integers(MIN_RADIUS, MAX_RADIUS + 1, size=num_records).astype(float)
  # Centres keep the whole shape in the image.
  cy = rng.uniform(r, SIZE - 1 - r)
  cx = rng.uniform(r, SIZE - 1 - r)
  yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64)
  mask = shape_masks(labels, yy[None] - cy[:, None, None],
                     xx[None] - cx[:, None, None], r[:, None, None])
  background = rng.uniform(0, 255, size=(num_records, 3))
  foreground = rng.uniform(0, 255, size=(num_records, 3))
  # Keep the two colours apart so that the shape is visible.
  too_close = np.abs(foreground - background).sum(axis=1) < 150
  foreground[too_close] = 255 - background[too_close]
  images = np.where(mask[:, None], foreground[:, :, None, None],
                    background[:, :, None, None])
  images += rng.normal(0, NOISE_STDDEV, size=images.shape)
  return labels, np.clip(np.rint(images), 0, 255).astype(np.uint8)


def write_batch_file(path, labels, images):
  """Writes records in the CIFAR-10 binary layout to `path`."""
  records = np.empty((labels.size, RECORD_BYTES), dtype=np.uint8)
  records[:, 0] = labels
  records[:, 1:] = images.reshape(labels.size, -1)
  tmp = path + '.tmp'
  records.tofile(tmp)
  os.replace(tmp, path)  # Never leave a half-written file under the real name.


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--data_dir', default='./synthetic-cifar-10-batches-bin',
                      help='where to write the files (default: %(default)s)')
  parser.add_argument('--train_records', type=int, default=2000,
                      help='records per data_batch_N.bin (default: '
                      '%(default)s; the real CIFAR-10 has 10000)')
  parser.add_argument('--test_records', type=int, default=2000,
                      help='records in test_batch.bin (default: %(default)s)')
  parser.add_argument('--num_train_files', type=int, default=NUM_TRAIN_FILES,
                      help='number of data_batch_N.bin files (default: '
                      '%(default)s)')
  parser.add_argument('--seed', type=int, default=0,
                      help='random seed (default: %(default)s)')
  args = parser.parse_args(argv)
  for name in ('train_records', 'test_records', 'num_train_files'):
    if getattr(args, name) < 1:
      parser.error('--%s must be at least 1' % name)

  os.makedirs(args.data_dir, exist_ok=True)
  rng = np.random.default_rng(args.seed)
  outputs = ['data_batch_%d.bin' % (i + 1)
             for i in range(args.num_train_files)] + ['test_batch.bin']
  for name in outputs:
    count = (args.test_records if name == 'test_batch.bin'
             else args.train_records)
    write_batch_file(os.path.join(args.data_dir, name),
                     *make_records(count, rng))
  with open(os.path.join(args.data_dir, 'batches.meta.txt'), 'w') as f:
    f.write('\n'.join(CLASS_NAMES) + '\n\n')
  with open(os.path.join(args.data_dir, data_layout.SYNTHETIC_MARKER),
            'w') as f:
    f.write('Synthetic data in the CIFAR-10 binary layout, written by '
            'scripts/make_synthetic_cifar10.py --seed=%d: coloured shapes, not '
            'CIFAR-10.\n' % args.seed)
  print('Wrote %d training and %d test records of synthetic CIFAR-10 to %s' %
        (args.train_records * args.num_train_files, args.test_records,
         args.data_dir))
  return 0


if __name__ == '__main__':
  sys.exit(main())
