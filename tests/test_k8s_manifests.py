"""The Kubernetes manifests against Kubernetes' own schemas, and the plain
Kubernetes one (deploy/k8s.yaml): what each of its pods runs, and how.

kubernetes-validate ships the API's JSON schemas: no cluster, no network.
Strict mode: an unknown field (a misspelling) is an error, as it is for
`kubectl apply` (server-side strict field validation).
"""

import copy
import functools
import json
import operator
import os
import re
import types

import kubernetes_validate
import pytest
import tensorflow as tf

from helpers import ROOT
import manifests

import cifar10_input
import train_distributed
from training.graph import learning_rate
from training.storage import records

tf1 = tf.compat.v1

# The oldest Kubernetes with every Job feature k8s.yaml uses generally
# available (podFailurePolicy: 1.31), and the newest schemas shipped.
SCHEMA_VERSIONS = ('1.31', '1.37')
MANIFESTS = ('k8s.yaml', 'tfjob.yaml')

# The TFJob is a custom resource, with no schema in kubernetes-validate: its
# pod templates are validated as core/v1 PodTemplates, and its own fields
# checked against the training operator v1 CRD
# (manifests/base/crds/kubeflow.org_tfjobs.yaml), its replica types and
# restart policies against those the operator accepts.
TFJOB_FIELDS = {
    '': {'apiVersion', 'kind', 'metadata', 'spec'},
    'spec': {'enableDynamicWorker', 'runPolicy', 'successPolicy',
             'tfReplicaSpecs'},
    'spec.runPolicy': {'activeDeadlineSeconds', 'backoffLimit',
                       'cleanPodPolicy', 'schedulingPolicy', 'suspend',
                       'ttlSecondsAfterFinished'},
    'spec.tfReplicaSpecs': {'Chief', 'Master', 'PS', 'Worker', 'Evaluator'},
}
REPLICA_FIELDS = {'replicas', 'restartPolicy', 'template'}
RESTART_POLICIES = {'Always', 'OnFailure', 'Never', 'ExitCode'}


def at(document, path, absent=KeyError):
  """The value at a dotted path ('' is the document); digits index lists.
  A missing field raises KeyError, or gives `absent` where one is given."""
  keys = [int(k) if k.isdigit() else k for k in path.split('.') if k]
  try:
    return functools.reduce(operator.getitem, keys, document)
  except KeyError:
    if absent is KeyError:
      raise
    return absent


def tfjob_problems(job):
  """What the TFJob's own fields get wrong, as the CRD's schema sees it."""
  problems = ['TFJob %s: unknown field %r' % (path or '(top)', field)
              for path, known in TFJOB_FIELDS.items()
              for field in sorted(set(at(job, path, {})) - known)]
  for role, spec in sorted(job['spec']['tfReplicaSpecs'].items()):
    problems += ['TFJob %s: unknown field %r' % (role, field)
                 for field in sorted(set(spec) - REPLICA_FIELDS)]
    if spec.get('restartPolicy', 'Never') not in RESTART_POLICIES:
      problems.append('TFJob %s: restartPolicy %r' % (role,
                                                      spec['restartPolicy']))
  return problems


def schema_checked(document):
  """The objects to validate for a document: itself, or for a TFJob each
  replica's pod template as a PodTemplate (with the TFJob's metadata)."""
  if document['kind'] != 'TFJob':
    return [document]
  return [{'apiVersion': 'v1', 'kind': 'PodTemplate',
           'metadata': dict(document['metadata'], name='%s-%s' % (
               document['metadata']['name'], role.lower())),
           'template': spec['template']}
          for role, spec in sorted(document['spec']['tfReplicaSpecs'].items())]


def schema_problems(document, version):
  """What Kubernetes' schema (strict) finds wrong in a document, or []."""
  problems = tfjob_problems(document) if document['kind'] == 'TFJob' else []
  for checked in schema_checked(document):
    try:
      kubernetes_validate.validate(checked, version, strict=True)
    except kubernetes_validate.ValidationError as e:
      problems.append('%s %s: %s: %s' % (
          checked['kind'], checked['metadata']['name'],
          '.'.join(str(p) for p in e.path), e.message))
    except kubernetes_validate.SchemaNotFoundError as e:
      problems.append(e.message)  # A kind or apiVersion Kubernetes lacks.
  return problems


