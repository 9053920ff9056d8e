"""pytest's fixtures: tiny datasets on disk, processes killed by PID, the
trainer's flags, the fork server stopped, each test's environment restored,
the slow tests first, and two tests at a time (pytest-xdist) but for those
marked alone. What the
tests share besides is in helpers.py (importing it sets up the suite's
environment: see suite_env.from_caller)."""

import fcntl
import os

import pytest

import forkserver_client
import helpers
import suite_env
import make_synthetic_cifar10  # From scripts/, on the path helpers sets.


def pytest_report_header():
  """Says which of the caller's variables the suite does not pass on."""
  if suite_env.DROPPED_FROM_CALLER:
    return ['environment: not passed on to the tests and their tasks: ' +
            ' '.join('%s=%r' % kv for kv in sorted(
                suite_env.DROPPED_FROM_CALLER.items()))]
  return []


def pytest_sessionstart(session):
  """Drops what TensorFlow's C++ wrote as this file imported helpers: under
  pytest-xdist the controller runs no test whose capture takes it, and
  pytest would write it out at the end (its capture manager, a plugin)."""
  capture = session.config.pluginmanager.getplugin('capturemanager')
  if capture:  # (None with -p no:capture.)
    capture.read_global_capture()


def pytest_configure(config):
  config.addinivalue_line(
      'markers', 'alone: runs while no other test does (it measures CPU '
      'time); under the README\'s -n 2 the other worker waits for it')
  config.addinivalue_line(
      'markers', 'slow: left out of the quick tier (README: -m "not slow"); '
      'every module keeps a quick test (test_structure.py)')


@pytest.hookimpl(trylast=True)  # After pytest's own reordering.
def pytest_collection_modifyitems(items):
  """The slow tests first, each group in its files' order: pytest-xdist's
  worksteal hands one worker the slow ones, the other the quick ones and
  then half of what is left, so that no long test starts last. (Slow
  tests on both workers at once ran the suite 40% longer on 2 cores.)"""
  items.sort(key=lambda item: item.get_closest_marker('slow') is None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """Under pytest-xdist, a test marked alone runs while no other test does;
  the others run side by side. A readers-writer lock on files the run's
  workers share, held through the test's setup and teardown, module
  fixtures included: every test passes a gate on its way in, which an
  alone test holds while it waits, so the other worker cannot start test
  after test ahead of it."""
  if 'PYTEST_XDIST_WORKER' not in os.environ:  # One test at a time anyway.
    return (yield)
  # xdist gives each worker a --basetemp inside the run's own folder.
  shared = os.path.dirname(item.config.getoption('basetemp'))
  alone = item.get_closest_marker('alone') is not None
  with open(os.path.join(shared, 'gate.lock'), 'a') as gate, \
       open(os.path.join(shared, 'tests.lock'), 'a') as tests:
    fcntl.flock(gate, fcntl.LOCK_EX)
    fcntl.flock(tests, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    fcntl.flock(gate, fcntl.LOCK_UN)
    return (yield)  # Closing the files lets the lock go.


@pytest.fixture(scope='session')
def tiny_data(tmp_path_factory):
  """A synthetic CIFAR-10 directory: 5 x 40 training and 50 test records."""
  data_dir = str(tmp_path_factory.mktemp('cifar10') / 'cifar-10-batches-bin')
  make_synthetic_cifar10.main(['--data_dir', data_dir, '--train_records',
                               '40', '--test_records', '50', '--seed', '1'])
  return data_dir


@pytest.fixture(scope='session', autouse=True)
def _stop_fork_server():
  yield
  forkserver_client.FORK_SERVER.stop()


@pytest.fixture(autouse=True)
def _restore_environ():
  """Gives every test the environment the suite started with. A test that
  imports a script setting a variable (scripts/show_inputs.py once set
  TF_CPP_MIN_LOG_LEVEL) changed it for every later test, whose trainers
  then differed from the fork server's and each started Python afresh: the
  suite took 17 minutes instead of 11."""
  before = dict(os.environ)
  yield
  os.environ.clear()
  os.environ.update(before)


@pytest.fixture
def procs(tmp_path):
  """Starts a test's processes (helpers.Processes); kills those left at its
  end, by PID."""
  p = helpers.Processes(str(tmp_path))
  yield p
  p.kill_all()


@pytest.fixture
def flags():
  """train_distributed's flags at their defaults, as in a fresh process."""
  import train_distributed  # pylint: disable=g-import-not-at-top
  values = train_distributed.FLAGS
  for name in values:
    values[name].unparse()
  yield values
  for name in values:
    values[name].unparse()
