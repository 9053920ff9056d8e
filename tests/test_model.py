"""The reference network: shape, size, BatchNorm, regularization, tf-slim fix."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import cifar10_model
import train_graph
from helpers import ROOT

tf1 = tf.compat.v1

# Weights of each layer (no conv biases: BatchNorm's beta replaces them) plus
# the BatchNorm betas (slim's default: no gamma) and the logits' bias.
CONV_WEIGHTS = [3 * 3 * 3 * 32, 3 * 3 * 32 * 32, 3 * 3 * 32 * 64,
                1 * 1 * 64 * 80, 3 * 3 * 80 * 192]
BETAS = [32, 32, 64, 80, 192]
LOGITS = 768 * 10 + 10
REFERENCE_TRAINABLE_PARAMS = sum(CONV_WEIGHTS) + sum(BETAS) + LOGITS


def build(is_training, batch=4):
  images = tf1.placeholder(tf.float32, [batch, 32, 32, 3])
  labels = tf1.placeholder(tf.int32, [batch])
  logits = cifar10_model.inference(images, is_training=is_training)
  return images, labels, logits, cifar10_model.loss(logits, labels)


def test_output_shape_and_scope_names():
  with tf.Graph().as_default():
    _, _, logits, _ = build(is_training=True)
    assert logits.shape.as_list() == [4, 10]
    names = {v.op.name for v in tf1.global_variables()}
  for layer in ['Conv2d_1a_3x3', 'Conv2d_2a_3x3', 'Conv2d_2b_3x3',
                'Conv2d_3b_1x1', 'Conv2d_4a_3x3']:
    for var in ['weights', 'BatchNorm/beta', 'BatchNorm/moving_mean',
                'BatchNorm/moving_variance']:
      assert 'InceptionResnetV2/%s/%s' % (layer, var) in names
  # No BatchNorm on the logits: a weight and a bias.
  assert {n for n in names if '/Logits/' in n} == {
      'InceptionResnetV2/Logits/weights', 'InceptionResnetV2/Logits/biases'}


def test_parameter_count_of_the_reference_network():
  with tf.Graph().as_default():
    build(is_training=True)
    trainable = tf1.trainable_variables()
    count = sum(int(np.prod(v.shape)) for v in trainable)
  assert REFERENCE_TRAINABLE_PARAMS == 179962
  assert count == REFERENCE_TRAINABLE_PARAMS
  assert not [v for v in trainable if 'moving' in v.op.name]


def test_regularization_is_in_the_loss():
  with tf.Graph().as_default():
    images, labels, logits, loss = build(is_training=False)
    reg = tf1.losses.get_regularization_losses()
    assert len(reg) == 6  # Five conv layers and the logits.
    xent = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))
    l2 = tf.add_n([tf.nn.l2_loss(v) for v in tf1.trainable_variables()
                   if v.op.name.endswith('weights')]) * 0.004
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      feed = {images: np.random.default_rng(0).normal(size=(4, 32, 32, 3)),
              labels: [0, 1, 2, 3]}
      loss_v, xent_v, l2_v = sess.run([loss, xent, l2], feed)
  assert l2_v > 0.01
  np.testing.assert_allclose(loss_v, xent_v + l2_v, rtol=1e-5)


@pytest.mark.parametrize('weight_decay, label_smoothing',
                         [(0.001, 0.1), (0.0, 0.2)])
def test_the_loss_with_its_weight_decay_and_label_smoothing(weight_decay,
                                                            label_smoothing):
  """--weight_decay and --label_smoothing, against the loss in numpy: the
  mean over the batch of -sum(target x log softmax), the target
  1 - s + s / 10 on the label and s / 10 elsewhere, plus weight_decay x
  half the weights' squares (slim's l2_regularizer, not the biases), every
  variable random (the biases and offsets start at zero)."""
  rng = np.random.default_rng(0)
  feed_images = rng.normal(size=(4, 32, 32, 3))
  feed_labels = [0, 3, 9, 3]
  with tf.Graph().as_default():
    images = tf1.placeholder(tf.float32, [4, 32, 32, 3])
    labels = tf1.placeholder(tf.int32, [4])
    logits = cifar10_model.inference(images, is_training=False,
                                     weight_decay=weight_decay)
    loss = cifar10_model.loss(logits, labels, label_smoothing)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      for var in tf1.trainable_variables():
        var.load(rng.normal(scale=0.1, size=var.shape), sess)
      loss_v, logits_v, weights = sess.run(
          [loss, logits, [v for v in tf1.trainable_variables()
                          if v.op.name.endswith('weights')]],
          {images: feed_images, labels: feed_labels})
  logits_v = logits_v.astype(np.float64)
  log_softmax = logits_v - np.log(np.exp(logits_v).sum(1, keepdims=True))
  targets = np.full((4, 10), label_smoothing / 10)
  targets[np.arange(4), feed_labels] += 1 - label_smoothing
  expected = -(targets * log_softmax).sum(1).mean() + weight_decay * sum(
      (w.astype(np.float64)**2).sum() / 2 for w in weights)
  assert len(weights) == 6
  np.testing.assert_allclose(loss_v, expected, rtol=1e-5)


def test_batchnorm_statistics_update_in_a_training_step_only():
  with tf.Graph().as_default():
    images, labels, _, loss = build(is_training=True)
    updates = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
    assert len(updates) == 10  # Mean and variance of five BatchNorms.
    train_op = tf.group(
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss), *updates)
    mean = [v for v in tf1.global_variables()
            if v.op.name == 'InceptionResnetV2/Conv2d_1a_3x3/BatchNorm/'
            'moving_mean'][0]
    feed = {images: np.full((4, 32, 32, 3), 5.0), labels: [0, 1, 2, 3]}
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run(loss, feed)  # A forward pass alone leaves them alone.
      assert not sess.run(mean).any()
      sess.run(train_op, feed)
      assert sess.run(mean).any()


@pytest.mark.parametrize('kwargs, decay', [({}, 0.995),
                                           ({'batch_norm_decay': 0.5}, 0.5)])
def test_batchnorm_statistics_move_by_their_decay(kwargs, decay):
  """--batch_norm_decay (the reference's 0.995 by default), through the
  updates the trainer runs: one moves the first BatchNorm's moving mean
  (1 - decay) of the way from 0 to the batch's, its variance from 1 to the
  batch's 0: photos of one value v give each channel v x the sum of its
  filter (no padding), everywhere."""
  with tf.Graph().as_default():
    images = tf1.placeholder(tf.float32, [4, 32, 32, 3])
    cifar10_model.inference(images, **kwargs)
    updates, _ = train_graph.statistics_updates(sync=None, worker=0)
    assert len(updates) == 10
    layer = 'InceptionResnetV2/Conv2d_1a_3x3/'
    weights, mean, variance = [
        tf1.global_variables(layer + name)[0] for name in (
            'weights', 'BatchNorm/moving_mean', 'BatchNorm/moving_variance')]
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      kernel = sess.run(weights)
      sess.run(updates, {images: np.full((4, 32, 32, 3), 5.0)})
      moved = sess.run([mean, variance])
  np.testing.assert_allclose(moved[0], (1 - decay) * 5.0 * kernel.sum(
      (0, 1, 2)), rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(moved[1], np.full(32, decay), rtol=1e-5,
                             atol=1e-6)


def test_inference_mode_uses_moving_statistics_and_no_dropout():
  with tf.Graph().as_default():
    images, _, logits, _ = build(is_training=False)
    assert not tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
    x = np.random.default_rng(1).normal(size=(4, 32, 32, 3))
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      full = sess.run(logits, {images: x})
      # Deterministic, and each example's logits do not depend on the
      # others in the batch (batch statistics would make them depend).
      np.testing.assert_array_equal(full, sess.run(logits, {images: x}))
      x2 = x.copy()
      x2[1:] = 0
      np.testing.assert_allclose(sess.run(logits, {images: x2})[0], full[0],
                                 rtol=1e-5)


SLIM_BATCH_NORM = """
import tensorflow as tf
%s
import tf_slim as slim
with tf.Graph().as_default():
  x = tf.compat.v1.placeholder(tf.float32, [2, 4])
  print(slim.batch_norm(x, is_training=True).shape.as_list())
"""


@pytest.mark.parametrize('fix, expected', [
    ('', "AttributeError: module 'tensorflow.python.framework.ops' has no "
         "attribute 'Tensor'"),
    ('import cifar10_model', '[2, 4]')])
def test_tf_slim_needs_and_gets_the_compatibility_fix(fix, expected):
  # In a fresh interpreter: tf-slim 1.1.0's batch_norm fails on TF 2.21
  # unless cifar10_model was imported first.
  proc = subprocess.run([sys.executable, '-c', SLIM_BATCH_NORM % fix],
                        capture_output=True, text=True, cwd=ROOT, timeout=120)
  assert expected in proc.stdout + proc.stderr, proc.stderr[-2000:]
  assert (proc.returncode == 0) == bool(fix)
