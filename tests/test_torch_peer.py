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
  training step's BatchNorm updates, with random offsets (betas)."""
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
                for n, v in variables.items() if n.endswith('beta')])
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
  # The same moving statistics after the step (both with the unbiased
  # batch variance), each layer's.
  conv_layers = [i for i, layer in enumerate(torch_peer.LAYERS)
                 if len(layer) == 4]
  for i, layer in zip(conv_layers, LAYERS):
    for buffer, name in (('mean%d', 'moving_mean'),
                         ('variance%d', 'moving_variance')):
      np.testing.assert_allclose(
          getattr(peer, buffer % i).numpy(),
          after[layer + '/BatchNorm/' + name], rtol=1e-4, atol=1e-5)


def shifted_and_flipped(image):
  """Every image the crop and flip can make of image [3, 32, 32] (float),
  standardized as tf.image.per_image_standardization: the 81 shifts of up to
  4 pixels each way, over a black border, each flipped or not."""
  padded = np.pad(image, [(0, 0), (4, 4), (4, 4)])
  out = []
  for dy in range(9):
    for dx in range(9):
      crop = padded[:, dy:dy + 32, dx:dx + 32]
      for candidate in (crop, crop[:, :, ::-1]):
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
  # Without brightness and contrast (which standardization undoes but for
  # the black border's share), each image is one of the crops and flips
  # of its record, chosen image by image: not all the same one.
  monkeypatch.setattr(torch_peer, 'MAX_BRIGHTNESS_DELTA', 0)
  monkeypatch.setattr(torch_peer, 'CONTRAST_RANGE', (1.0, 1.0))
  same = np.repeat(records[:1], 16, axis=0)
  images, _ = torch_peer.augment(torch.from_numpy(same),
                                 torch.Generator().manual_seed(1))
  candidates = shifted_and_flipped(
      same[0, 1:].reshape(3, 32, 32).astype(np.float32))
  chosen = set()
  for image in images.numpy():
    errors = [np.abs(image - c).max() for c in candidates]
    assert min(errors) < 1e-4
    chosen.add(int(np.argmin(errors)))
  assert len(chosen) > 1


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
  assert measured['images_per_sec'] > 0
  assert measured['ended_at'] > measured['warmup_done_at']
  assert np.isfinite(measured['last_loss'])


def test_the_peer_trains_over_ddp_with_two_processes(tiny_data):
  port = helpers.free_ports(1)[0]
  ddp = ['--world_size=2', '--master_port=%d' % port]
  with helpers.in_group(peer_command(tiny_data, '--rank=1', *ddp)) as rank1:
    code, out = helpers.run_in_group(
        peer_command(tiny_data, '--rank=0', *ddp), timeout=300)
    rest, _ = rank1.communicate(timeout=300)
  assert code == 0, out
  assert rank1.returncode == 0, rest
  measured = last_json(out)
  assert measured['global_step'] == 5
  assert measured['threads'] == max(1, len(os.sched_getaffinity(0)) // 2)
  assert not [l for l in rest.splitlines() if l.startswith('{')]  # Rank 0's.


@pytest.mark.parametrize('flags, line', [
    (['--data_dir=/nonexistent'], 'torch_peer.py: data directory /nonexistent '
     'does not exist: pass --data_dir=DIR'),
    (['--rank=2', '--world_size=2'], 'torch_peer.py: error: --rank must be '
     'from 0 to --world_size - 1 (1), got 2')])
def test_bad_input_gets_one_line_and_exit_2(tiny_data, flags, line):
  code, out = helpers.run_in_group(
      [sys.executable, PEER, '--data_dir=' + tiny_data] + flags, timeout=300)
  assert code == 2, out
  assert out.strip().splitlines()[-1].startswith(line), out
