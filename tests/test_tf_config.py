"""TF_CONFIG: the cluster as Kubernetes describes it, and the TFJob manifest."""

import json
import os

import pytest

from helpers import ROOT
import manifests

from training.cluster import cluster_config
import train_distributed

CLUSTER = {'chief': ['c:2222'], 'worker': ['w0:2222', 'w1:2222'],
           'ps': ['p0:2222', 'p1:2222'], 'evaluator': ['e:2222']}


def flags_for(cluster, task_type, index):
  return cluster_config.tf_config_flags(json.dumps(
      {'cluster': cluster, 'task': {'type': task_type, 'index': index}}))


@pytest.mark.parametrize('task_type, index, job_name, task_index', [
    ('chief', 0, 'worker', 0),
    ('worker', 0, 'worker', 1),   # A chief job shifts the workers by one.
    ('worker', 1, 'worker', 2),
    ('ps', 1, 'ps', 1),
    ('evaluator', 0, 'evaluator', 0),
])
def test_separate_chief_job_is_worker_0(task_type, index, job_name,
                                        task_index):
  assert flags_for(CLUSTER, task_type, index) == {
      'ps_hosts': 'p0:2222,p1:2222',
      'worker_hosts': 'c:2222,w0:2222,w1:2222',
      'job_name': job_name, 'task_index': task_index}


def test_an_evaluator_needs_no_training_cluster():
  # TensorFlow's convention: the evaluator is not part of the cluster.
  assert flags_for({'evaluator': ['e:1']}, 'evaluator', 0) == {
      'ps_hosts': '', 'worker_hosts': '', 'job_name': 'evaluator',
      'task_index': 0}


def test_without_a_chief_job_worker_0_is_the_chief():
  cluster = {'worker': ['w0:1', 'w1:1'], 'ps': ['p:1']}
  assert flags_for(cluster, 'worker', 1) == {
      'ps_hosts': 'p:1', 'worker_hosts': 'w0:1,w1:1', 'job_name': 'worker',
      'task_index': 1}
  # "master", the chief's older name, is a chief too.
  assert flags_for({'master': ['m:1'], 'ps': ['p:1']}, 'master', 0)[
      'worker_hosts'] == 'm:1'


@pytest.mark.parametrize('text, message', [
    ('{"cluster": ', 'TF_CONFIG is not valid JSON'),
    ('["ps"]', 'TF_CONFIG is not a JSON object'),
    ('{"cluster": {"ps": ["p:1"]}}', 'needs a "cluster" object and a "task"'),
    ('{"cluster": {"ps": ["p:1"], "boss": ["b:1"]}, "task": {"type": "ps"}}',
     "has a job 'boss' in \"cluster\""),
    ('{"cluster": {"ps": "p:1", "worker": ["w:1"]}, "task": {"type": "ps"}}',
     '"cluster": {"ps": "p:1"} is not a list of "host:port"'),
    ('{"cluster": {"ps": ["p"], "worker": ["w:1"]}, "task": {"type": "ps"}}',
     '"cluster": {"ps": ["p"]} is not a list of "host:port"'),
    ('{"cluster": {"ps": ["p:0"], "worker": ["w:1"]}, "task": {"type": "ps"}}',
     '"cluster": {"ps": ["p:0"]} is not a list of "host:port" (port 1-65535)'),
    ('{"cluster": {"ps": ["p:1"], "worker": ["w:70000"]}, '
     '"task": {"type": "ps"}}', '"cluster": {"worker": ["w:70000"]}'),
    ('{"cluster": {"ps": ["h:1"], "worker": ["h:1"]}, "task": {"type": "ps"}}',
     '"cluster" lists a host:port twice'),
    ('{"cluster": {"ps": ["p:1"]}, "task": {"type": "ps", "index": 0}}',
     'has no "chief" or "worker" job'),
    ('{"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, '
     '"task": {"type": "boss", "index": 0}}', '"type" must be one of'),
    ('{"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, '
     '"task": {"type": "worker", "index": "0"}}', '"index" must be an integer'),
    ('{"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, '
     '"task": {"type": "worker", "index": 1}}',
     '"task": worker 1 is not in "cluster", which lists 1'),
    ('{"cluster": {"worker": ["w:1", "v:1"]}, '
     '"task": {"type": "worker", "index": 0}}', 'has no "ps" job'),
    ('{"cluster": {"chief": ["c:1", "d:1"], "ps": ["p:1"]}, '
     '"task": {"type": "chief", "index": 0}}', 'lists 2 chief/master tasks'),
])
def test_malformed_tf_config_says_what_is_wrong(text, message):
  with pytest.raises(cluster_config.UsageError) as e:
    cluster_config.tf_config_flags(text)
  assert str(e.value).startswith('TF_CONFIG ')
  assert message in str(e.value)


