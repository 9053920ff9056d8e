#!/usr/bin/env python3
"""PyTorch's training of the same network: the CPU peer tools/benchmark.py
measures this suite against.

The network of cifar10_model.py layer for layer (convolutions without bias,
BatchNorm with an offset and no scale, ReLU, the max pools, dropout, the
dense layer, the L2 weight decay in the loss), plain SGD, the weights'
moving averages the trainer keeps, and the same files and augmentation
(cifar10_input.preprocess), made per batch in a DataLoader process. One
process, or with --world_size N, DistributedDataParallel over gloo, one
process a core share: start each rank yourself (the benchmark does).

Each rank trains --warmup_steps, then --steps more; rank 0 prints one JSON
line: the steady state's images/s (all ranks), and when (time.time()) the
warmup and the run ended. --profile_steps prints torch.profiler's op table
of that many steps instead.

  pip install -r tools/requirements-peers.txt
  python3 tools/torch_peer.py --data_dir=DIR
  python3 tools/torch_peer.py --data_dir=DIR --world_size=2 --rank=0 --master_port=29500 &
  python3 tools/torch_peer.py --data_dir=DIR --world_size=2 --rank=1 --master_port=29500
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
from torch import nn
import torch.distributed as dist
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from training.storage import data_layout  # pylint: disable=g-import-not-at-top,wrong-import-position

# cifar10_model's constants (that module imports TensorFlow).
WEIGHT_DECAY = 0.004
BATCH_NORM_DECAY = 0.995
BATCH_NORM_EPSILON = 0.001
MOVING_AVERAGE_DECAY = 0.9999
KEEP_PROB = 0.8
# cifar10_input's augmentation.
PAD_PIXELS = 4
MAX_BRIGHTNESS_DELTA = 63
CONTRAST_RANGE = (0.2, 1.8)
# (kernel, stride, padding, output channels) of each conv, None a max pool
# (kernel, stride), as in cifar10_model.inference_in.
LAYERS = ((3, 2, 0, 32), (3, 1, 0, 32), (3, 1, 1, 64), (3, 2),
          (1, 1, 0, 80), (3, 1, 0, 192), (2, 2))
FLAT = 192 * 2 * 2


class Network(nn.Module):
  """cifar10_model's network in NCHW; BatchNorm as slim's (no scale)."""

  def __init__(self, num_classes):
    super().__init__()
    self.convs, self.offsets = nn.ModuleList(), nn.ParameterList()
    channels = 3
    for i, layer in enumerate(LAYERS):
      if len(layer) == 2:
        continue
      size, stride, padding, out = layer
      conv = nn.Conv2d(channels, out, size, stride, padding, bias=False)
      nn.init.xavier_uniform_(conv.weight)
      self.convs.append(conv)
      self.offsets.append(nn.Parameter(torch.zeros(out)))
      self.register_buffer('mean%d' % i, torch.zeros(out))
      self.register_buffer('variance%d' % i, torch.ones(out))
      channels = out
    self.logits = nn.Linear(FLAT, num_classes)
    nn.init.xavier_uniform_(self.logits.weight)
    nn.init.zeros_(self.logits.bias)

  def forward(self, x):
    conv = 0
    for i, layer in enumerate(LAYERS):
      if len(layer) == 2:
        x = F.max_pool2d(x, layer[0], layer[1])
        continue
      x = self.convs[conv](x)
      # slim's fused batch norm: the batch's statistics in training, an
      # offset and no scale; the moving ones updated with the unbiased
      # variance, as slim's.
      x = F.relu(F.batch_norm(
          x, getattr(self, 'mean%d' % i), getattr(self, 'variance%d' % i),
          None, self.offsets[conv], self.training, 1 - BATCH_NORM_DECAY,
          BATCH_NORM_EPSILON))
      conv += 1
    x = F.dropout(torch.flatten(x, 1), 1 - KEEP_PROB, self.training)
    return self.logits(x)

  def weights(self):
    """What the L2 weight decay applies to, as slim's arg_scope."""
    return [c.weight for c in self.convs] + [self.logits.weight]


