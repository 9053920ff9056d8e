"""The trainer's flags: the reference's (same names, same defaults) and the
suite's, with their checks. Only train_distributed.py imports this module,
and it alone reads the values.

A value the checks refuse is one `Error:` line and exit status 2, as every
other mistake on the command line here (parse_flags).
"""

import re
import sys

from absl import app
from absl import flags

import cifar10_input
import cifar10_model
from training.graph import learning_rate

FLAGS = flags.FLAGS

# The reference's flags: same names, same defaults.
flags.DEFINE_string('train_dir', './models_cifar10',
                    'Directory where to write event logs and checkpoint.')
flags.DEFINE_integer('max_steps', 1000000, 'Number of batches to run.')
flags.DEFINE_boolean('log_device_placement', False,
                     'Whether to log device placement.')
flags.DEFINE_integer('batch_size', 128,
                     'Number of images to process in a batch.')
flags.DEFINE_string('data_dir', './cifar-10-batches-bin',
                    'Path to the CIFAR-10 data directory.')
flags.DEFINE_integer('num_gpus', 0, 'Total number of gpus for each machine. '
                     'If you don\'t use GPU, please set it to \'0\'. Worker '
                     'i uses GPU i % num_gpus; ps tasks never use a GPU.')
flags.DEFINE_string('ps_hosts', 'localhost:2222',
                    'Comma-separated list of hostname:port pairs. Empty: '
                    'train in one process, without a cluster.')
flags.DEFINE_string('worker_hosts', 'localhost:2223,localhost:2224',
                    'Comma-separated list of hostname:port pairs')
flags.DEFINE_string('job_name', None, 'job name: worker or ps; or evaluator, '
                    'which evaluates the chief\'s checkpoints on the test '
                    'set and needs no cluster')
flags.DEFINE_integer('task_index', None, 'Index of task within the job')
flags.DEFINE_boolean('sync_replicas', True, 'Whether or not to synchronize '
                     'the replicas during training.')
flags.DEFINE_boolean('existing_servers', False,
                     'Whether servers already exists. If True, will use the '
                     'worker hosts via their GRPC URLs (one client process '
                     'per worker host). Otherwise, will create an in-process '
                     'TensorFlow server. That server was started with its '
                     'own GPU and thread settings: this process\'s '
                     '--num_gpus and --intra_op_threads do not apply to it.')
flags.DEFINE_integer('replicas_to_aggregate', None,
                     'Number of replicas to aggregate before parameter update '
                     'is applied (For sync_replicas mode only; default: '
                     'num_workers). Fewer than num_workers makes the slowest '
                     'workers backups whose gradients are dropped.')

# Our additions.
flags.DEFINE_integer('save_checkpoint_steps', 100,
                     'The chief writes a checkpoint every this many global '
                     'steps, and at the end.')
flags.DEFINE_integer('save_summaries_steps', 100, 'The chief writes '
                     'TensorBoard summaries every this many global steps.')
flags.DEFINE_integer('log_frequency', 10,
                     'Print a progress line every this many local steps.')
flags.DEFINE_integer('num_preprocess_threads', 16,
                     'Threads that read and preprocess images.')
flags.DEFINE_boolean('distort', True,
                     'Augment training images (pad and random crop, flip, '
                     'brightness, contrast). The reference had this off.')
flags.DEFINE_integer('crop_padding', cifar10_input.PAD_PIXELS,
                     'With --distort: the most pixels a crop shifts; 0: none.')
flags.DEFINE_float('random_erasing', 0.0, 'With --distort: the share of '
                   'training photos with a random rectangle erased (Zhong et '
                   'al. 2020), after the standardization; 0: none.')
flags.DEFINE_enum('erasing_fill', 'noise', list(cifar10_input.ERASE_FILLS),
                  'With --random_erasing: noise of the photo\'s mean and '
                  'deviation, or its mean.')
flags.DEFINE_boolean('standardize', True, 'Per-image standardization of the '
                     'input. The reference had this off (raw 0..255 pixels).')
flags.DEFINE_float('initial_learning_rate', 0.1, 'Initial learning rate.')
flags.DEFINE_float('num_epochs_per_decay', 350.0,
                   'Epochs after which the learning rate decays.')
