#!/usr/bin/env python3
"""Exports a trained run as a SavedModel: uint8 images in, classes out.

The model the evaluator tests, out of the suite: the newest readable
checkpoint of --train_dir (or --checkpoint), its weights replaced by their
moving averages, BatchNorm on its moving statistics, no dropout, and the
preprocessing inside (the evaluator's per-image standardization when the
run trained with --standardize). Its signature serving_default takes
`images`, uint8 [N, 32, 32, 3] RGB, and returns `probabilities` float32
[N, classes], `class_index` int64 [N] and `class_name` string [N], the names
of the data the run trained on (also in assets/class_names.txt, one a
line). It loads in plain TensorFlow 2 (tf.saved_model.load), without this
suite or tf-slim, and in TF Serving.

The chief records in --train_dir (export.json) whether it standardized and
the class names; for a train_dir of an earlier release, without that
record, give --standardize or --nostandardize and --class_names.

  python3 scripts/export_model.py --train_dir=./models_cifar10 \\
      --export_dir=./export

A bad input (no checkpoint, a checkpoint of another model, an --export_dir
that holds files) is one line, `Error: ...`, exit status 2.
"""

import argparse
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from training.runtime import log_filter  # pylint: disable=g-import-not-at-top,wrong-import-position
from training.runtime import process  # pylint: disable=g-import-not-at-top,wrong-import-position
if __name__ == '__main__':
  process.start()  # Before TensorFlow loads.

import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

import cifar10_eval  # pylint: disable=g-import-not-at-top,wrong-import-position
import cifar10_input  # pylint: disable=g-import-not-at-top,wrong-import-position
import cifar10_model  # pylint: disable=g-import-not-at-top,wrong-import-position
from training.storage import checkpoints  # pylint: disable=g-import-not-at-top,wrong-import-position
from training.storage import records  # pylint: disable=g-import-not-at-top,wrong-import-position

tf1 = tf.compat.v1

SIGNATURE = 'serving_default'
NAMES_FILE = 'class_names.txt'  # In the export's assets/.
# The logits' biases: one per class, in every checkpoint of this model.
LOGITS_BIASES = 'InceptionResnetV2/Logits/biases'


class ExportError(Exception):
  """The export cannot be made; the message says why and what to do."""


def find_checkpoint(train_dir, checkpoint):
  """The checkpoint to export: --checkpoint (a path, or a name in
  train_dir), else the newest of train_dir that reads back whole."""
  if checkpoint:
    path = (checkpoint if os.path.exists(checkpoint + '.index') else
            os.path.join(train_dir, checkpoint))
    if not os.path.exists(path + '.index'):
      raise ExportError('--checkpoint=%s is not a checkpoint (there is no '
                        '%s.index): give one of --train_dir=%s, such as '
                        'model.ckpt-100' % (checkpoint, path, train_dir))
    problem = checkpoints.unreadable(path)
    if problem:
      raise ExportError('cannot read the checkpoint %s (%s): give another '
                        '--checkpoint' % (path, problem))
    return path
  path, skipped = checkpoints.newest_readable(train_dir)
  for damaged, problem in skipped:
    print('Export: cannot read the checkpoint %s (%s); skipping it' % (
        damaged, problem), file=sys.stderr, flush=True)
  if path is None:
    raise ExportError('no readable checkpoint in %s: train first, or point '
                      '--train_dir at the chief\'s' % os.path.abspath(
                          train_dir))
  # A train_dir copied or moved: its `checkpoint` file still names the
  # first folder. The copy in train_dir is the one meant.
  here = os.path.join(train_dir, os.path.basename(path))
  return here if os.path.exists(here + '.index') else path


def preprocessing(train_dir, standardize, class_names):
  """(standardize, class names): the flags given, else the run's record.

  Raises:
    ExportError: for a train_dir without the record (an earlier release)
      and without both flags.
  """
  record = records.read_export(train_dir) or {}
  if standardize is None:
    standardize = record.get('standardize')
  if class_names is None:
    class_names = record.get('class_names')
  if standardize is None or class_names is None:
    raise ExportError(
        '%s has no %s (an earlier release trained it): pass --standardize '
        '(the trainer\'s default) or --nostandardize, as it trained, and '
        '--class_names=NAME,NAME,... in the order of its data\'s %s' % (
            os.path.abspath(train_dir), records.EXPORT_RECORD,
            cifar10_input.META_FILE))
  return standardize, class_names


