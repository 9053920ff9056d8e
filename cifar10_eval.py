"""The evaluator: each new checkpoint, on every test record exactly once.

The reference "tested" on training data, with the train op, in the middle of
training. This task runs apart from the cluster (it needs no ps and no
worker): it watches --train_dir, and for each new checkpoint reads every
record of test_batch.bin once, in order, through the same reader as
training, with BatchNorm in inference mode and dropout off. It restores the
checkpoint into its own local session, so it never writes to the training
variables or checkpoints; it writes only under train_dir/eval. A checkpoint
written again with the same content (a finished chief started again) is
not evaluated again, by this evaluator or a later one: results.jsonl
records what each result's checkpoint held.

Started by train_distributed.py --job_name=evaluator.
"""

from datetime import datetime
import hashlib
import json
import os
import sys
import time

import tensorflow as tf

from training.runtime import log_filter
from training.storage import checkpoints
from training.storage import data_layout
from training.storage import records
import cifar10_input
import cifar10_model

tf1 = tf.compat.v1

EVAL_SUBDIR = 'eval'
RESULTS_FILE = 'results.jsonl'


def build_eval_graph(data_dir, batch_size, standardize, flips=False):
  """Builds the evaluation graph in the default graph.

  Args:
    data_dir, batch_size, standardize: The test set, read as training did.
    flips: Also count what is classified correctly from the mean of each
      photo's logits and its mirror's (fetches' 'correct_flips').

  Returns:
    (fetches, restorers, local_init): fetches gives per batch the number of
    examples, the number classified correctly, the summed cross entropy, the
    regularization loss and the global step; restorers() restores the
    model's variables; local_init resets the epoch counter.
  """
  with tf.device('/cpu:0'):
    # One epoch, one thread, no shuffling: each record exactly once and a
    # smaller final batch for the remainder.
    images, labels = cifar10_input.generate_batch_inputs(
        eval_data=True, shuffle=False, data_dir=data_dir,
        batch_size=batch_size, num_preprocess_threads=1, distort=False,
        standardize=standardize, num_epochs=1)
  global_step = tf1.train.get_or_create_global_step()
  if flips:  # The photos and their mirrors in one batch: BatchNorm in
    # inference mode makes each photo's logits its own.
    images = tf.concat([images, tf.reverse(images, axis=[2])], 0)
  logits = cifar10_model.inference(
      images, is_training=False,
      num_class=data_layout.num_classes(data_dir)[0])
  if flips:
    logits, mirrored = tf.split(logits, 2)
  fetches = {
      'examples': tf.size(labels),
      'correct': tf.reduce_sum(tf.cast(tf1.nn.in_top_k(logits, labels, 1),
                                       tf.int32)),
      'xent_sum': tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=labels, logits=logits)),
      'regularization': tf.add_n(tf1.losses.get_regularization_losses()),
      'global_step': global_step,
  }
  if flips:
    fetches['correct_flips'] = tf.reduce_sum(tf.cast(tf1.nn.in_top_k(
        (logits + mirrored) / 2, labels, 1), tf.int32))
  return (fetches, restorers(), tf1.local_variables_initializer())


def restorers():
  """Savers that restore a checkpoint into the evaluation graph.

  Returns:
    (averaged, raw): averaged restores the moving averages of the weights
    into them (the model the evaluator tests); raw the weights as they are,
    for a checkpoint written without averages.
  """
  averaged = cifar10_model.moving_averages().variables_to_restore(
      tf1.trainable_variables())
  return tf1.train.Saver(averaged), tf1.train.Saver(tf1.global_variables())


def has_averages(checkpoint):
  """Whether checkpoint holds the moving averages of all the weights."""
  saved = {name for name, _ in tf.train.list_variables(checkpoint)}
  averages = cifar10_model.moving_averages()
  return all(averages.average_name(v) in saved
             for v in tf1.trainable_variables())


def evaluate_checkpoint(checkpoint, fetches, saver, local_init, config):
  """Returns a result dict for one checkpoint over the whole test file."""
  totals = {'examples': 0, 'correct': 0, 'xent_sum': 0.0}
  if 'correct_flips' in fetches:
    totals['correct_flips'] = 0
  with tf1.Session(config=config) as sess:
    saver.restore(sess, checkpoint)
    sess.run(local_init)
    coord = tf1.train.Coordinator()
    threads = tf1.train.start_queue_runners(sess, coord)
    try:
      while True:
        out = sess.run(fetches)
        for key in totals:
          totals[key] += out[key]
    except tf.errors.OutOfRangeError:
      pass  # The single epoch is done.
    finally:
      coord.request_stop()
      coord.join(threads)
  examples = int(totals['examples'])
  if not examples:  # Checked by the reader; kept from dividing by zero.
    raise cifar10_input.DataError('the test set gave no example to evaluate')
  result = {
      'step': int(out['global_step']),
      'loss': float(totals['xent_sum'] / examples + out['regularization']),
      'accuracy': float(totals['correct']) / examples,
      'examples': examples,
      'checkpoint': checkpoint,
      'wall_time': time.time(),
  }
  if 'correct_flips' in totals:
    result['accuracy_flips'] = float(totals['correct_flips']) / examples
  return result


