#!/usr/bin/env python3
"""Classifies your own images with a model scripts/export_model.py wrote.

Each image, PNG or JPEG of any size, becomes 32x32 RGB exactly as
scripts/make_cifar_binary.py converts images for training (its fit():
scaled and cropped at its centre, grey repeated in the three planes); the
model, loaded with plain tf.saved_model.load, does the rest. One line an
image, its top classes with their probabilities:

  python3 scripts/classify_images.py --model_dir=./export photo.jpg
  photo.jpg: cat 0.91, dog 0.05, frog 0.02

A bad input (an image that cannot be read, a --model_dir that is not an
export) is one line, `Error: ...`, exit status 2.
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from training.runtime import process  # pylint: disable=g-import-not-at-top,wrong-import-position
if __name__ == '__main__':
  process.start()  # Before TensorFlow loads.

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import make_cifar_binary  # pylint: disable=g-import-not-at-top,wrong-import-position

SIGNATURE = 'serving_default'
NAMES_FILE = os.path.join('assets', 'class_names.txt')
BATCH = 256  # Images a call.


class ClassifyError(Exception):
  """The images cannot be classified; the message says why and what to
  do."""


def read_images(paths):
  """uint8 [n, 32, 32, 3] RGB of the image files, converted as
  make_cifar_binary converts them for training."""
  from PIL import Image, UnidentifiedImageError  # pylint: disable=g-import-not-at-top
  images = np.empty((len(paths), make_cifar_binary.SIZE,
                     make_cifar_binary.SIZE, 3), np.uint8)
  for i, path in enumerate(paths):
    try:
      with Image.open(path) as image:
        images[i] = make_cifar_binary.fit(image).transpose(1, 2, 0)
    except (OSError, UnidentifiedImageError, ValueError) as e:
      raise ClassifyError('%s cannot be read as an image (%s): give PNG or '
                          'JPEG files' % (path, e))
  return images


def check_model_dir(model_dir):
  """The class names of an export; refuses a folder that is not one."""
  if not (os.path.isfile(os.path.join(model_dir, 'saved_model.pb')) and
          os.path.isfile(os.path.join(model_dir, NAMES_FILE))):
    raise ClassifyError(not_an_export(model_dir))
  with open(os.path.join(model_dir, NAMES_FILE), encoding='utf-8') as f:
    return f.read().splitlines()


def not_an_export(model_dir):
  """The line for a --model_dir that is not an export."""
  return ('--model_dir=%s is not a model exported by scripts/export_model.py '
          '(it has no saved_model.pb with a %s signature and %s): pass the '
          '--export_dir it wrote' % (model_dir, SIGNATURE, NAMES_FILE))


def probabilities(model_dir, images):
  """The model's probabilities [n, classes] for the images."""
  # TensorFlow loads only now: a bad image or folder is said at once.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.get_logger().setLevel('ERROR')
  try:
    model = tf.saved_model.load(model_dir)
    serve = model.signatures[SIGNATURE]
  except (OSError, ValueError, KeyError, tf.errors.OpError):
    raise ClassifyError(not_an_export(model_dir))
  if (set(serve.structured_input_signature[1]) != {'images'} or
      'probabilities' not in serve.structured_outputs):
    raise ClassifyError(not_an_export(model_dir))
  return np.concatenate([
      serve(images=tf.constant(images[i:i + BATCH]))['probabilities'].numpy()
      for i in range(0, len(images), BATCH)])


def line(path, probs, names, top):
  """'photo.jpg: cat 0.91, dog 0.05, frog 0.02'."""
  best = np.argsort(-probs, kind='stable')[:top]
  return '%s: %s' % (path, ', '.join('%s %.2f' % (names[i], probs[i])
                                      for i in best))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('images', metavar='IMAGE', nargs='+',
                      help='PNG or JPEG files')
  parser.add_argument('--model_dir', default='./export',
                      help="scripts/export_model.py's --export_dir "
                      '(default: %(default)s)')
  parser.add_argument('--top', type=int, default=3,
                      help='classes shown an image (default: %(default)s)')
  args = parser.parse_args(argv)
  if args.top < 1:
    parser.error('--top must be at least 1')
  try:
    names = check_model_dir(args.model_dir)
    images = read_images(args.images)
    probs = probabilities(args.model_dir, images)
    if probs.shape[1] != len(names):
      raise ClassifyError(not_an_export(args.model_dir))
  except ClassifyError as e:
    print('Error: %s' % e, file=sys.stderr)
    return 2
  for path, p in zip(args.images, probs):
    print(line(path, p, names, args.top))
  return 0


if __name__ == '__main__':
  sys.exit(main())