def check_model(checkpoint):
  """Returns the classes of the checkpoint's model (its logits' biases).

  Raises:
    ExportError: for a checkpoint of another model (the evaluator's line).
  """
  shape = dict(tf.train.list_variables(checkpoint)).get(LOGITS_BIASES)
  problem = ('%s: %s in the checkpoint' % (LOGITS_BIASES, shape or 'missing')
             if not shape or len(shape) != 1 else None)
  if not problem:
    with tf.Graph().as_default():
      cifar10_model.inference(
          tf1.placeholder(tf.float32, [None, cifar10_input.IMAGE_SIZE,
                                       cifar10_input.IMAGE_SIZE,
                                       cifar10_input.cifar_depth]),
          is_training=False, num_class=shape[0])
      problem = checkpoints.mismatch(checkpoint, tf1.global_variables())
  if problem:
    raise ExportError('%s is a checkpoint of a different model (%s): point '
                      '--train_dir at a training run of this model' % (
                          checkpoint, problem))
  return shape[0]


def build(*, standardize, num_class, names_file, flips=False):
  """Builds the exported graph in the default graph: uint8 images in,
  the evaluator's preprocessing and network, and what it answers; with
  flips, from the mean of each image's logits and its mirror's (the
  evaluator's --eval_flips).

  Returns:
    ({'images': placeholder}, {output name: tensor}).
  """
  images = tf1.placeholder(tf.uint8, [None, cifar10_input.IMAGE_SIZE,
                                      cifar10_input.IMAGE_SIZE,
                                      cifar10_input.cifar_depth],
                           name='images')
  inputs = cifar10_input.preprocess(images, distort=False,
                                    standardize=standardize)
  if flips:
    inputs = tf.concat([inputs, tf.reverse(inputs, axis=[2])], 0)
  logits = cifar10_model.inference(inputs, is_training=False,
                                   num_class=num_class)
  if flips:
    logits = tf.add_n(tf.split(logits, 2)) / 2
  class_index = tf.argmax(logits, 1, name='class_index')
  # The names from the asset, one a line: they travel with the model.
  asset = tf.constant(names_file, name='class_names_file')
  tf1.add_to_collection(tf1.GraphKeys.ASSET_FILEPATHS, asset)
  names = tf1.lookup.StaticHashTable(tf1.lookup.TextFileInitializer(
      asset, tf.int64, tf1.lookup.TextFileIndex.LINE_NUMBER, tf.string,
      tf1.lookup.TextFileIndex.WHOLE_LINE), default_value='')
  return {'images': images}, {
      'probabilities': tf.nn.softmax(logits, name='probabilities'),
      'class_index': class_index,
      'class_name': tf.identity(names.lookup(class_index), name='class_name')}


def export(checkpoint, export_dir, *, standardize, class_names, flips=False):
  """Writes the SavedModel of checkpoint (of this model, class_names'
  classes) to export_dir, whole or not at all.

  Returns:
    Whether it holds the moving averages of the weights (an earlier
    release's checkpoint may not: its weights are exported as they are).
  """
  partial = os.path.abspath(export_dir).rstrip('/') + '.part%d' % os.getpid()
  with tempfile.TemporaryDirectory() as names_dir, tf.Graph().as_default():
    names_file = os.path.join(names_dir, NAMES_FILE)
    with open(names_file, 'w', encoding='utf-8') as f:
      f.write(''.join(name + '\n' for name in class_names))
    inputs, outputs = build(standardize=standardize,
                            num_class=len(class_names), names_file=names_file,
                            flips=flips)
    averaged, raw = cifar10_eval.restorers()
    has_averages = cifar10_eval.has_averages(checkpoint)
    init_tables = tf1.tables_initializer()  # Before a session runs.
    builder = tf1.saved_model.Builder(partial)
    try:
      with tf1.Session(config=tf1.ConfigProto(device_count={'GPU': 0})) as sess:
        (averaged if has_averages else raw).restore(sess, checkpoint)
        builder.add_meta_graph_and_variables(
            sess, [tf.saved_model.SERVING], signature_def_map={
                SIGNATURE: tf1.saved_model.predict_signature_def(
                    inputs=inputs, outputs=outputs)},
            assets_collection=tf1.get_collection(
                tf1.GraphKeys.ASSET_FILEPATHS),
            main_op=init_tables, clear_devices=True, strip_default_attrs=True)
      builder.save()
      os.replace(partial, export_dir)
    finally:
      shutil.rmtree(partial, ignore_errors=True)
  return has_averages


