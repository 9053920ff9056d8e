"""The reference's small tf-slim conv/BatchNorm network for CIFAR-10.

Layer for layer and scope for scope the reference network, with its bugs
fixed: the L2 weight decay is part of the loss, BatchNorm moving statistics
are ordinary non-trainable variables updated through the UPDATE_OPS
collection (the trainer decides when they run), the logits layer has no
BatchNorm, dropout only acts in training, and inference mode normalizes with
the moving statistics.
"""

import warnings

import tensorflow as tf

import cifar10_input
from training.runtime import tf_compat

tf_compat.tf_slim_compat()  # Before tf-slim is imported.
import tf_slim as slim  # pylint: disable=g-import-not-at-top

# tf-slim's layers call `layer.apply`, which TensorFlow deprecates with a
# UserWarning on first use: nothing a user of this network can act on.
warnings.filterwarnings('ignore', message='`layer.apply` is deprecated')

tf1 = tf.compat.v1

NUM_CLASSES = cifar10_input.NUM_CLASSES
WEIGHT_DECAY = 0.004
BATCH_NORM_DECAY = 0.995
BATCH_NORM_EPSILON = 0.001
# The network's trainable variables in float32 (179,962 parameters): what a
# worker reads from the ps tasks each step. tests/test_plan_cluster.py
# checks it against the built graph.
MODEL_BYTES = 719848
# The reference declared it and never used it. Here training keeps moving
# averages of the weights and the evaluator tests them, as TensorFlow's
# CIFAR-10 tutorial does. With num_updates the decay is min(0.9999,
# (1 + step) / (10 + step)): a short run averages over its last tens of
# steps, a long one over thousands. The last weights of a run at a learning
# rate of 0.1 are one noisy point; their average is a steadier model.
MOVING_AVERAGE_DECAY = 0.9999


def inference(images, is_training=True, dropout_keep_prob=0.8,
              num_class=NUM_CLASSES, reuse=tf1.AUTO_REUSE,
              weight_decay=WEIGHT_DECAY, batch_norm_decay=BATCH_NORM_DECAY):
  """Builds the network; returns logits [batch, num_class].

  Args:
    images: float32 [batch, 32, 32, 3].
    is_training: Python bool or bool tensor. True: BatchNorm normalizes with
      the batch statistics and adds its moving-average updates to
      tf.GraphKeys.UPDATE_OPS; dropout is on. False: moving statistics,
      no dropout.
    dropout_keep_prob: Probability of keeping an activation in training.
    num_class: Number of classes.
    reuse: Variable reuse, as in the reference.
    weight_decay: The L2 term's factor on the weights (the reference's
      0.004), collected for loss().
    batch_norm_decay: The share of the moving statistics each of their
      updates keeps (the reference's 0.995).
  """
  batch_norm_params = {
      'decay': batch_norm_decay,
      'epsilon': BATCH_NORM_EPSILON,
      # The moving statistics stay out of the trainable collection (so the
      # optimizer never sees them) and their updates go to UPDATE_OPS, so
      # they run with the training step, not with every forward pass.
      # Given as a list on purpose: slim compares this argument with the
      # UPDATE_OPS string by identity and, when it is that very string,
      # builds tf.layers.BatchNormalization, which TensorFlow 2.21 imports
      # from the tf_keras package. The list keeps slim on its own fused
      # batch norm: same variables and maths, one fused kernel, no tf_keras.
      'updates_collections': [tf1.GraphKeys.UPDATE_OPS],
  }
  with slim.arg_scope([slim.conv2d, slim.fully_connected],
                      weights_initializer=slim.initializers.xavier_initializer(),
                      weights_regularizer=slim.l2_regularizer(weight_decay),
                      normalizer_fn=slim.batch_norm,
                      normalizer_params=batch_norm_params):
    return inference_in(images, is_training=is_training,
                        dropout_keep_prob=dropout_keep_prob,
                        num_class=num_class, reuse=reuse)


