#!/usr/bin/env python3
"""TensorFlow 2's own parameter-server training of the same network: the
peer tools/benchmark.py measures this suite against.

TF2's `ParameterServerStrategy` with a `ClusterCoordinator` (asynchronous:
the only mode it has), the network of cifar10_model.py in plain TF2 ops in
a `tf.Module` (Keras 3 does not support the strategy), the same training
step (plain SGD on cross entropy plus the same L2 weight decay, BatchNorm's
moving statistics, and with --moving_averages the weights' moving averages
the trainer keeps), and the same files and augmentation through a `tf.data`
pipeline per worker (`create_per_worker_dataset`).

The ps and worker tasks only serve (`tf.distribute.Server`) until killed;
the coordinator (--job_name=chief) builds the model, trains --warmup_steps,
then --steps more, and prints one JSON line: the steady state's images/s,
and when (time.time()) the warmup and the run ended.

  python3 tools/tf2_peer.py --job_name=ps --task_index=0 --ps_hosts=... --worker_hosts=... --chief_host=...
  python3 tools/tf2_peer.py --job_name=chief --data_dir=DIR --ps_hosts=... --worker_hosts=... --chief_host=...
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from training.runtime import process  # pylint: disable=g-import-not-at-top,wrong-import-position
if __name__ == '__main__':
  process.start()  # Before TensorFlow loads.

import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

from training.storage import data_layout  # pylint: disable=g-import-not-at-top,wrong-import-position
import cifar10_input  # pylint: disable=g-import-not-at-top,wrong-import-position
import cifar10_model  # pylint: disable=g-import-not-at-top,wrong-import-position

# The trainer's layers (cifar10_model.inference_in): (kind, kernel, stride,
# padding, output channels); every conv is followed by BatchNorm (an offset,
# no scale: slim's default) and ReLU.
LAYERS = (('conv', 3, 2, 'VALID', 32), ('conv', 3, 1, 'VALID', 32),
          ('conv', 3, 1, 'SAME', 64), ('pool', 3, 2, 'VALID', None),
          ('conv', 1, 1, 'VALID', 80), ('conv', 3, 1, 'VALID', 192),
          ('pool', 2, 2, 'VALID', None))
FLAT = 192 * 2 * 2
KEEP_PROB = 0.8  # The trainer's dropout_keep_prob.


class Network(tf.Module):
  """cifar10_model's network, its weights and BatchNorm statistics."""

  def __init__(self, num_classes):
    super().__init__()
    self.kernels, self.offsets, self.means, self.variances = [], [], [], []
    channels = 3
    for kind, size, _, _, out in LAYERS:
      if kind != 'conv':
        continue
      self.kernels.append(tf.Variable(xavier([size, size, channels, out])))
      self.offsets.append(tf.Variable(tf.zeros([out])))
      self.means.append(tf.Variable(tf.zeros([out]), trainable=False))
      self.variances.append(tf.Variable(tf.ones([out]), trainable=False))
      channels = out
    self.logits_w = tf.Variable(xavier([FLAT, num_classes]))
    self.logits_b = tf.Variable(tf.zeros([num_classes]))

  def weights(self):
    """What the L2 weight decay applies to, as in slim's arg_scope."""
    return self.kernels + [self.logits_w]

  def train_vars(self):
    return self.kernels + self.offsets + [self.logits_w, self.logits_b]

  def total_loss(self, logits, labels):
    """Mean cross entropy plus the L2 weight decay, as cifar10_model.loss."""
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels, logits)) + cifar10_model.WEIGHT_DECAY * tf.add_n(
            [tf.nn.l2_loss(w) for w in self.weights()])

  def __call__(self, images, keep_prob=KEEP_PROB):
    """Logits in training mode, and the BatchNorm statistics' updates."""
    net, conv, updates = images, 0, []
    for kind, size, stride, padding, _ in LAYERS:
      if kind == 'pool':
        net = tf.nn.max_pool2d(net, size, stride, padding)
        continue
      net = tf.nn.conv2d(net, self.kernels[conv], stride, padding)
      mean, variance = tf.nn.moments(net, [0, 1, 2])
      net = tf.nn.relu(tf.nn.batch_normalization(
          net, mean, variance, self.offsets[conv], None,
          cifar10_model.BATCH_NORM_EPSILON))
      decay = cifar10_model.BATCH_NORM_DECAY
      updates += [self.means[conv].assign(
          decay * self.means[conv] + (1 - decay) * mean),
                  self.variances[conv].assign(
                      decay * self.variances[conv] + (1 - decay) * variance)]
      conv += 1
    net = tf.reshape(net, [-1, FLAT])
    if keep_prob < 1:
      net = tf.nn.dropout(net, rate=1 - keep_prob)
    return tf.matmul(net, self.logits_w) + self.logits_b, updates