def test_flags_on_the_command_line_win_over_tf_config(flags, monkeypatch,
                                                      capsys):
  monkeypatch.setenv('TF_CONFIG', json.dumps(
      {'cluster': CLUSTER, 'task': {'type': 'chief', 'index': 0}}))
  flags(['train_distributed.py', '--task_index=2', '--ps_hosts=q:1'])
  train_distributed.apply_tf_config()
  assert (flags.ps_hosts, flags.worker_hosts, flags.job_name,
          flags.task_index) == ('q:1', 'c:2222,w0:2222,w1:2222', 'worker', 2)
  assert capsys.readouterr().out == (
      'Cluster from TF_CONFIG: --worker_hosts=c:2222,w0:2222,w1:2222 '
      '--job_name=worker\n'
      'Given on the command line, over TF_CONFIG: --ps_hosts=q:1 '
      '--task_index=2\n')


def test_with_all_cluster_flags_given_tf_config_is_not_read(flags,
                                                             monkeypatch,
                                                             capsys):
  # Not even parsed: a foreign TF_CONFIG left in a shell cannot get in the
  # way of a task started by hand.
  monkeypatch.setenv('TF_CONFIG', '{"cluster": {"worker": ["w:1"]}')
  flags(['train_distributed.py', '--ps_hosts=p:1', '--worker_hosts=w:1',
         '--job_name=ps', '--task_index=0'])
  train_distributed.apply_tf_config()
  assert (flags.ps_hosts, flags.worker_hosts, flags.job_name,
          flags.task_index) == ('p:1', 'w:1', 'ps', 0)
  assert capsys.readouterr().out == (
      'TF_CONFIG is set but not used: --ps_hosts, --worker_hosts, '
      '--job_name, --task_index are all given\n')


def test_without_tf_config_nothing_changes(flags, monkeypatch, capsys):
  monkeypatch.delenv('TF_CONFIG', raising=False)
  flags(['train_distributed.py'])
  train_distributed.apply_tf_config()
  assert (flags.ps_hosts, flags.job_name) == ('localhost:2222', None)
  assert capsys.readouterr().out == ''


def test_malformed_tf_config_gives_one_line_and_exit_2(procs, tmp_path):
  procs.trainer('bad', '--train_dir=' + str(tmp_path / 'train'),
                env={'TF_CONFIG': '{"cluster": {"ps": ["p:1"]}, "task": '})
  assert procs.wait_all(timeout=60) == {'bad': 2}
  log = procs.log('bad')
  errors = [l for l in log.splitlines() if l.startswith('Error: ')]
  assert len(errors) == 1, log
  assert errors[0].startswith('Error: TF_CONFIG is not valid JSON'), log
  assert 'Traceback' not in log
  assert not (tmp_path / 'train').exists()


# The TFJob manifest: what it runs must be what the trainer accepts.

def manifest_documents():
  return manifests.documents('tfjob.yaml')


def tfjob():
  jobs = [d for d in manifest_documents() if d['kind'] == 'TFJob']
  assert len(jobs) == 1
  return jobs[0]


def container(replica_spec):
  return manifests.trainer(replica_spec['template'])


