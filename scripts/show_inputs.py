#!/usr/bin/env python3
"""Writes a grid of training images as the network gets them, to look at.

The reference imported matplotlib and left `#plt.imshow(reshaped_image)`
commented out: its author looked at the images. This draws the first
--num records of data_batch_1.bin twice, read by the trainer's own reader:
as plain decodes, and as the input pipeline hands them to the network
(cifar10_input.preprocess: random crop, flip, brightness, contrast, then
per-image standardization, undone for display by scaling each image to
0..1). Each is labelled with its class name from batches.meta.txt. Given a
--train_dir with a checkpoint, a third panel shows test images the model
(the moving averages of its weights, as the evaluator tests them) gets
wrong, each labelled "true -> predicted".

  python3 scripts/show_inputs.py --data_dir=./cifar-10-batches-bin \\
      --out=inputs.png [--train_dir=./models_cifar10]

It prints the labels of each panel, in order, one line each.
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from training.runtime import process  # pylint: disable=g-import-not-at-top,wrong-import-position
if __name__ == '__main__':
  process.start()  # Before TensorFlow loads.

import matplotlib  # pylint: disable=g-import-not-at-top,wrong-import-position
matplotlib.use('Agg')  # No screen needed.
from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

import cifar10_eval  # pylint: disable=g-import-not-at-top,wrong-import-position
import cifar10_input  # pylint: disable=g-import-not-at-top,wrong-import-position
import cifar10_model  # pylint: disable=g-import-not-at-top,wrong-import-position

tf1 = tf.compat.v1
COLUMNS = 8


def class_names(data_dir):
  """The class names of batches.meta.txt, one a line; '0'..'9' without it."""
  path = os.path.join(data_dir, cifar10_input.META_FILE)
  if not os.path.exists(path):
    return [str(i) for i in range(cifar10_input.NUM_CLASSES)]
  with open(path, errors='replace') as f:
    return [line.strip() for line in f if line.strip()]


def read_records(path, num, seed, crop_padding=cifar10_input.PAD_PIXELS,
                 erasing=0.0, erasing_fill='noise'):
  """The first num records of a file through the trainer's reader.

  Returns:
    (plain images, images as the network gets them, labels), numpy arrays:
    float 0..255 HWC, float standardized HWC, int.
  """
  with tf.Graph().as_default():
    tf1.set_random_seed(seed)
    files = tf1.FIFOQueue(1, tf.string, shapes=[])
    images, labels = cifar10_input.read_cifar10(files, num)
    plain = cifar10_input.preprocess(images, distort=False, standardize=False)
    network = cifar10_input.preprocess(images, distort=True, standardize=True,
                                       crop_padding=crop_padding,
                                       erasing=erasing,
                                       erasing_fill=erasing_fill)
    with tf1.Session() as sess:
      sess.run(files.enqueue(path))
      sess.run(files.close())
      return sess.run([plain, network, labels])


def misclassified(data_dir, train_dir, num):
  """Up to num test images the latest checkpoint gets wrong.

  Returns:
    (images float 0..255 HWC, true labels, predicted labels, number wrong,
    number of test records).
  """
  checkpoint = tf.train.latest_checkpoint(train_dir)
  if checkpoint is None:
    fail('no checkpoint in --train_dir=%s: train it first, or drop '
         '--train_dir' % train_dir)
  path = os.path.join(data_dir, 'test_batch.bin')
  records = np.fromfile(path, np.uint8).reshape(-1, cifar10_input.RECORD_BYTES)
  labels = records[:, 0].astype(np.int32)
  images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  with tf.Graph().as_default():
    x = tf1.placeholder(tf.float32, [None, 32, 32, 3])
    logits = cifar10_model.inference(
        tf.image.per_image_standardization(x), is_training=False,
        num_class=cifar10_input.num_classes(data_dir)[0])
    tf1.train.get_or_create_global_step()
    averaged, raw = cifar10_eval.restorers()
    saver = averaged if cifar10_eval.has_averages(checkpoint) else raw
    with tf1.Session() as sess:
      saver.restore(sess, checkpoint)
      predicted = np.concatenate([
          np.argmax(sess.run(logits, {x: images[i:i + 500]}), 1)
          for i in range(0, len(images), 500)])
  wrong = np.flatnonzero(predicted != labels)
  shown = wrong[:num]
  return (images[shown].astype(np.float32), labels[shown], predicted[shown],
          len(wrong), len(labels))


def for_display(image):
  """Scales an image to 0..1 (undoes the standardization's shift and
  scale, image by image)."""
  low, high = image.min(), image.max()
  return (image - low) / (high - low) if high > low else image * 0


def draw(panels, out):
  """Draws [(title, images, captions)] one under the other into out."""
  heights = []  # A thin row for each title, then the panel's image rows.
  for _, images, _ in panels:
    heights += [0.3] + [1.0] * -(-len(images) // COLUMNS)
  fig, axes = plt.subplots(len(heights), COLUMNS, squeeze=False,
                           figsize=(COLUMNS * 1.7, sum(heights) * 1.7),
                           gridspec_kw={'height_ratios': heights})
  for ax in axes.flat:
    ax.axis('off')
  row = 0
  for title, images, captions in panels:
    axes[row, 0].text(0, 0, title, fontsize=11, fontweight='bold',
                      transform=axes[row, 0].transAxes)
    row += 1
    for i, (image, caption) in enumerate(zip(images, captions)):
      ax = axes[row + i // COLUMNS, i % COLUMNS]
      ax.imshow(for_display(image), interpolation='nearest')
      ax.set_title(caption, fontsize=10)
    row += -(-len(images) // COLUMNS)
  fig.subplots_adjust(left=0.02, right=0.98, top=0.98, bottom=0.01,
                      hspace=0.35, wspace=0.15)
  fig.savefig(out, dpi=72)
  plt.close(fig)


def fail(message):
  """Ends with one line and status 2, as the suite's other scripts do."""
  print('Error: %s' % message, file=sys.stderr)
  sys.exit(2)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--data_dir', default='./cifar-10-batches-bin')
  parser.add_argument('--out', default='inputs.png', help='the PNG to write')
  parser.add_argument('--num', type=int, default=16,
                      help='images per panel (default: %(default)s)')
  parser.add_argument('--train_dir', default=None,
                      help='also show test images its latest checkpoint '
                      'gets wrong')
  parser.add_argument('--seed', type=int, default=0,
                      help='seed of the augmentation (default: %(default)s)')
  parser.add_argument('--crop_padding', type=int,
                      default=cifar10_input.PAD_PIXELS,
                      help="the trainer's --crop_padding (default: "
                      '%(default)s)')
  parser.add_argument('--random_erasing', type=float, default=0.0,
                      help="the trainer's --random_erasing (default: "
                      '%(default)s)')
  parser.add_argument('--erasing_fill', default='noise',
                      help="the trainer's --erasing_fill (default: "
                      '%(default)s)')
  args = parser.parse_args(argv)
  tf1.disable_eager_execution()
  if args.crop_padding < 0:
    fail('--crop_padding must be 0 or more (got %d)' % args.crop_padding)
  if not 0 <= args.random_erasing <= 1:
    fail('--random_erasing must be from 0 to 1 (got %g)' % args.random_erasing)
  if args.erasing_fill not in cifar10_input.ERASE_FILLS:
    fail('--erasing_fill must be one of %s (got %s)' % (
        ', '.join(cifar10_input.ERASE_FILLS), args.erasing_fill))
  try:
    files, _ = cifar10_input.check_data(args.data_dir, eval_data=False)
  except cifar10_input.DataError as e:
    fail(str(e))
  names = class_names(args.data_dir)
  first = sorted(files)[0]
  plain, network, labels = read_records(first, args.num, args.seed,
                                        args.crop_padding, args.random_erasing,
                                        args.erasing_fill)
  captions = [names[l] for l in labels]
  panels = [('%s, as decoded' % os.path.basename(first), plain, captions),
            ('the same, as the network gets them (augmented, standardized)',
             network, captions)]
  print('training images: %s' % ', '.join(captions))
  if args.train_dir:
    images, true, predicted, wrong, total = misclassified(
        args.data_dir, args.train_dir, args.num)
    pairs = ['%s -> %s' % (names[t], names[p]) for t, p in zip(true,
                                                              predicted)]
    panels.append(('test images it gets wrong (%d of %d)' % (wrong, total),
                   images, pairs))
    print('misclassified: %d of %d test images; shown: %s' % (
        wrong, total, ', '.join(pairs)))
  draw(panels, args.out)
  print('wrote %s' % args.out)
  return 0


if __name__ == '__main__':
  sys.exit(main())