@pytest.mark.parametrize('version', SCHEMA_VERSIONS)
@pytest.mark.parametrize('name', MANIFESTS)
def test_every_document_validates_against_kubernetes_schema(name, version):
  for document in manifests.documents(name):
    assert schema_problems(document, version) == [], document['kind']


def rename(path, new):
  """A mutation: the field at path gets the name new."""
  def mutate(document):
    parent, _, old = path.rpartition('.')
    holder = at(document, parent)
    holder[new] = holder.pop(old)
  return mutate


def assign(path, value):
  """A mutation: the field at path gets the value."""
  def mutate(document):
    parent, _, field = path.rpartition('.')
    at(document, parent)[field] = value
  return mutate


# A misspelled field, a wrong type, an unknown API version, in each kind of
# document: (manifest, document, change, what the one problem found says).
BROKEN = {
    'k8s-container-field': (
        'k8s.yaml', 'cifar10-worker',
        rename('spec.template.spec.containers.0.volumeMounts', 'volumeMount'),
        "'volumeMount' was unexpected"),
    'k8s-job-field': (
        'k8s.yaml', 'cifar10-ps',
        rename('spec.completionMode', 'completionmode'),
        "'completionmode' was unexpected"),
    'k8s-job-type': (
        'k8s.yaml', 'cifar10-evaluator', assign('spec.backoffLimit', 'six'),
        "'six' is not of type 'integer'"),
    'k8s-service-field': (
        'k8s.yaml', 'cifar10',
        rename('spec.publishNotReadyAddresses', 'publishNotReadyAdresses'),
        "'publishNotReadyAdresses' was unexpected"),
    'k8s-unknown-api-version': (
        'k8s.yaml', 'cifar10', assign('apiVersion', 'v2'),
        "Couldn't find schema for kind Service with api version v2"),
    'tfjob-policy-field': (
        'tfjob.yaml', 'cifar10-grpc',
        rename('spec.policyTypes', 'policyType'),
        "'policyType' was unexpected"),
    'tfjob-container-field': (
        'tfjob.yaml', 'cifar10', rename(
            'spec.tfReplicaSpecs.Worker.template.spec.containers.0.resources',
            'resource'),
        "PodTemplate cifar10-worker: template.spec.containers.0: Additional "
        "properties are not allowed ('resource' was unexpected)"),
    'tfjob-replica-field': (
        'tfjob.yaml', 'cifar10',
        rename('spec.tfReplicaSpecs.PS.replicas', 'replica'),
        "TFJob PS: unknown field 'replica'"),
    'tfjob-spec-field': (
        'tfjob.yaml', 'cifar10', rename('spec.runPolicy', 'runpolicy'),
        "TFJob spec: unknown field 'runpolicy'"),
    'tfjob-restart-policy': (
        'tfjob.yaml', 'cifar10',
        assign('spec.tfReplicaSpecs.Evaluator.restartPolicy', 'OnExitCode'),
        "TFJob Evaluator: restartPolicy 'OnExitCode'"),
}


@pytest.mark.parametrize('name, document, mutate, found', BROKEN.values(),
                         ids=BROKEN.keys())
def test_a_broken_copy_fails_validation(name, document, mutate, found):
  (original,) = [d for d in manifests.documents(name)
                 if d['metadata']['name'] == document]
  broken = copy.deepcopy(original)
  mutate(broken)
  assert broken != original
  problems = schema_problems(broken, SCHEMA_VERSIONS[-1])
  assert len(problems) == 1 and found in problems[0], problems


# deploy/k8s.yaml: a headless Service and Indexed Jobs, no operator.

INDEX_FIELD = ("metadata.annotations['batch.kubernetes.io/job-completion-"
               "index']")