flags.DEFINE_float('learning_rate_decay_factor', 0.1,
                   'Learning rate decay factor.')
flags.DEFINE_enum('lr_schedule', 'exponential', learning_rate.SCHEDULES,
                  'exponential: the reference\'s decay (flags above); '
                  'cosine: from the initial rate to 0 at --max_steps.')
flags.DEFINE_integer('warmup_steps', 0, 'Steps of linear warmup.')
flags.DEFINE_enum('lr_scaling', 'none', learning_rate.SCALINGS, 'linear: '
                  '--initial_learning_rate is for 128 examples per update, '
                  'and scales with the examples an update aggregates.')
flags.DEFINE_enum('optimizer', 'sgd', ['sgd', 'momentum'], 'sgd: plain '
                  'SGD, the reference\'s; momentum: its accumulators beside '
                  'their variables on the ps tasks, in the checkpoints.')
flags.DEFINE_float('momentum', 0.9, 'With --optimizer=momentum: the factor '
                   'each step keeps of the accumulated gradients.')
flags.DEFINE_boolean('nesterov', False, 'With --optimizer=momentum: '
                     'Nesterov\'s momentum.')
flags.DEFINE_float('weight_decay', cifar10_model.WEIGHT_DECAY, 'The L2 '
                   'term\'s factor on the weights in the loss.')
flags.DEFINE_float('label_smoothing', 0.0, 'The share of each label spread '
                   'evenly over the classes in the loss; 0: none.')
flags.DEFINE_float('batch_norm_decay', None,
                   'The share of BatchNorm\'s moving statistics each update '
                   'keeps; default %g, and %g to the power of the gradients '
                   'a synchronous update aggregates (they are updated once '
                   'an update).' % ((cifar10_model.BATCH_NORM_DECAY,) * 2))
flags.DEFINE_integer('seed', 0, 'Random seed; worker i uses seed + i for its '
                     'file order, shuffling and augmentation.')
flags.DEFINE_boolean('fresh_start', False, 'Chief only: delete --train_dir and '
                     'start over instead of resuming its latest checkpoint.')
flags.DEFINE_boolean('new_data', False, 'Chief: resume a --train_dir trained '
                     'on other data (to fine-tune); the new data is recorded.')
flags.DEFINE_integer('intra_op_threads', 0, 'Threads each op may use in a '
                     'worker; 0: the cores it may use here (within a CPU '
                     'quota) divided by the workers listed on this host, so '
                     'that they do not fight over cores.')
flags.DEFINE_float('eval_interval_secs', 5,
                   'Evaluator: how often to look for a new checkpoint.')
flags.DEFINE_boolean('run_once', False,
                     'Evaluator: evaluate the latest checkpoint and exit.')
flags.DEFINE_boolean('eval_flips', False, 'Evaluator: also the accuracy with '
                     'each photo\'s logits averaged with its mirror\'s, '
                     'beside the plain one.')
flags.DEFINE_boolean('mixed_precision', False,
                     'Worker: compute in bfloat16 on a CPU, float16 on a GPU; '
                     'variables and checkpoints stay float32.')
flags.DEFINE_enum('mixed_precision_dtype', 'auto',
                  ['auto', 'bfloat16', 'float16'],
                  'With --mixed_precision; float16 on a CPU runs its CPU '
                  'kernels, no faster: to check float16 before a GPU run.')
flags.DEFINE_float('initial_loss_scale', 32768.0, 'Worker, with float16: the '
                   'loss scale to start from (TensorFlow\'s default).')
flags.DEFINE_integer('loss_scale_period', 2000, 'Worker, with float16: good '
                     'steps in a row that double the loss scale.')
flags.DEFINE_integer('wait_report_secs', 10, 'Seconds a task waits for '
                     'another before it names it; again every twice that.')
flags.DEFINE_enum('transfer_dtype', 'float32', ['float32', 'bfloat16'],
                  'Worker in a cluster: what weights and gradients cross the '
                  'network as; the ps accumulates and applies in float32.')
flags.DEFINE_integer('lost_worker_secs', 10, 'Seconds a task\'s port '
                     'refuses connections (or does not answer) before it '
                     'counts as lost, for every role: the chief gives a lost '
                     'worker\'s share of each update to the others and no ps '
                     'waits for it at the end; the other workers wait for a '
                     'lost chief.')
