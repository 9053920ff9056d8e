"""tools/tf2_peer.py, the benchmark's TensorFlow 2 peer: the same network
as the trainer's, computed the same way. (Its cluster runs in
test_benchmark.py, in the benchmark's own quick run.)"""

import numpy as np
import tensorflow as tf

import cifar10_model
import tf2_peer

tf1 = tf.compat.v1


def test_the_peers_forward_pass_loss_and_statistics_are_the_trainers():
  rng = np.random.RandomState(0)
  images = rng.normal(size=[8, 32, 32, 3]).astype(np.float32)
  labels = rng.randint(0, 10, size=[8]).astype(np.int32)
  with tf.Graph().as_default():
    ours = cifar10_model.inference(tf.constant(images), is_training=True,
                                   dropout_keep_prob=1.0)
    our_loss = cifar10_model.loss(ours, tf.constant(labels))
    cross_entropy = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.constant(labels), logits=ours))
    our_updates = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
    slim_vars = {v.op.name: v for v in tf1.global_variables()}
    peer = tf2_peer.Network(10)
    # The same 179,962 trainable parameters...
    assert sum(int(np.prod(v.shape)) for v in peer.train_vars()) == 179962
    # ... given the trainer's values, layer by layer.
    layers = ['Conv2d_1a_3x3', 'Conv2d_2a_3x3', 'Conv2d_2b_3x3',
              'Conv2d_3b_1x1', 'Conv2d_4a_3x3']
    pairs = [(peer.logits_w, 'Logits/weights'), (peer.logits_b,
                                                 'Logits/biases')]
    for i, layer in enumerate(layers):
      pairs += [(peer.kernels[i], layer + '/weights'),
                (peer.offsets[i], layer + '/BatchNorm/beta'),
                (peer.means[i], layer + '/BatchNorm/moving_mean'),
                (peer.variances[i], layer + '/BatchNorm/moving_variance')]
    copy = [mine.assign(slim_vars['InceptionResnetV2/' + name])
            for mine, name in pairs]
    theirs, peer_updates = peer(tf.constant(images), keep_prob=1.0)
    peer_loss = peer.total_loss(theirs, tf.constant(labels))
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      # Betas start at zero in both: give them values, so they count.
      sess.run([v.assign(rng.normal(size=v.shape.as_list()))
                for n, v in slim_vars.items() if n.endswith('beta')])
      sess.run(copy)
      a, b, loss_a, loss_b, ce = sess.run([ours, theirs, our_loss, peer_loss,
                                           cross_entropy])
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
      # The same loss, weight decay included (it adds 0.1 or more here).
      assert abs(loss_a - loss_b) < 1e-4 and loss_a - ce > 0.1
      # One step's BatchNorm statistics: the same moving means/variances
      # (to slim's unbiased batch variance, n / (n - 1) of the peer's).
      sess.run(our_updates)
      sess.run(peer_updates)
      statistics = [(m, n) for m, n in pairs if 'moving' in n]
      assert len(statistics) == 10
      for mine, name in statistics:
        np.testing.assert_allclose(
            sess.run(mine), sess.run(slim_vars['InceptionResnetV2/' + name]),
            rtol=1e-4, atol=1e-5)
