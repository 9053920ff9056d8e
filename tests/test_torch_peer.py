"""tools/torch_peer.py, the benchmark's PyTorch peer: the trainer's network
layer for layer, its augmentation, and its runs in real processes (one
process, and DDP over gloo). PyTorch comes from tools/requirements-peers.txt,
which .ci/run installs."""

import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import cifar10_model
from helpers import ROOT
import helpers

torch = pytest.importorskip('torch')
import torch_peer  # pylint: disable=g-import-not-at-top,wrong-import-position

tf1 = tf.compat.v1
PEER = os.path.join(ROOT, 'tools', 'torch_peer.py')
LAYERS = ['Conv2d_1a_3x3', 'Conv2d_2a_3x3', 'Conv2d_2b_3x3', 'Conv2d_3b_1x1',
          'Conv2d_4a_3x3']


def trainers_network(images, labels):
  """The trainer's logits, loss, variables and moving statistics after one
  training step's BatchNorm updates, with random offsets (betas) and
  logits biases (which the L2 term must leave out)."""
  rng = np.random.RandomState(1)
  with tf.Graph().as_default():
    logits = cifar10_model.inference(tf.constant(images), is_training=True,
                                     dropout_keep_prob=1.0)
    loss = cifar10_model.loss(logits, tf.constant(labels))
    updates = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
    variables = {v.op.name[len('InceptionResnetV2/'):]: v
                 for v in tf1.global_variables()}
    count = sum(int(np.prod(v.shape)) for v in tf1.trainable_variables())
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run([v.assign(rng.normal(size=v.shape.as_list()))
                for n, v in variables.items()
                if n.endswith('beta') or n == 'Logits/biases'])
      before = sess.run(variables)
      out = sess.run([logits, loss])
      sess.run(updates)
      after = sess.run(variables)
  return out, count, before, after


def test_the_peers_network_is_the_trainers(monkeypatch):
  rng = np.random.RandomState(0)
  images = rng.normal(size=[8, 32, 32, 3]).astype(np.float32)
  labels = rng.randint(0, 10, size=[8]).astype(np.int32)
  (logits, loss), count, before, after = trainers_network(images, labels)
  peer = torch_peer.Network(10)
  # The trainable parameters TensorFlow's graph counts, and the output.
  assert sum(p.numel() for p in peer.parameters()) == count == 179962
  # The trainer's values, NHWC kernels to NCHW; the dense layer's inputs
  # flattened (h, w, c) there, (c, h, w) here.
  with torch.no_grad():
    for i, layer in enumerate(LAYERS):
      peer.convs[i].weight.copy_(torch.from_numpy(
          before[layer + '/weights'].transpose(3, 2, 0, 1)))
      peer.offsets[i].copy_(torch.from_numpy(
          before[layer + '/BatchNorm/beta']))
    peer.logits.weight.copy_(torch.from_numpy(
        before['Logits/weights'].reshape(2, 2, 192, 10).transpose(
            3, 2, 0, 1).reshape(10, 768)))
    peer.logits.bias.copy_(torch.from_numpy(before['Logits/biases']))
  monkeypatch.setattr(torch_peer, 'KEEP_PROB', 1.0)  # No dropout, as above.
  peer.train()
  theirs = peer(torch.from_numpy(images.transpose(0, 3, 1, 2)))
  assert tuple(theirs.shape) == (8, 10)
  np.testing.assert_allclose(theirs.detach().numpy(), logits, rtol=1e-4,
                             atol=1e-4)
  # The same loss, the L2 term included (it adds 0.1 or more here).
  their_loss = torch_peer.total_loss(peer, theirs, torch.from_numpy(
      labels).long()).item()
  assert abs(their_loss - loss) < 1e-4
  assert loss - torch.nn.functional.cross_entropy(
      theirs, torch.from_numpy(labels).long()).item() > 0.1
  # The same batch statistics in the moving ones after the step, each
  # layer's: what the step added over the decayed start (the variance the
  # unbiased one, as slim's, 8 / 7 of the biased one here).
  decay = cifar10_model.BATCH_NORM_DECAY
  conv_layers = [i for i, layer in enumerate(torch_peer.LAYERS)
                 if len(layer) == 4]
  for i, layer in zip(conv_layers, LAYERS):
    for buffer, name in (('mean%d', 'moving_mean'),
                         ('variance%d', 'moving_variance')):
      start = before[layer + '/BatchNorm/' + name]
      np.testing.assert_allclose(
          (getattr(peer, buffer % i).numpy() - decay * start) / (1 - decay),
          (after[layer + '/BatchNorm/' + name] - decay * start) / (1 - decay),
          rtol=2e-4, atol=1e-4)


def test_the_peers_dropout_is_the_trainers_in_training_only(monkeypatch):
  seen = []
  def dropout(x, p, training):
    seen.append((p, training))
    return x
  monkeypatch.setattr(torch_peer.F, 'dropout', dropout)
  peer = torch_peer.Network(10)
  images = torch.zeros(2, 3, 32, 32)
  peer.train()
  peer(images)
  peer.eval()
  peer(images)
  # slim.dropout keeps 0.8 of the activations in training.
  assert seen == [(pytest.approx(0.2), True), (pytest.approx(0.2), False)]


