"""training/cluster/ports.py: free ports below the kernel's ephemeral range, or in
the range FREE_PORT_RANGE gives (each worker of the suite its own share); a
bad range is one line."""

import subprocess
import sys

import pytest

from suite_env import ROOT, suite_env, worker_port_range
from training.cluster import ports


def test_ports_come_from_below_the_ephemeral_range(monkeypatch):
  monkeypatch.delenv('FREE_PORT_RANGE', raising=False)
  with open('/proc/sys/net/ipv4/ip_local_port_range') as f:
    ephemeral = int(f.read().split()[0])
  got = ports.free_ports(20)
  assert len(set(got)) == 20
  assert all(1024 <= p < ephemeral for p in got), (got, ephemeral)
  if ephemeral >= 11000:  # Not a machine set up oddly.
    assert min(got) >= 10000, got


def test_ports_come_from_the_range_given(monkeypatch):
  monkeypatch.setenv('FREE_PORT_RANGE', '20000-20010')
  got = ports.free_ports(5)
  assert len(set(got)) == 5 and set(got) <= set(range(20000, 20010)), got


@pytest.mark.parametrize('given', ['20000', '20010-20000', '80-90',
                                   '20000-70000', ' 20000-20010', 'a-b'])
def test_a_bad_range_is_one_line(given):
  out = subprocess.run(
      [sys.executable, 'training/cluster/ports.py', '2'], cwd=ROOT,
      env=suite_env({'FREE_PORT_RANGE': given}), capture_output=True,
      text=True)
  assert (out.returncode, out.stdout) == (1, '')
  assert out.stderr == ('Error: FREE_PORT_RANGE=%r: give LOW-HIGH, 1024 <= '
                        'LOW < HIGH <= 65536 (HIGH not included), or unset '
                        'it\n' % given)


def test_each_worker_of_the_suite_has_its_own_share(monkeypatch):
  monkeypatch.setenv('FREE_PORT_RANGE', '10000-20000')
  assert [worker_port_range('gw%d' % k, 2) for k in (0, 1)] == [
      '10000-15000', '15000-20000']
  assert [worker_port_range('gw%d' % k, 3) for k in (0, 1, 2)] == [
      '10000-13333', '13333-16666', '16666-19999']