def k8s_documents(kind):
  return [d for d in manifests.documents('k8s.yaml') if d['kind'] == kind]


def jobs():
  """{'ps' | 'worker' | 'evaluator': its Job}, by the pods' component."""
  return {j['spec']['template']['metadata']['labels'][
      'app.kubernetes.io/component']: j for j in k8s_documents('Job')}


def service():
  (headless,) = k8s_documents('Service')
  return headless


def expand(text, env):
  """Kubernetes' $(VAR) expansion in a command or an env value: $$ is a
  literal $, an undefined $(VAR) stays as written."""
  return re.sub(r'\$(\$|\(([A-Za-z_][A-Za-z0-9_]*)\))',
                lambda m: '$' if m.group(1) == '$' else env.get(
                    m.group(2), m.group(0)), text)


def pod_argv(job, index):
  """The trainer's arguments in the Job's pod `index`, as Kubernetes
  expands them."""
  container = manifests.trainer(job['spec']['template'])
  env = {}
  for var in container.get('env', []):
    if 'valueFrom' in var:
      # Only an Indexed Job's pods carry their index.
      assert job['spec']['completionMode'] == 'Indexed'
      assert var['valueFrom'] == {'fieldRef': {'fieldPath': INDEX_FIELD}}
      env[var['name']] = str(index)
    else:
      env[var['name']] = expand(var['value'], env)
  argv = [expand(a, env) for a in manifests.trainer_argv(container)]
  assert not [a for a in argv if '$(' in a], argv
  return argv


def pod_hosts(job, slots=None):
  """The host:port of each of an Indexed Job's pods (or of its first slots
  indexes, those it may grow to): its host name JOB-INDEX in the Service's
  subdomain, on the Service's port."""
  spec, pod = job['spec'], job['spec']['template']['spec']
  assert spec['completionMode'] == 'Indexed'
  assert spec['parallelism'] == spec['completions']  # All run at once.
  assert pod['subdomain'] == service()['metadata']['name']
  (port,) = [p['port'] for p in service()['spec']['ports']]
  return ','.join('%s-%d.%s:%d' % (job['metadata']['name'], i,
                                   pod['subdomain'], port)
                  for i in range(slots or spec['completions']))


def gpus(job):
  return manifests.trainer(job['spec']['template']).get('resources', {}).get(
      'limits', {}).get('nvidia.com/gpu', 0)


def test_k8s_shape_one_ps_two_gpu_workers_one_evaluator_on_one_volume():
  by_role = jobs()
  assert sorted(by_role) == ['evaluator', 'ps', 'worker']
  assert {r: j['spec']['completions'] for r, j in by_role.items()} == {
      'ps': 1, 'worker': 2, 'evaluator': 1}
  assert {r: gpus(j) for r, j in by_role.items()} == {
      'ps': 0, 'worker': 1, 'evaluator': 0}
  (claim,) = k8s_documents('PersistentVolumeClaim')
  assert claim['spec']['accessModes'] == ['ReadWriteMany']
  images = set()
  for role, job in by_role.items():
    template = job['spec']['template']
    manifests.assert_mounts_the_claim(template, claim['metadata']['name'])
    if role != 'ps':  # The ps reads no data.
      manifests.assert_init_fetches_the_data(template)
    images |= {c['image'] for c in template['spec'].get('initContainers', [])
               + template['spec']['containers']}
  assert len(images) == 1, images  # One image to set.


@pytest.mark.parametrize('role, index', [
    ('ps', 0), ('worker', 0), ('worker', 1), ('worker', 2), ('worker', 3),
    ('evaluator', 0)])