flags.DEFINE_boolean('set_aside', True, 'Synchronous chief: set a worker that '
                     'lags aside (the others make its share of each update) '
                     'and take it back once it keeps pace; --noset_aside '
                     'waits for every worker.')
flags.DEFINE_boolean('pack_transfers', True, 'Worker in a cluster: send each '
                     'kind of tensor once per ps a step (weights, gradients, '
                     'BatchNorm statistics); --nopack_transfers runs the '
                     'article\'s plain graph, to read or compare.')
flags.DEFINE_list('trace_steps', [], 'Worker: its own steps (from 1) to '
                  'write a Chrome trace of, into --train_dir, e.g. 50,51.')


def require(name, holds, what):
  """An absl validator: --name must be what, said with the value given."""
  def check(value):
    if not holds(value):
      raise flags.ValidationError('--%s must be %s (got %s)' % (
          name, what, ','.join(value) if isinstance(value, list) else value))
    return True
  flags.register_validator(name, check)


for _name in ('batch_size', 'max_steps', 'save_checkpoint_steps',
              'save_summaries_steps', 'log_frequency',
              'num_preprocess_threads', 'loss_scale_period',
              'wait_report_secs', 'lost_worker_secs'):
  require(_name, lambda v: v >= 1, 'at least 1')
for _name in ('eval_interval_secs', 'intra_op_threads', 'num_gpus',
              'warmup_steps', 'crop_padding'):
  require(_name, lambda v: v >= 0, '0 or more')
require('initial_loss_scale', lambda v: v > 0, 'more than 0')  # NaN neither.
for _name in ('momentum', 'label_smoothing', 'batch_norm_decay'):
  require(_name, lambda v: v is None or 0 <= v < 1, 'at least 0 and below 1')
require('random_erasing', lambda v: 0 <= v <= 1, 'from 0 to 1')
require('weight_decay', lambda v: v >= 0, '0 or more')
flags.register_multi_flags_validator(
    ['optimizer', 'momentum', 'nesterov'],
    lambda v: v['optimizer'] == 'momentum' or (
        v['momentum'] == FLAGS['momentum'].default and not v['nesterov']),
    message='--momentum and --nesterov apply with --optimizer=momentum '
    'only: add it, or drop them')
flags.register_multi_flags_validator(
    ['random_erasing', 'distort'],
    lambda v: v['distort'] or not v['random_erasing'],
    message='--random_erasing erases with --distort only: drop --nodistort, '
    'or --random_erasing')
flags.register_multi_flags_validator(
    ['erasing_fill', 'random_erasing'],
    lambda v: v['random_erasing'] or not FLAGS['erasing_fill'].present,
    message='--erasing_fill applies with --random_erasing only: add it, or '
    'drop --erasing_fill')
require('trace_steps', lambda v: all(s.isdigit() and int(s) >= 1 for s in v),
        'step numbers from 1, e.g. 50,51')


def parse_flags(argv):
  """absl's parsing; a value our validators refuse, or one absl cannot
  read as the flag's kind, is one Error: line and exit status 2, as every
  other mistake on the command line here. An unknown flag keeps absl's
  words (and its exit status 1)."""
  try:
    return FLAGS(argv)
  except flags.Error as e:
    # absl says 'flag --NAME=VALUE: MESSAGE' (flags NAME=VALUE, ...: for
    # several); our messages name the flag.
    mine = re.match(r'flags? .*?: (--.*)', str(e), re.S)
    value = re.match(r'flag (--[^=]+)=(.*?): (.*)', str(e), re.S)
    if mine:
      print('Error: %s' % mine.group(1), file=sys.stderr)
      sys.exit(2)
    if value:
      name, given, why = value.groups()
      if 'boolean' in why:
        why = 'it takes no value: give %s or --no%s' % (name, name[2:])
      elif 'invalid literal' in why:  # (Python's words name no flag.)
        why = 'must be a whole number'
      elif 'convert' in why:
        why = 'must be a number'
      print('Error: %s=%s: %s' % (name, given, why.splitlines()[0]),
            file=sys.stderr)
      sys.exit(2)
  return app.parse_flags_with_usage(argv)  # absl's words and exit status.