def said(checkpoint, export_dir, has_averages, standardize, class_names,
         flips=False):
  """The lines that say what was exported."""
  count = len(class_names)
  return [
      'Exported %s (global step %d, %s) to %s' % (
          checkpoint, checkpoints.step_of(checkpoint),
          'the moving averages of its weights' if has_averages else
          'its weights as they are: an earlier release kept no moving '
          'averages', os.path.abspath(export_dir)),
      '%s: images uint8 [N,32,32,3]%s%s -> probabilities [N,%d], '
      'class_index [N], class_name [N] of %d classes: %s' % (
          SIGNATURE, ', standardized' if standardize else '',
          ', with their mirrors' if flips else '', count, count,
          ', '.join(class_names[:10]) + (', ...' if count > 10 else ''))]


def check_export_dir(export_dir):
  """Refuses an --export_dir that holds files: nothing is overwritten."""
  if os.path.exists(export_dir) and (not os.path.isdir(export_dir) or
                                     os.listdir(export_dir)):
    raise ExportError('--export_dir=%s already holds files: give a new '
                      'folder (TF Serving reads numbered versions, '
                      'EXPORT/1, EXPORT/2), or delete it first' % export_dir)


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--train_dir', default='./models_cifar10',
                      help='the trained run (default: %(default)s)')
  parser.add_argument('--checkpoint', default=None,
                      help='one of its checkpoints, e.g. model.ckpt-100 '
                      '(default: the newest readable)')
  parser.add_argument('--export_dir', default='./export',
                      help='where to write the SavedModel, a new folder '
                      '(default: %(default)s)')
  parser.add_argument('--standardize', dest='standardize', default=None,
                      action='store_const', const=True,
                      help='as the run trained, for a train_dir without '
                      'export.json (an earlier release\'s); given, it '
                      'overrides the record')
  parser.add_argument('--nostandardize', dest='standardize',
                      action='store_const', const=False)
  parser.add_argument('--class_names', default=None,
                      help='comma-separated, in label order, for a '
                      'train_dir without export.json; given, they override '
                      'the record')
  parser.add_argument('--eval_flips', action='store_true',
                      help='answer from the mean of each image\'s logits '
                      'and its mirror\'s, as the evaluator\'s --eval_flips')
  return parser.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  tf.get_logger().setLevel('ERROR')  # The TF1 API's deprecation notes.
  names = ([n for n in args.class_names.split(',') if n]
           if args.class_names is not None else None)
  try:
    check_export_dir(args.export_dir)
    checkpoint = os.path.abspath(find_checkpoint(args.train_dir,
                                                 args.checkpoint))
    count = check_model(checkpoint)
    standardize, names = preprocessing(args.train_dir, args.standardize,
                                       names)
    if len(names) != count:
      raise ExportError('the model of %s has %d classes, but %d class names '
                        'are given (%s): pass --class_names with %d' % (
                            checkpoint, count, len(names), ','.join(names),
                            count))
    has_averages = export(checkpoint, args.export_dir,
                          standardize=standardize, class_names=names,
                          flips=args.eval_flips)
    for line in said(checkpoint, args.export_dir, has_averages, standardize,
                     names, flips=args.eval_flips):
      print(line, flush=True)
  except ExportError as e:
    print('Error: %s' % e, file=sys.stderr)
    return 2
  except (OSError, tf.errors.OpError) as e:
    print('Error: could not export to %s: %s' % (
        args.export_dir, log_filter.first_line(e)), file=sys.stderr)
    return 2
  return 0


if __name__ == '__main__':
  sys.exit(main())
