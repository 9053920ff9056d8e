"""The deploy/ manifests as the tests read them: documents, the trainer."""

import os

import yaml

from helpers import ROOT


def documents(name):
  """The documents of deploy/NAME, a multi-document YAML file."""
  with open(os.path.join(ROOT, 'deploy', name)) as f:
    return [d for d in yaml.safe_load_all(f) if d]


def trainer(template):
  """The trainer's container in a pod template: its only container."""
  containers = template['spec']['containers']
  # The training operator finds the trainer by this name, and the Jobs'
  # podFailurePolicy by it too.
  assert [c['name'] for c in containers] == ['tensorflow']
  return containers[0]


def trainer_argv(container):
  """The trainer's arguments in the container's command."""
  command = container['command']
  assert command[:2] == ['python', 'train_distributed.py'], command
  return command[2:]


def assert_mounts_the_claim(template, claim):
  """The pod mounts the claim, and the trainer has it at /shared."""
  volumes = template['spec']['volumes']
  assert [v['persistentVolumeClaim']['claimName'] for v in volumes] == [claim]
  mounts = trainer(template)['volumeMounts']
  assert [m['mountPath'] for m in mounts] == ['/shared']


def assert_init_fetches_the_data(template):
  """One init container, with the trainer's image and volume, fetches
  CIFAR-10 into the trainer's --data_dir."""
  init = template['spec']['initContainers']
  assert len(init) == 1
  container = trainer(template)
  assert init[0]['image'] == container['image']
  assert init[0]['volumeMounts'] == container['volumeMounts']
  data_dir = [a for a in trainer_argv(container) if a.startswith('--data_dir=')]
  assert init[0]['command'] == ['python', 'scripts/download_cifar10.py'
                               ] + data_dir


def ingress_only_among(docs):
  """The labels of the pods that the one NetworkPolicy in docs protects,
  after checking that it admits connections from those pods only."""
  policies = [d for d in docs if d['kind'] == 'NetworkPolicy']
  assert len(policies) == 1
  spec = policies[0]['spec']
  labels = spec['podSelector']['matchLabels']
  assert labels  # Not every pod of the namespace.
  assert spec['policyTypes'] == ['Ingress']
  assert spec['ingress'] == [{'from': [{'podSelector': {
      'matchLabels': labels}}]}]
  return labels