def test_set_line(data_dir, train_dir):
  """What the evaluator tests on, and what the chief recorded training on
  where that is another folder."""
  data_dir = os.path.abspath(data_dir)
  line = 'Evaluator: testing on %s, %d records of %s data' % (
      os.path.join(data_dir, data_layout.TEST_FILE),
      data_layout.num_records(data_dir, True), data_layout.kind(data_dir))
  try:
    with open(os.path.join(train_dir, records.DATA_RECORD)) as f:
      trained = json.load(f)
    if trained['data_dir'] != data_dir:
      line += '; the chief trains on %s' % data_layout.describe(trained)
  except (OSError, ValueError, TypeError, KeyError):
    pass  # No record (yet), or a damaged one.
  return line


def test_line(result, when):
  """The reference's test line for a result, dated when (a datetime); with
  --eval_flips, its figure on a line of its own after it."""
  line = '%s: step %d, loss = %.2f ,Test accuracy = %.4f (%d examples)' % (
      when, result['step'], result['loss'], result['accuracy'],
      result['examples'])
  if 'accuracy_flips' in result:
    line += ('\n%s: step %d, Test accuracy with flips averaged = %.4f '
             '(--eval_flips)' % (when, result['step'],
                                 result['accuracy_flips']))
  return line


def report(result, eval_dir, writer):
  """Prints the test line, appends to results.jsonl, writes summaries."""
  print(test_line(result, datetime.fromtimestamp(result['wall_time'])),
        flush=True)
  with open(os.path.join(eval_dir, RESULTS_FILE), 'a') as f:
    f.write(json.dumps(result) + '\n')
  values = [
      tf1.Summary.Value(tag='test/accuracy', simple_value=result['accuracy']),
      tf1.Summary.Value(tag='test/loss', simple_value=result['loss'])]
  if 'accuracy_flips' in result:
    values.append(tf1.Summary.Value(tag='test/accuracy_flips',
                                    simple_value=result['accuracy_flips']))
  writer.add_summary(tf1.Summary(value=values), result['step'])
  writer.flush()


def run(train_dir, data_dir, batch_size, standardize, max_steps,
        eval_interval_secs, run_once, flips=False):
  """Evaluates checkpoints as they appear; returns the exit status.

  Args:
    train_dir: The chief's --train_dir.
    data_dir: Directory holding test_batch.bin.
    batch_size: Examples per evaluation batch.
    standardize: Must match the training run's --standardize.
    max_steps: Stop after evaluating a checkpoint at this step or later.
    eval_interval_secs: How often to look for a new checkpoint.
    run_once: Evaluate the latest checkpoint and return.
    flips: Also the accuracy with each photo's logits averaged with its
      mirror's (--eval_flips), reported beside the plain one.
  """
  train_dir = os.path.abspath(train_dir)
  eval_dir = os.path.join(train_dir, EVAL_SUBDIR)
  fetches, savers, local_init = build_eval_graph(data_dir, batch_size,
                                                 standardize, flips)
  tf1.get_default_graph().finalize()
  config = tf1.ConfigProto(allow_soft_placement=True,
                           device_count={'GPU': 0})
  print('Evaluator: watching %s every %g s; results in %s' %
        (train_dir, eval_interval_secs, os.path.join(eval_dir, RESULTS_FILE)),
        flush=True)
  print(test_set_line(data_dir, train_dir), flush=True)
  writer = None  # Made with the first result: a wrong --train_dir gets none.
  seen = set()  # Evaluated, gone, or unreadable: not tried again.
  test_file = os.path.join(os.path.abspath(data_dir), data_layout.TEST_FILE)
  evaluated = recorded(eval_dir, test_file, flips)  # {content: result}.
  while True:
    checkpoint = latest(train_dir, run_once)
    if run_once and (checkpoint is None or version(checkpoint) in seen):
      print('Error: no readable checkpoint in %s to evaluate: train first, '
            'or point --train_dir at the chief\'s' % train_dir,
            file=sys.stderr)
      return 1
    if checkpoint and version(checkpoint) not in seen:
      seen.add(version(checkpoint))
      digest = content(checkpoint)
      if digest in evaluated:
        if said_again(checkpoint, evaluated[digest], run_once, max_steps):
          return 0
        continue
      result = evaluate_new(checkpoint, fetches, savers, local_init, config)
      if result is None:
        continue
      result.update(index_sha256=digest, test_file=test_file)
      if digest:
        evaluated[digest] = result
      if writer is None:
        os.makedirs(eval_dir, exist_ok=True)
        writer = tf1.summary.FileWriter(eval_dir)
      report(result, eval_dir, writer)
      if run_once or result['step'] >= max_steps:
        writer.close()
        return 0
    time.sleep(eval_interval_secs)