def test_each_k8s_pod_runs_its_task_on_the_services_dns_names(
    flags, monkeypatch, role, index):
  monkeypatch.delenv('TF_CONFIG', raising=False)
  job = jobs()[role]
  # The pod sees the GPUs its limit gives it: --num_gpus may not ask more.
  monkeypatch.setattr(train_distributed.tf.config, 'list_physical_devices',
                      lambda kind: ['GPU:%d' % i for i in range(gpus(job))])
  flags(['train_distributed.py'] + pod_argv(job, index))  # Unknown: raises.
  task = train_distributed.check_flags()  # As the trainer starts: TF_CONFIG,
  assert (task.job_name, task.task_index) == (role, index)  # checks, task.
  if role != 'evaluator':  # Flags alone, one host list for all.
    assert flags.ps_hosts == pod_hosts(jobs()['ps'])
    # The 2 workers that run first, in 4 slots the job may grow to.
    assert flags.worker_hosts == pod_hosts(jobs()['worker'], slots=4)
    assert flags.worker_hosts.startswith(pod_hosts(jobs()['worker']) + ',')
  if role == 'worker':  # A gradient per listed slot, as the trainer takes it.
    assert flags.replicas_to_aggregate is None
    assert len(task.worker_hosts) == 4
  if role != 'ps':  # The ps writes where the chief's saver tells it.
    assert flags.train_dir == '/shared/train'
    assert flags.data_dir == '/shared/data/cifar-10-batches-bin'
    assert flags.max_steps == 100000  # The evaluator stops there too.
  assert flags.num_gpus == gpus(job)


def test_the_headless_service_selects_the_ps_and_workers_on_their_port():
  spec = service()['spec']
  assert spec['clusterIP'] == 'None'  # A DNS name per pod, no proxy.
  assert spec['publishNotReadyAddresses'] is True
  assert spec['selector']
  for role, job in jobs().items():
    template = job['spec']['template']
    selected = spec['selector'].items() <= template['metadata'][
        'labels'].items()
    assert selected == (role != 'evaluator'), role  # It has no address.
    if selected:
      ports = [p['containerPort'] for p in manifests.trainer(template)[
          'ports']]
      assert ports == [p['targetPort'] for p in spec['ports']] == [2222]
      assert all(len(h.split('.')[0]) <= 63  # A host name's limit.
                 for h in pod_hosts(job).split(','))


def test_the_network_policy_admits_only_the_jobs_own_pods():
  labels = manifests.ingress_only_among(manifests.documents('k8s.yaml'))
  for role, job in jobs().items():
    assert labels.items() <= job['spec']['template']['metadata'][
        'labels'].items(), role


def failure_action(job, container, exit_code, disrupted=False):
  """What the Job controller does with a failed pod: the action of the
  first podFailurePolicy rule it matches, else Count (towards
  backoffLimit)."""
  for rule in job['spec']['podFailurePolicy']['rules']:
    if 'onPodConditions' in rule:
      if disrupted and {'type': 'DisruptionTarget', 'status': 'True'} in rule[
          'onPodConditions']:
        return rule['action']
      continue
    codes = rule['onExitCodes']
    if codes.get('containerName', container) == container and (
        exit_code in codes['values']) == (codes['operator'] == 'In'):
      return rule['action']
  return 'Count'


@pytest.mark.parametrize('role', ['ps', 'worker', 'evaluator'])
def test_k8s_failures_follow_the_exit_code_contract(role):
  job = jobs()[role]
  # podFailurePolicy needs it: a failed pod is replaced, not restarted.
  assert job['spec']['template']['spec']['restartPolicy'] == 'Never'
  assert job['spec']['backoffLimit'] >= 1
  for rule in job['spec']['podFailurePolicy']['rules']:
    if 'onExitCodes' in rule:  # A name the pod has; In may not list 0.
      assert rule['onExitCodes']['containerName'] == 'tensorflow'
      assert 0 not in rule['onExitCodes']['values']
  actions = {code: failure_action(job, 'tensorflow', code)
             for code in (1, 2, 130, 137, 143)}
  assert actions == {1: 'FailJob', 2: 'FailJob', 130: 'Count',
                     137: 'Count', 143: 'Count'}
  # Evicted or preempted (SIGTERM first): replaced without counting.
  assert failure_action(job, 'tensorflow', 143, disrupted=True) == 'Ignore'
  # A failed download is retried.
  assert failure_action(job, 'fetch-data', 1) == 'Count'