def shifted_and_flipped(image, contrast):
  """Every image the crop and flip can make of image [3, 32, 32] (float),
  its contrast scaled about each channel's mean, standardized as
  tf.image.per_image_standardization: the 81 shifts of up to 4 pixels each
  way, over a black border, each flipped or not."""
  padded = np.pad(image, [(0, 0), (4, 4), (4, 4)])
  out = []
  for dy in range(9):
    for dx in range(9):
      crop = padded[:, dy:dy + 32, dx:dx + 32]
      for candidate in (crop, crop[:, :, ::-1]):
        mean = candidate.mean(axis=(1, 2), keepdims=True)
        candidate = (candidate - mean) * contrast + mean
        std = max(candidate.std(), 1 / np.sqrt(candidate.size))
        out.append((candidate - candidate.mean()) / std)
  return out


def test_the_peers_augmentation_is_the_trainers(monkeypatch):
  rng = np.random.RandomState(0)
  records = rng.randint(0, 256, size=[16, 3073]).astype(np.uint8)
  images, labels = torch_peer.augment(torch.from_numpy(records),
                                      torch.Generator().manual_seed(0))
  assert tuple(images.shape) == (16, 3, 32, 32)
  assert labels.tolist() == records[:, 0].tolist()
  # Standardized, image by image.
  flat = images.numpy().reshape(16, -1)
  np.testing.assert_allclose(flat.mean(1), 0, atol=1e-4)
  np.testing.assert_allclose(flat.std(1), 1, atol=1e-3)
  # With the contrast fixed at 0.5, each image is one of the crops and
  # flips of its record, its channels scaled about their own means, chosen
  # image by image (not all the same one). The brightness, one offset of
  # the whole image, standardization takes away: it stays random.
  monkeypatch.setattr(torch_peer, 'CONTRAST_RANGE', (0.5, 0.5))
  same = np.repeat(records[:1], 16, axis=0)
  images, _ = torch_peer.augment(torch.from_numpy(same),
                                 torch.Generator().manual_seed(1))
  candidates = shifted_and_flipped(
      same[0, 1:].reshape(3, 32, 32).astype(np.float32), 0.5)
  chosen = set()
  for image in images.numpy():
    errors = [np.abs(image - c).max() for c in candidates]
    assert min(errors) < 1e-4
    chosen.add(int(np.argmin(errors)))
  assert len(chosen) > 1


def test_the_peers_moving_averages_are_the_trainers():
  # ExponentialMovingAverage at step 1: decay min(0.9999, 2 / 11).
  average, param = [torch.zeros(3)], [torch.ones(3)]
  torch_peer.moving_averages_step(average, param, 1)
  np.testing.assert_allclose(average[0].numpy(), 9 / 11, rtol=1e-6)


def peer_command(tiny_data, *more):
  return [sys.executable, PEER, '--data_dir=' + tiny_data,
          '--batch_size=16', '--warmup_steps=2', '--steps=3'] + list(more)


def last_json(out):
  return json.loads([l for l in out.splitlines() if l.startswith('{')][-1])


def test_the_peer_trains_in_one_process(tiny_data):
  code, out = helpers.run_in_group(peer_command(tiny_data), timeout=300)
  assert code == 0, out
  measured = last_json(out)
  assert measured['global_step'] == 5
  assert measured['images_per_sec'] == pytest.approx(
      3 * 16 / (measured['ended_at'] - measured['warmup_done_at']))
  assert measured['ended_at'] > measured['warmup_done_at']
  assert np.isfinite(measured['last_loss'])


def test_the_peer_trains_over_ddp_with_two_processes(tiny_data, tmp_path):
  port = helpers.free_ports(1)[0]
  ddp = ['--world_size=2', '--master_port=%d' % port]
  log = tmp_path / 'rank1.log'
  with open(log, 'w') as f, helpers.in_group(
      peer_command(tiny_data, '--rank=1', *ddp), stdout=f) as rank1:
    code, out = helpers.run_in_group(
        peer_command(tiny_data, '--rank=0', *ddp), timeout=300)
    assert code == 0, out
    assert rank1.wait(timeout=300) == 0, log.read_text()
  measured = last_json(out)
  assert measured['global_step'] == 5
  # Both ranks' images: 2 x 3 measured steps of 16.
  assert measured['images_per_sec'] == pytest.approx(
      2 * 3 * 16 / (measured['ended_at'] - measured['warmup_done_at']))
  assert measured['threads'] == max(1, len(os.sched_getaffinity(0)) // 2)
  assert '{' not in log.read_text()  # The JSON line is rank 0's.


@pytest.mark.parametrize('flags, line', [
    (['--data_dir=/nonexistent'], 'torch_peer.py: data directory /nonexistent '
     'does not exist: pass --data_dir=DIR'),
    (['--rank=2', '--world_size=2'], 'torch_peer.py: error: --rank must be '
     'from 0 to --world_size - 1 (1), got 2')])
def test_bad_input_ends_with_a_line_saying_why_and_exit_2(tiny_data, flags, line):
  code, out = helpers.run_in_group(
      [sys.executable, PEER, '--data_dir=' + tiny_data] + flags, timeout=300)
  assert code == 2, out
  assert out.strip().splitlines()[-1].startswith(line), out


def test_the_benchmark_runs_the_peers_ranks_and_reads_their_cpu(tiny_data,
                                                                tmp_path):
  import measured_run  # pylint: disable=g-import-not-at-top
  measured = measured_run.run_torch_peer(
      name='ddp', data_dir=tiny_data, work=str(tmp_path), steps=6,
      batch_size=16, world_size=2)
  assert measured['images_per_sec'] > 0
  assert measured['first_step_secs'] > 0 and measured['shutdown_secs'] >= 0
  # Each rank's CPU in the measured steps, rank 1's from its own process.
  assert set(measured['cpu_ms_per_image']) == {'worker0', 'worker1'}
  assert all(ms > 0 for ms in measured['cpu_ms_per_image'].values())
  assert (tmp_path / 'ddp-worker1.log').exists()