def evaluate_new(checkpoint, fetches, savers, local_init, config):
  """Evaluates a checkpoint not seen before.

  Returns:
    Its result, or None to go on without it: it is gone, or cannot be read
    (which it says).

  Raises:
    checkpoints.TrainDirError: it is of another model; no later checkpoint
      will do better.
  """
  try:
    problem = checkpoints.mismatch(checkpoint, tf1.global_variables())
    if problem:
      raise checkpoints.TrainDirError(
          '%s is a checkpoint of a different model (%s): point --train_dir '
          'at a training run of this model' % (checkpoint, problem))
    averaged, raw = savers
    saver = averaged if has_averages(checkpoint) else raw
    if saver is raw:
      print('Evaluator: %s has no moving averages of the weights (an older '
            'run); evaluating its weights as they are' % checkpoint,
            flush=True)
    return evaluate_checkpoint(checkpoint, fetches, saver, local_init, config)
  except (tf.errors.NotFoundError, ValueError):
    # The chief keeps its 5 latest checkpoints; this one went meanwhile
    # (restore raises ValueError when its files are already gone).
    return None
  except (tf.errors.OutOfRangeError, tf.errors.DataLossError) as e:
    # Truncated or corrupted (a crash or a full disk mid-write): the next
    # checkpoint may be fine. Nothing is deleted.
    skip(checkpoint, log_filter.first_line(e))
    return None


def content(checkpoint):
  """What a checkpoint holds, as one string: the SHA-256 of its .index,
  which lists every tensor with its shape, its place in the data files and
  the CRC32C of its bytes. A finished chief started again writes
  model.ckpt-N anew with the same content: the same string. None: gone."""
  try:
    with open(checkpoint + '.index', 'rb') as f:
      return hashlib.sha256(f.read()).hexdigest()
  except OSError:
    return None


def recorded(eval_dir, test_file, flips=False):
  """{content: result} of the results.jsonl lines on test_file that say
  their checkpoint's content (an earlier release's do not: their
  checkpoints are evaluated again); with flips, of those with the flips'
  figure."""
  found = {}
  try:
    with open(os.path.join(eval_dir, RESULTS_FILE)) as f:
      for line in f:
        try:
          result = json.loads(line)
          if result['test_file'] == test_file and (
              not flips or 'accuracy_flips' in result):
            found[result['index_sha256']] = result
        except (ValueError, TypeError, KeyError):
          pass  # A line cut short by a crash, or of an earlier release.
  except OSError:
    pass  # None yet.
  return found


def said_again(checkpoint, earlier, run_once, max_steps):
  """Says that checkpoint holds a model evaluated already; at the end of
  the run (--run_once, --max_steps), with that result as it was printed.
  Returns whether the evaluator is done."""
  print('Evaluator: %s holds the model evaluated already (%s, %s): not '
        'evaluated again' % (checkpoint, os.path.basename(
            earlier['checkpoint']), RESULTS_FILE), flush=True)
  if not (run_once or earlier['step'] >= max_steps):
    return False
  print(test_line(earlier, datetime.fromtimestamp(earlier['wall_time'])),
        flush=True)
  return True


def version(checkpoint):
  """What tells one checkpoint from another: its path and when its index
  was written. The chief writes model.ckpt-N again after it fell back past
  a damaged model.ckpt-N (or a ps was lost after N was saved): a new
  checkpoint under the same name."""
  try:
    return checkpoint, os.stat(checkpoint + '.index').st_mtime_ns
  except OSError:
    return checkpoint, None  # Gone already; evaluate_new says nothing.


def latest(train_dir, readable):
  """The newest checkpoint in train_dir, or None.

  Args:
    train_dir: Where the chief writes them.
    readable: Whether to look past damaged ones (--run_once), saying so,
      for the newest that reads back whole.
  """
  if not readable:
    return tf.train.latest_checkpoint(train_dir)
  checkpoint, skipped = checkpoints.newest_readable(train_dir)
  for path, problem in skipped:
    skip(path, problem)
  return checkpoint


def skip(checkpoint, problem):
  print('Evaluator: cannot read the checkpoint %s (%s); skipping it' % (
      checkpoint, problem), file=sys.stderr, flush=True)