def test_updates_hand_out_as_many_tokens_as_they_take_gradients():
  # docs/kubernetes.md's argument that no running worker's gradient is
  # dropped: each update takes a gradient per listed slot and hands out a
  # token per gradient, as SyncReplicasOptimizer is built by the trainer
  # (replicas_to_aggregate defaults to the workers listed).
  argv = pod_argv(jobs()['worker'], 0)
  (hosts,) = [a.split('=', 1)[1] for a in argv
              if a.startswith('--worker_hosts=')]
  given = [int(a.split('=', 1)[1]) for a in argv
           if a.startswith('--replicas_to_aggregate=')]
  slots = len(hosts.split(','))
  opt = tf1.train.SyncReplicasOptimizer(
      tf1.train.GradientDescentOptimizer(0.1),
      replicas_to_aggregate=(given or [slots])[0], total_num_replicas=slots)
  # pylint: disable-next=protected-access
  assert opt._tokens_per_step == opt._replicas_to_aggregate == slots == 4
  # The TFJob lists the workers it runs: neither manifest takes fewer.
  for name in MANIFESTS:
    for document in manifests.documents(name):
      for template in pod_templates(document):
        argv = manifests.trainer_argv(manifests.trainer(template))
        assert not [a for a in argv if 'replicas_to_aggregate' in a], name


def pod_templates(document):
  """The pod templates of a Job or a TFJob; [] for any other kind."""
  if document['kind'] == 'TFJob':
    return [s['template'] for s in document['spec']['tfReplicaSpecs'].values()]
  return [document['spec']['template']] if document['kind'] == 'Job' else []


def test_the_docs_scaling_commands_fit_the_manifest():
  with open(os.path.join(ROOT, 'docs', 'kubernetes.md'),
            encoding='utf-8') as f:
    doc = ' '.join(f.read().split())  # Its lines wrapped anywhere.
  patches = re.findall(r"kubectl patch job (\S+) --type=merge -p '([^']*)'",
                       doc)
  workers = jobs()['worker']
  sizes = []
  for name, patch in patches:
    assert name == workers['metadata']['name']
    spec = json.loads(patch)['spec']
    assert spec['completions'] == spec['parallelism']  # Elastic: both.
    sizes.append(spec['completions'])
  assert sizes == [4, workers['spec']['completions']]  # To every slot, back.
  # The slots it names are those listed, and each update takes them all.
  hosts = pod_hosts(workers, slots=4).split(',')
  assert '--worker_hosts=%s,...,%s' % (hosts[0], hosts[-1]) in doc
  assert 'lost worker 3 at %s' % hosts[3] in doc
  assert 'the 2 left compute its share of each update of 4 gradients' in doc


def test_the_pages_line_for_a_train_dir_of_the_earlier_manifest(flags,
                                                                tmp_path):
  # The earlier manifest's updates took 2 gradients, now 4: the default
  # exponential schedule decays after as many examples, so at other global
  # steps. The chief says so, once.
  def schedule(gradients):
    examples = gradients * flags.batch_size
    return learning_rate.Schedule(
        flags.lr_schedule, flags.initial_learning_rate, examples,
        flags.lr_scaling, flags.warmup_steps, 100000, learning_rate.decay_steps(
            cifar10_input.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN, examples,
            flags.num_epochs_per_decay), flags.learning_rate_decay_factor)
  said = []
  resume = types.SimpleNamespace(step=1234)
  records.check_schedule_record(str(tmp_path), schedule(2), None,
                                    said.append)
  for _ in range(2):
    records.check_schedule_record(str(tmp_path), schedule(4), resume,
                                      said.append)
  assert len(said) == 1, said
  line = 'Worker 0: ' + said[0].replace(str(tmp_path), '/shared/train').replace(
      'global step 1234', 'global step N')
  with open(os.path.join(ROOT, 'docs', 'kubernetes.md'),
            encoding='utf-8') as f:
    assert '\n    %s\n' % line in f.read()