def xavier(shape):
  """slim's xavier_initializer (uniform, fan in + fan out)."""
  receptive = 1
  for d in shape[:-2]:
    receptive *= d
  limit = (6.0 / ((shape[-2] + shape[-1]) * receptive)) ** 0.5
  return tf.random.uniform(shape, -limit, limit)


def dataset(files, shuffle_buffer, batch_size):
  """The training files through tf.data, augmented as the trainer's queue
  augments them (cifar10_input.preprocess), shuffled as much."""

  def decode(values):
    records = tf.io.decode_raw(values, tf.uint8)
    images = tf.transpose(tf.reshape(records[:, 1:], [-1, 3, 32, 32]),
                          [0, 2, 3, 1])
    return (cifar10_input.preprocess(images, True, True),
            tf.cast(records[:, 0], tf.int32))

  return (tf.data.FixedLengthRecordDataset(files, cifar10_input.RECORD_BYTES)
          .shuffle(shuffle_buffer)
          .repeat().batch(batch_size, drop_remainder=True)
          .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
          .prefetch(tf.data.AUTOTUNE))


def cluster_spec(args):
  return tf.train.ClusterSpec({'ps': args.ps_hosts.split(','),
                               'worker': args.worker_hosts.split(','),
                               'chief': [args.chief_host]})


def serve(args):
  """A ps or worker task: serves the coordinator until killed."""
  server = tf.distribute.Server(cluster_spec(args), job_name=args.job_name,
                                task_index=args.task_index, protocol='grpc',
                                start=True)
  print('%s %d: serving on %s' % (args.job_name, args.task_index,
                                  server.target), flush=True)
  server.join()


def coordinate(args):
  """Trains and measures; prints one JSON line."""
  started = time.time()
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      cluster_spec(args), task_type='chief', task_id=0, rpc_layer='grpc')
  strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
      strategy)
  num_classes, _ = data_layout.num_classes(args.data_dir)
  with strategy.scope():
    model = Network(num_classes)
    step = tf.Variable(0, dtype=tf.int64)
    averages = ([tf.Variable(v) for v in model.train_vars()]
                if args.moving_averages else [])
  # The files are checked here: the function below is traced on each worker.
  files, num_records = cifar10_input.check_data(args.data_dir, False)
  buffer, _ = cifar10_input.queue_sizes(num_records, args.batch_size)
  # Unseeded: a seed would give both workers the same batches in the same
  # order (the function cannot tell which worker it runs on).
  per_worker = coordinator.create_per_worker_dataset(
      lambda: dataset(files, buffer, args.batch_size))
  iterator = iter(per_worker)
  decay_ceiling = cifar10_model.MOVING_AVERAGE_DECAY
  rate = args.learning_rate

  @tf.function
  def train_step(it):
    def replica(images, labels):
      with tf.GradientTape() as tape:
        logits, updates = model(images)
        loss = model.total_loss(logits, labels)
      train_vars = model.train_vars()
      grads = tape.gradient(loss, train_vars)
      with tf.control_dependencies(updates):
        applied = [v.assign_sub(rate * g) for v, g in zip(train_vars, grads)]
      with tf.control_dependencies(applied):
        n = step.assign_add(1)
      if averages:  # ExponentialMovingAverage with num_updates.
        n_float = tf.cast(n, tf.float32)
        decay = tf.minimum(decay_ceiling, (1. + n_float) / (10. + n_float))
        for a, v in zip(averages, train_vars):
          a.assign(decay * a + (1. - decay) * v)
      return loss
    images, labels = next(it)
    return strategy.run(replica, args=(images, labels))

  for _ in range(args.warmup_steps):
    coordinator.schedule(train_step, args=(iterator,))
  coordinator.join()
  first = time.time()
  for _ in range(args.steps):
    last = coordinator.schedule(train_step, args=(iterator,))
  coordinator.join()
  end = time.time()
  print(json.dumps({
      'images_per_sec': args.steps * args.batch_size / (end - first),
      'warmup_done_secs': first - started,
      'warmup_done_at': first, 'ended_at': end,
      'global_step': int(step.numpy()),
      'last_loss': float(last.fetch())}), flush=True)


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--job_name', required=True,
                      choices=['ps', 'worker', 'chief'])
  parser.add_argument('--task_index', type=int, default=0)
  parser.add_argument('--ps_hosts', required=True)
  parser.add_argument('--worker_hosts', required=True)
  parser.add_argument('--chief_host', required=True)
  parser.add_argument('--data_dir')
  parser.add_argument('--batch_size', type=int, default=128)
  parser.add_argument('--steps', type=int, default=100,
                      help='steps measured, after the warmup')
  parser.add_argument('--warmup_steps', type=int, default=20)
  parser.add_argument('--learning_rate', type=float, default=0.1)
  parser.add_argument('--moving_averages', action='store_true',
                      help="also keep the weights' moving averages, as the "
                      'trainer does')
  return parser.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  if args.job_name == 'chief':
    coordinate(args)
  else:
    serve(args)
  return 0


if __name__ == '__main__':
  sys.exit(main())