def inference_in(inputs, is_training=True, dropout_keep_prob=0.8,
                 num_class=NUM_CLASSES, reuse=tf1.AUTO_REUSE,
                 scope='InceptionResnetV2'):
  """The layers, under the reference's scope names (see inference())."""
  with tf1.variable_scope(scope, 'InceptionResnetV2', [inputs], reuse=reuse):
    with slim.arg_scope([slim.batch_norm, slim.dropout],
                        is_training=is_training):
      with slim.arg_scope([slim.conv2d, slim.max_pool2d, slim.avg_pool2d],
                          stride=1, padding='SAME'):
        # 15 x 15 x 32
        net = slim.conv2d(inputs, 32, 3, stride=2, padding='VALID',
                          scope='Conv2d_1a_3x3')
        # 13 x 13 x 32
        net = slim.conv2d(net, 32, 3, padding='VALID', scope='Conv2d_2a_3x3')
        # 13 x 13 x 64
        net = slim.conv2d(net, 64, 3, scope='Conv2d_2b_3x3')
        # 6 x 6 x 64
        net = slim.max_pool2d(net, 3, stride=2, padding='VALID',
                              scope='MaxPool_3a_3x3')
        # 6 x 6 x 80
        net = slim.conv2d(net, 80, 1, padding='VALID', scope='Conv2d_3b_1x1')
        # 4 x 4 x 192
        net = slim.conv2d(net, 192, 3, padding='VALID', scope='Conv2d_4a_3x3')
        # 2 x 2 x 192
        net = slim.max_pool2d(net, 2, stride=2, padding='VALID',
                              scope='MaxPool_5a_3x3')
        net = tf.reshape(net, shape=[-1, 192 * 2 * 2])
        net = slim.dropout(net, dropout_keep_prob, scope='Dropout')
        # The reference normalized its logits too; logits get a bias instead.
        return slim.fully_connected(net, num_class, activation_fn=None,
                                    normalizer_fn=None, scope='Logits')


def batch_norm_decay(given, gradients_per_update):
  """BatchNorm's decay: the given one, else BATCH_NORM_DECAY to the power of
  the gradients an update aggregates.

  A synchronous update runs the moving statistics' update once, on the
  chief's batch, where one process runs it once a batch: the power keeps
  their window as many examples long.
  """
  if given is not None:
    return given
  return BATCH_NORM_DECAY ** gradients_per_update


def moving_averages(global_step=None):
  """The ExponentialMovingAverage of the weights (the trainable variables).

  Args:
    global_step: Training's global step, for num_updates; None to only name
      the averages (the evaluator's restore).
  """
  return tf1.train.ExponentialMovingAverage(MOVING_AVERAGE_DECAY,
                                            num_updates=global_step)


def averages_of_weights():
  """{moving average: its weight} for the averages of moving_averages()."""
  # ExponentialMovingAverage.average_name() of a new object would make the
  # name unique in this graph, where it is taken: the names are built here.
  suffix = '/' + moving_averages().name
  by_name = {v.op.name: v for v in tf1.global_variables()}
  return {by_name[w.op.name + suffix]: w for w in tf1.trainable_variables()
          if w.op.name + suffix in by_name}


def loss(logits, labels, label_smoothing=0.0):
  """Returns the total loss: mean cross entropy plus the L2 weight decay.

  Args:
    logits: float32 [batch, num_class], from inference().
    labels: integer [batch].
    label_smoothing: The share of each label spread evenly over all
      classes (Szegedy et al. 2016); 0: the one-hot labels, the reference's.
  """
  if label_smoothing:
    targets = tf.one_hot(labels, logits.shape[-1]) * (1 - label_smoothing) + (
        label_smoothing / logits.shape[-1])
    entropies = tf.nn.softmax_cross_entropy_with_logits(labels=targets,
                                                        logits=logits)
  else:
    entropies = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.int64), logits=logits)
  cross_entropy = tf.reduce_mean(entropies, name='cross_entropy')
  # None with --weight_decay=0 (slim then adds no term).
  regularization = tf.add_n(tf1.losses.get_regularization_losses() or [0.0],
                            name='regularization_loss')
  return tf.add(cross_entropy, regularization, name='total_loss')