def test_manifest_shape_one_ps_two_gpu_workers_one_evaluator():
  job = tfjob()
  assert job['apiVersion'] == 'kubeflow.org/v1'
  specs = job['spec']['tfReplicaSpecs']
  assert sorted(specs) == ['Evaluator', 'PS', 'Worker']
  assert [specs[r]['replicas'] for r in ('PS', 'Worker', 'Evaluator')] == [
      1, 2, 1]
  gpus = {r: container(s).get('resources', {}).get('limits', {}).get(
      'nvidia.com/gpu', 0) for r, s in specs.items()}
  assert gpus == {'PS': 0, 'Worker': 1, 'Evaluator': 0}
  # Every replica mounts the shared volume, the ps too: it writes the
  # checkpoint shards of the variables it holds.
  (claim,) = [d['metadata']['name'] for d in manifest_documents()
              if d['kind'] == 'PersistentVolumeClaim']
  for spec in specs.values():
    manifests.assert_mounts_the_claim(spec['template'], claim)


def manifest_argv(role):
  """The trainer's arguments in the manifest's command for `role`."""
  return manifests.trainer_argv(container(tfjob()['spec']['tfReplicaSpecs'][
      role]))


@pytest.mark.parametrize('role, index, job_name, task_index', [
    ('PS', 0, 'ps', 0), ('Worker', 0, 'worker', 0), ('Worker', 1, 'worker', 1),
    ('Evaluator', 0, 'evaluator', 0)])
def test_manifest_commands_parse_and_take_the_cluster_from_tf_config(
    flags, monkeypatch, role, index, job_name, task_index):
  # What the training operator sets: one service per replica, port 2222;
  # the evaluator is left out of the cluster, as TensorFlow expects.
  name = tfjob()['metadata']['name']
  cluster = {r.lower(): ['%s-%s-%d.default.svc:2222' % (name, r.lower(), i)
                         for i in range(n)]
             for r, n in (('PS', 1), ('Worker', 2))}
  monkeypatch.setenv('TF_CONFIG', json.dumps(
      {'cluster': cluster, 'task': {'type': role.lower(), 'index': index}}))
  flags(['train_distributed.py'] + manifest_argv(role))  # Unknown: raises.
  train_distributed.apply_tf_config()
  assert (flags.job_name, flags.task_index) == (job_name, task_index)
  assert flags.ps_hosts == name + '-ps-0.default.svc:2222'
  assert flags.worker_hosts == ('%s-worker-0.default.svc:2222,'
                                '%s-worker-1.default.svc:2222' % (name, name))
  if role != 'PS':  # The ps writes where the chief's saver tells it.
    assert flags.train_dir == '/shared/train'
    assert flags.data_dir == '/shared/data/cifar-10-batches-bin'
    assert flags.max_steps == 100000  # The evaluator stops there too.
  assert flags.num_gpus == (1 if role == 'Worker' else 0)


def test_manifest_init_containers_fetch_the_data_into_the_shared_volume():
  specs = tfjob()['spec']['tfReplicaSpecs']
  for role in ('Worker', 'Evaluator'):
    manifests.assert_init_fetches_the_data(specs[role]['template'])


def test_manifest_lets_only_the_jobs_own_pods_reach_its_ports():
  # The operator labels every pod of the job with its name.
  label = {'training.kubeflow.org/job-name': tfjob()['metadata']['name']}
  assert manifests.ingress_only_among(manifest_documents()) == label


def test_dockerfile_copies_what_the_manifest_runs():
  with open(os.path.join(ROOT, 'deploy', 'Dockerfile')) as f:
    # COPY lines, continued over backslashes: COPY SOURCES... DEST.
    text = f.read().replace('\\\n', ' ')
  copies = [line.split()[1:-1] for line in text.splitlines()
            if line.startswith('COPY ')]
  sources = [s.rstrip('/') for srcs in copies for s in srcs]
  for source in sources:
    assert os.path.exists(os.path.join(ROOT, source)), source
  # Every module of the repository's top level (the trainer imports them),
  # the package they use, both requirements files (the first reads the
  # second) and the scripts (the downloader).
  modules = [f for f in os.listdir(ROOT) if f.endswith('.py')]
  for needed in modules + ['training', 'requirements.txt',
                           'requirements-keep-tensorflow.txt', 'scripts']:
    assert needed in sources, needed