def total_loss(model, logits, labels):
  """Mean cross entropy plus the L2 weight decay, as cifar10_model.loss."""
  return F.cross_entropy(logits, labels) + WEIGHT_DECAY * sum(
      w.pow(2).sum() for w in model.weights()) / 2


def augment(records, generator):
  """A uint8 batch of records (label byte first) -> (NCHW float32 images,
  labels), augmented as cifar10_input.preprocess, every choice per image."""
  n = len(records)
  labels = records[:, 0].long()
  images = F.pad(records[:, 1:].view(n, 3, 32, 32).float(), [PAD_PIXELS] * 4)
  offsets = torch.randint(0, 2 * PAD_PIXELS + 1, (n, 2), generator=generator)
  span = torch.arange(32)
  rows = (offsets[:, :1] + span).view(n, 1, 32, 1).expand(n, 3, 32, 40)
  images = images.gather(2, rows)
  cols = (offsets[:, 1:] + span).view(n, 1, 1, 32).expand(n, 3, 32, 32)
  images = images.gather(3, cols)
  flip = torch.rand(n, 1, 1, 1, generator=generator) < 0.5
  images = torch.where(flip, images.flip(3), images)
  images += (torch.rand(n, 1, 1, 1, generator=generator) * 2 - 1) * (
      MAX_BRIGHTNESS_DELTA)
  mean = images.mean((2, 3), keepdim=True)
  low, high = CONTRAST_RANGE
  images = (images - mean) * (torch.rand(n, 1, 1, 1, generator=generator) *
                              (high - low) + low) + mean
  # tf.image.per_image_standardization.
  mean = images.mean((1, 2, 3), keepdim=True)
  std = images.std((1, 2, 3), keepdim=True, unbiased=False)
  return (images - mean) / std.clamp(min=(3 * 32 * 32) ** -0.5), labels


class Batches(torch.utils.data.IterableDataset):
  """Endless augmented batches of the training files, reshuffled each
  epoch, a rank's own order."""

  def __init__(self, data_dir, batch_size, seed):
    super().__init__()
    files, _ = data_layout.check_data(data_dir, False)
    self.records = torch.from_numpy(np.concatenate([
        np.fromfile(f, np.uint8).reshape(-1, data_layout.RECORD_BYTES)
        for f in files]))
    self.batch_size, self.seed = batch_size, seed

  def __iter__(self):
    generator = torch.Generator().manual_seed(self.seed)
    n = len(self.records) - len(self.records) % self.batch_size
    while True:
      order = torch.randperm(len(self.records), generator=generator)[:n]
      for batch in order.view(-1, self.batch_size):
        yield augment(self.records[batch], generator)


def moving_averages_step(averages, params, step):
  """ExponentialMovingAverage with num_updates, as the trainer's."""
  decay = min(MOVING_AVERAGE_DECAY, (1. + step) / (10. + step))
  with torch.no_grad():
    for average, param in zip(averages, params):
      average.lerp_(param, 1. - decay)


class Trainer:
  """A rank's model (DDP's with --world_size above 1), optimizer, moving
  averages and batches; step() trains one step."""

  def __init__(self, args):
    world = args.world_size
    torch.set_num_threads(args.threads or max(
        1, len(os.sched_getaffinity(0)) // world))
    if world > 1:
      dist.init_process_group('gloo', init_method='tcp://127.0.0.1:%d' %
                              args.master_port, rank=args.rank,
                              world_size=world)
    torch.manual_seed(args.rank)
    self.layout = (torch.channels_last if args.channels_last else
                   torch.contiguous_format)
    self.net = Network(data_layout.num_classes(args.data_dir)[0]).to(
        memory_format=self.layout)
    self.model = (nn.parallel.DistributedDataParallel(self.net) if world > 1
                  else self.net)
    self.params = list(self.model.parameters())
    self.averages = ([p.detach().clone() for p in self.params]
                     if args.moving_averages else [])
    self.optimizer = torch.optim.SGD(self.params, lr=args.learning_rate)
    workers = (args.loader_workers if args.loader_workers >= 0 else
               int(world == 1))
    self.batches = iter(torch.utils.data.DataLoader(
        Batches(args.data_dir, args.batch_size, seed=args.rank),
        batch_size=None, num_workers=workers, persistent_workers=workers > 0))
    self.global_step, self.loss = 0, torch.zeros(())
    self.model.train()

  def step(self):
    images, labels = next(self.batches)
    images = images.contiguous(memory_format=self.layout)
    self.optimizer.zero_grad(set_to_none=True)
    self.loss = total_loss(self.net, self.model(images), labels)
    self.loss.backward()
    self.optimizer.step()
    self.global_step += 1
    if self.averages:
      moving_averages_step(self.averages, self.params, self.global_step)


def train(args):
  """Trains and measures; rank 0 prints one JSON line (or the profile)."""
  started = time.time()
  trainer, world = Trainer(args), args.world_size
  for _ in range(args.warmup_steps):
    trainer.step()
  if world > 1:
    dist.barrier()
  first = time.time()
  if args.profile_steps:
    with torch.profiler.profile() as profiler:
      for _ in range(args.profile_steps):
        trainer.step()
    if args.rank == 0:
      print(profiler.key_averages().table(sort_by='self_cpu_time_total',
                                          row_limit=40), flush=True)
    return
  for _ in range(args.steps):
    trainer.step()
  if world > 1:
    dist.barrier()
  end = time.time()
  if args.rank == 0:
    print(json.dumps({
        'images_per_sec': world * args.steps * args.batch_size / (end - first),
        'warmup_done_secs': first - started, 'warmup_done_at': first,
        'ended_at': end, 'global_step': trainer.global_step,
        'last_loss': trainer.loss.item(), 'torch': torch.__version__,
        'threads': torch.get_num_threads()}), flush=True)
  if world > 1:
    dist.destroy_process_group()


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--data_dir', required=True)
  parser.add_argument('--batch_size', type=int, default=128,
                      help='images a step, each rank')
  parser.add_argument('--steps', type=int, default=100,
                      help='steps measured, after the warmup')
  parser.add_argument('--warmup_steps', type=int, default=20)
  parser.add_argument('--learning_rate', type=float, default=0.1)
  parser.add_argument('--moving_averages', default=True,
                      action=argparse.BooleanOptionalAction,
                      help="keep the weights' moving averages, as the "
                      'trainer does (default: on)')
  parser.add_argument('--channels_last', default=True,
                      action=argparse.BooleanOptionalAction,
                      help="NHWC tensors, as TensorFlow's, faster in oneDNN's "
                      'convolutions (default: on)')
  parser.add_argument('--world_size', type=int, default=1,
                      help='DDP processes; 1: one plain process')
  parser.add_argument('--rank', type=int, default=0)
  parser.add_argument('--master_port', type=int, default=29500,
                      help="rank 0's port on 127.0.0.1, for gloo")
  parser.add_argument('--threads', type=int, default=0,
                      help='intra-op threads; 0: the cores / --world_size')
  parser.add_argument('--loader_workers', type=int, default=-1,
                      help='DataLoader processes augmenting batches; 0: in '
                      'the training process; -1: 1 for one process, 0 with '
                      'DDP (whose ranks fill the cores already)')
  parser.add_argument('--profile_steps', type=int, default=0,
                      help="print torch.profiler's op table of this many "
                      'steps after the warmup, instead of the JSON line')
  args = parser.parse_args(argv)
  if not 0 <= args.rank < args.world_size:
    parser.error('--rank must be from 0 to --world_size - 1 (%d), got %d' %
                 (args.world_size - 1, args.rank))
  if min(args.steps, args.batch_size) < 1 or args.warmup_steps < 0:
    parser.error('--steps and --batch_size must be 1 or more, --warmup_steps '
                 '0 or more')
  return args


def main(argv=None):
  args = parse_args(argv)
  try:
    train(args)
  except data_layout.DataError as e:
    print('torch_peer.py: %s' % e, file=sys.stderr)
    return 2
  return 0


if __name__ == '__main__':
  sys.exit(main())
