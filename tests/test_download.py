"""The CIFAR-10 downloader against a local HTTP server on 127.0.0.1.

The server serves a small cifar-10-binary.tar.gz made from tiny_data (its
MD5 passed with --md5), records every request's headers and what it sent,
and can be made to ignore Range, omit Content-Length, cut the body short, or
stall partway until the test lets it go (so that a SIGINT lands
mid-download every time).
"""

import fcntl
import hashlib
import http.server
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time

import pytest

import download_cifar10
from helpers import ROOT, free_ports
from training.storage import resumable_download

SCRIPT = os.path.join(ROOT, 'scripts', 'download_cifar10.py')
NAME = 'cifar-10-binary.tar.gz'


class Server:
  """Serves body at /cifar-10-binary.tar.gz on 127.0.0.1, port 0.

  ranges: answer `Range: bytes=N-` with 206 (416 past the end); False
    answers 200 with everything, as a server without Range support does.
  content_length: send Content-Length (without it the body ends when the
    connection closes).
  chunk, delay: the body goes out in chunks of this many bytes, with this
    many seconds after each.
  cut_after: the first response ends, connection closed, after this many
    bytes of its body.
  stall_after: the first response stops after this many bytes of its body
    until `release` is set.
  """

  def __init__(self, body, ranges=True, content_length=True, chunk=1 << 16,
               delay=0.0, cut_after=None, stall_after=None):
    self.body = body
    self.md5 = hashlib.md5(body).hexdigest()
    self.requests = []  # The headers of each request, as a dict.
    self.sent = []  # Body bytes sent for each request.
    self.release = threading.Event()
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):

      def do_GET(self):  # pylint: disable=invalid-name
        server.requests.append(dict(self.headers))
        server.sent.append(0)
        if self.path != '/' + NAME:
          self.send_error(404)
          return
        start, first = server.start(self), len(server.requests) == 1
        if start is None:
          return
        payload = body[start:]
        try:
          for i in range(0, len(payload), chunk):
            if first and stall_after is not None and i >= stall_after:
              server.release.wait(30)
              return
            if first and cut_after is not None and i >= cut_after:
              return
            self.wfile.write(payload[i:i + chunk])
            self.wfile.flush()
            server.sent[-1] += len(payload[i:i + chunk])
            time.sleep(delay)
        except OSError:
          pass  # The client went away (interrupted).

      def log_message(self, *args):
        pass

    self.ranges, self.content_length = ranges, content_length
    self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self.url = 'http://127.0.0.1:%d/%s' % (self.httpd.server_port, NAME)
    self.thread = threading.Thread(target=self.httpd.serve_forever,
                                   args=(0.05,), daemon=True)
    self.thread.start()

  def start(self, handler):
    """Sends the status and headers; returns the first byte to send, or None
    when there is no body."""
    start, status = 0, 200
    match = re.match(r'bytes=(\d+)-$', handler.headers.get('Range') or '')
    if match and self.ranges:
      start, status = int(match.group(1)), 206
      if start >= len(self.body):
        handler.send_response(416)
        handler.send_header('Content-Range', 'bytes */%d' % len(self.body))
        handler.send_header('Content-Length', '0')
        handler.end_headers()
        return None
    handler.send_response(status)
    if status == 206:
      handler.send_header('Content-Range', 'bytes %d-%d/%d' % (
          start, len(self.body) - 1, len(self.body)))
    if self.content_length:
      handler.send_header('Content-Length', str(len(self.body) - start))
    handler.end_headers()
    return start

  def ranges_asked(self):
    return [r.get('Range') for r in self.requests]

  def close(self):
    self.release.set()
    self.httpd.shutdown()
    self.httpd.server_close()


@pytest.fixture
def archive(tiny_data):
  """The bytes of a cifar-10-binary.tar.gz holding tiny_data."""
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w:gz') as tar:
    tar.add(tiny_data, arcname='cifar-10-batches-bin')
  return buf.getvalue()


@pytest.fixture
def serve(archive):
  """serve(**options) starts a Server of the archive (or of body=...); all
  are closed at the end."""
  servers = []

  def start(body=archive, **options):
    servers.append(Server(body, **options))
    return servers[-1]

  yield start
  for server in servers:
    server.close()


@pytest.fixture
def served(serve):
  """(url, md5) of a plain server."""
  server = serve()
  return server.url, server.md5


@pytest.fixture
def data_dir(tmp_path):
  return str(tmp_path / 'data' / 'cifar-10-batches-bin')


def part_of(data_dir):
  return data_dir + '.tar.gz.part'


def assert_holds(data_dir, tiny_data):
  """data_dir holds exactly tiny_data's files, byte for byte, is valid, and
  nothing else is next to it."""
  assert sorted(os.listdir(data_dir)) == sorted(os.listdir(tiny_data))
  for name in os.listdir(tiny_data):
    with open(os.path.join(data_dir, name), 'rb') as got, \
        open(os.path.join(tiny_data, name), 'rb') as want:
      assert got.read() == want.read(), name
  assert download_cifar10.is_valid(data_dir)
  assert os.listdir(os.path.dirname(data_dir)) == [
      os.path.basename(data_dir)]


def one_line(text):
  assert text.endswith('\n') and text.count('\n') == 1, repr(text)
  return text


def run_script(*args, timeout=30):
  """Runs the downloader in its own process; returns (rc, stdout, stderr)."""
  proc = subprocess.Popen([sys.executable, SCRIPT] + list(args),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, cwd=ROOT)
  try:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err
  finally:
    if proc.poll() is None:
      os.kill(proc.pid, signal.SIGKILL)
      proc.wait()


def last_progress(line):
  """The last state of a progress bar redrawn with carriage returns."""
  return line.split('\r')[-1]


def kilobytes(n):
  """n bytes as tqdm's progress bar counts them: 3 digits and k (the test
  archive is between 100 and 999 kB)."""
  assert 100e3 <= n < 999.5e3
  return '%.0fk' % (n / 1e3)


def test_downloads_checks_and_unpacks(served, archive, data_dir, tiny_data,
                                      capsys):
  url, md5 = served
  assert download_cifar10.main(['--data_dir', data_dir, '--url', url,
                                '--md5', md5]) == 0
  assert_holds(data_dir, tiny_data)  # The .part file is gone too.
  out = capsys.readouterr().out.split('\n')
  assert out[0] == 'Downloading %s (%s) into %s' % (
      url, resumable_download.size(len(archive)), part_of(data_dir))
  # Then the progress bar, on one line; it ends at every byte, 100%, no
  # time left, and the rate.
  assert len(out) == 4 and out[-2:] == ['CIFAR-10 is in %s' % data_dir, '']
  bar = last_progress(out[1])
  assert bar.startswith('100%|')
  assert '| %s/%s [' % (kilobytes(len(archive)), kilobytes(len(archive))) in bar
  assert re.search(r'<00:00, [\d.]+[kMG]?B/s\]$', bar), bar
  # A second run finds valid data and does nothing, without the network.
  assert download_cifar10.main(['--data_dir', data_dir, '--url',
                                'http://127.0.0.1:9/none']) == 0
  assert 'nothing to do' in capsys.readouterr().out


def test_progress_without_a_size(serve, data_dir, tiny_data, capsys):
  server = serve(content_length=False)
  assert download_cifar10.main(['--data_dir', data_dir, '--url', server.url,
                                '--md5', server.md5]) == 0
  assert_holds(data_dir, tiny_data)
  out = capsys.readouterr().out
  lines = out.split('\n')
  assert lines[0] == 'Downloading %s into %s' % (server.url, part_of(data_dir))
  # Bytes and rate; no percent or time left without a total.
  assert re.fullmatch(r'%sB \[\d\d:\d\d, [\d.]+[kMG]?B/s\]' %
                      kilobytes(len(server.body)), last_progress(lines[1]))
  assert '%' not in out


def test_the_downloader_does_not_load_tensorflow():
  got = subprocess.run(
      [sys.executable, '-c', 'import sys; sys.path.insert(0, "scripts"); '
       'import download_cifar10; print(sorted(m for m in sys.modules '
       'if m.split(".")[0] in ("tensorflow", "keras", "cifar10_input")))'],
      cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
  assert got.stdout == '[]\n' and got.stderr == ''


@pytest.mark.parametrize('where', ['unreachable', '404'])
def test_a_failure_is_one_line_and_nothing_else(where, served, data_dir):
  if where == 'unreachable':
    url = 'http://127.0.0.1:%d/%s' % (free_ports(1)[0], NAME)
  else:
    url = served[0].replace(NAME, 'missing.tar.gz')
  rc, out, err = run_script('--data_dir', data_dir, '--url', url)
  assert rc == 1
  assert out == ''
  one_line(err)
  assert err.startswith('Error: could not download %s: ' % url)
  assert ('HTTP error 404 (Not Found): check --url' if where == '404' else
          'Connection refused: check the network, or fetch the file where '
          'you can and pass its path, --url=PATH/cifar-10-binary.tar.gz (or '
          'a mirror\'s URL)') in err
  assert os.listdir(os.path.dirname(data_dir)) == []


@pytest.mark.parametrize('as_url', [False, True])
def test_a_tarball_on_disk_is_checked_and_unpacked(as_url, archive, data_dir,
                                                   tiny_data, tmp_path):
  # Fetched on another machine: --url names it, as a path or a file:// URL.
  tarball = tmp_path / NAME
  tarball.write_bytes(archive)
  md5 = hashlib.md5(archive).hexdigest()
  url = tarball.as_uri() if as_url else str(tarball)
  rc, out, err = run_script('--data_dir', data_dir, '--url', url,
                            '--md5', md5)
  assert (rc, err) == (0, '')
  assert out == 'Checking %s (%s)\nCIFAR-10 is in %s\n' % (
      tarball, resumable_download.size(len(archive)), data_dir)
  assert_holds(data_dir, tiny_data)
  assert tarball.read_bytes() == archive  # Left as it was.


def test_a_bad_tarball_on_disk_is_one_line_and_kept(archive, data_dir,
                                                   tmp_path):
  missing = str(tmp_path / 'nowhere' / NAME)
  rc, out, err = run_script('--data_dir', data_dir, '--url', missing)
  assert (rc, out) == (1, '')
  assert one_line(err) == (
      'Error: cannot read %s: No such file or directory: pass --url=PATH of a '
      'cifar-10-binary.tar.gz on this machine, or the URL to download it '
      'from\n' % missing)
  other = tmp_path / 'other.tar.gz'
  other.write_bytes(archive[:1000])
  rc, out, err = run_script('--data_dir', data_dir, '--url', str(other))
  assert rc == 1
  assert one_line(err) == (
      'Error: %s has MD5 %s, expected %s: it is damaged or not the CIFAR-10 '
      'binary version (cifar-10-binary.tar.gz): check --url and --md5\n' % (
          other, hashlib.md5(archive[:1000]).hexdigest(), download_cifar10.MD5))
  # Its MD5 given: the archive itself is refused, and still kept.
  rc, out, err = run_script('--data_dir', data_dir, '--url', str(other),
                            '--md5', hashlib.md5(archive[:1000]).hexdigest())
  assert rc == 1
  assert one_line(err).startswith('Error: %s is not a valid tar.gz (' % other)
  assert err.endswith('): check --url and --md5\n')
  assert other.read_bytes() == archive[:1000]
  assert not os.path.exists(os.path.dirname(data_dir)) or not os.listdir(
      os.path.dirname(data_dir))


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM],
                         ids=['SIGINT', 'SIGTERM'])
def test_ctrl_c_keeps_the_part_and_a_rerun_resumes(signum, serve, data_dir,
                                                   tiny_data, capsys):
  # SIGTERM (a pod stopped) is handled as Ctrl-C is, with status 143.
  server = serve(chunk=10000, stall_after=120000)
  part = part_of(data_dir)
  proc = subprocess.Popen([sys.executable, SCRIPT, '--data_dir', data_dir,
                           '--url', server.url, '--md5', server.md5],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, cwd=ROOT)
  try:
    deadline = time.time() + 20
    while not (os.path.exists(part) and os.path.getsize(part) >= 120000):
      assert proc.poll() is None and time.time() < deadline
      time.sleep(0.02)
    os.kill(proc.pid, signum)
    out, err = proc.communicate(timeout=20)
  finally:
    if proc.poll() is None:
      os.kill(proc.pid, signal.SIGKILL)
      proc.wait()
  assert proc.returncode == 128 + signum
  total = resumable_download.size(len(server.body))
  assert out.startswith('Downloading %s (%s) into %s\n' % (server.url, total,
                                                           part))
  assert one_line(err) == (
      'Interrupted: 120.0 kB of %s kept in %s; run the same command again to '
      'resume\n' % (total, part))
  assert not os.path.exists(data_dir)
  assert sorted(os.listdir(os.path.dirname(data_dir))) == [
      os.path.basename(part)]
  with open(part, 'rb') as f:
    assert f.read() == server.body[:120000]
  server.release.set()
  # The rerun asks for the rest only, and ends with the same data.
  assert download_cifar10.main(['--data_dir', data_dir, '--url', server.url,
                                '--md5', server.md5]) == 0
  assert server.ranges_asked() == [None, 'bytes=120000-']
  assert server.sent[1] == len(server.body) - 120000
  assert_holds(data_dir, tiny_data)
  out = capsys.readouterr().out
  assert out.startswith(
      'Resuming %s: 120.0 kB of %s kept in %s\n' % (server.url, total, part))
  # The progress bar counts the kept bytes from its start.
  assert '| 120k/%s [' % kilobytes(len(server.body)) in out


def test_a_cut_connection_is_one_line_and_resumes(serve, data_dir, tiny_data,
                                                  capsys):
  server = serve(chunk=50000, cut_after=300000)
  args = ['--data_dir', data_dir, '--url', server.url, '--md5', server.md5]
  assert download_cifar10.main(args) == 1
  err = one_line(capsys.readouterr().err)
  assert err == ('Error: the connection to %s closed early; 300.0 kB of %s '
                 'kept in %s: run the same command again to resume\n' % (
                     server.url, resumable_download.size(len(server.body)),
                     part_of(data_dir)))
  assert not os.path.exists(data_dir)
  assert os.path.getsize(part_of(data_dir)) == 300000
  assert download_cifar10.main(args) == 0
  assert server.ranges_asked() == [None, 'bytes=300000-']
  assert_holds(data_dir, tiny_data)


def test_a_server_without_ranges_starts_again(serve, data_dir, tiny_data,
                                              capsys):
  server = serve(ranges=False)
  os.makedirs(os.path.dirname(data_dir))
  with open(part_of(data_dir), 'wb') as f:
    f.write(b'x' * 1000)  # Not the file's start: it must be thrown away.
  assert download_cifar10.main(['--data_dir', data_dir, '--url', server.url,
                                '--md5', server.md5]) == 0
  assert server.ranges_asked() == ['bytes=1000-']  # Answered 200, used.
  assert_holds(data_dir, tiny_data)
  assert ('  %s does not resume downloads (HTTP 200): downloading from the '
          'start\n' % server.url) in capsys.readouterr().out


def test_a_part_bigger_than_the_file_starts_again(serve, archive, data_dir,
                                                  tiny_data, capsys):
  server = serve()
  os.makedirs(os.path.dirname(data_dir))
  with open(part_of(data_dir), 'wb') as f:
    f.write(archive + b'more')
  assert download_cifar10.main(['--data_dir', data_dir, '--url', server.url,
                                '--md5', server.md5]) == 0
  assert server.ranges_asked() == ['bytes=%d-' % (len(archive) + 4), None]
  assert_holds(data_dir, tiny_data)
  assert 'is bigger than %s (%s): downloading from the start' % (
      server.url, resumable_download.size(len(archive))) in (
          capsys.readouterr().out)


def test_a_complete_part_is_checked_not_fetched(serve, archive, data_dir,
                                                tiny_data, capsys):
  # As a Ctrl-C during the unpacking leaves it.
  server = serve()
  os.makedirs(os.path.dirname(data_dir))
  with open(part_of(data_dir), 'wb') as f:
    f.write(archive)
  assert download_cifar10.main(['--data_dir', data_dir, '--url', server.url,
                                '--md5', server.md5]) == 0
  assert server.ranges_asked() == ['bytes=%d-' % len(archive)]
  assert server.sent == [0]
  assert_holds(data_dir, tiny_data)
  assert '%s is complete: checking it' % part_of(data_dir) in (
      capsys.readouterr().out)


def test_md5_mismatch_leaves_nothing(served, data_dir, capsys):
  url, _ = served
  assert download_cifar10.main(['--data_dir', data_dir, '--url', url]) == 1
  err = one_line(capsys.readouterr().err)
  assert err.startswith('Error: ') and 'expected %s' % download_cifar10.MD5 in err
  assert '%s is deleted: check --url and --md5' % part_of(data_dir) in err
  assert os.listdir(os.path.dirname(data_dir)) == []  # No data, no .part.


def test_a_stale_part_failing_md5_is_deleted(serve, archive, data_dir,
                                             tiny_data, capsys):
  server = serve()
  os.makedirs(os.path.dirname(data_dir))
  with open(part_of(data_dir), 'wb') as f:
    f.write(b'y' * 1000)  # Resumed (206) onto the wrong start.
  args = ['--data_dir', data_dir, '--url', server.url, '--md5', server.md5]
  assert download_cifar10.main(args) == 1
  err = one_line(capsys.readouterr().err)
  assert ('is deleted (1.0 kB of it came from an earlier run): check --url '
          'and --md5' in err)
  assert os.listdir(os.path.dirname(data_dir)) == []
  assert download_cifar10.main(args) == 0  # Afresh, from the start.
  assert server.ranges_asked() == ['bytes=1000-', None]
  assert_holds(data_dir, tiny_data)


def not_cifar10(tiny_data, tmp_path):
  """A tar.gz of tiny_data with a label byte of 10 in data_batch_2.bin."""
  bad = str(tmp_path / 'bad' / 'cifar-10-batches-bin')
  shutil.copytree(tiny_data, bad)
  with open(os.path.join(bad, 'data_batch_2.bin'), 'r+b') as f:
    f.write(bytes([10]))
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w:gz') as tar:
    tar.add(bad, arcname='cifar-10-batches-bin')
  return buf.getvalue()


@pytest.mark.parametrize('kind', ['not_a_tar_gz', 'not_cifar10'])
def test_a_bad_archive_is_one_line_and_deleted(kind, serve, data_dir,
                                               tiny_data, tmp_path, capsys):
  # Its MD5 is the one given (a mirror's own file), but it is no CIFAR-10.
  body = (b'<html>not here</html>' * 100 if kind == 'not_a_tar_gz' else
          not_cifar10(tiny_data, tmp_path))
  server = serve(body=body)
  assert download_cifar10.main(['--data_dir', data_dir, '--url', server.url,
                                '--md5', server.md5]) == 1
  err = one_line(capsys.readouterr().err)
  assert err.startswith('Error: the archive from %s is not %s' % (
      server.url, 'a valid tar.gz' if kind == 'not_a_tar_gz' else
      'valid CIFAR-10: '))
  assert err.endswith('; %s is deleted: check --url and --md5\n' %
                      part_of(data_dir))
  if kind == 'not_cifar10':
    assert 'data_batch_2.bin: record 0 has label 10' in err
  assert os.listdir(os.path.dirname(data_dir)) == []  # No temporary folder.


def test_a_full_disk_is_one_line_and_keeps_the_part(serve, data_dir,
                                                    tiny_data):
  # RLIMIT_FSIZE makes writes past 100,000 bytes fail (EFBIG), as a full
  # disk makes them fail with ENOSPC.
  server = serve()
  limit = ('import os, resource, signal, sys; '
           'signal.signal(signal.SIGXFSZ, signal.SIG_IGN); '
           'resource.setrlimit(resource.RLIMIT_FSIZE, (100000, 100000)); '
           'os.execv(sys.executable, [sys.executable] + sys.argv[1:])')
  proc = subprocess.run(
      [sys.executable, '-c', limit, SCRIPT, '--data_dir', data_dir, '--url',
       server.url, '--md5', server.md5], capture_output=True, text=True,
      cwd=ROOT, timeout=30)
  assert proc.returncode == 1
  assert one_line(proc.stderr) == (
      'Error: cannot write %s: File too large; 100.0 kB of %s kept in %s: '
      'free some space, or choose another --data_dir, and run again\n' % (
          part_of(data_dir), resumable_download.size(len(server.body)),
          part_of(data_dir)))
  assert not os.path.exists(data_dir)
  assert os.path.getsize(part_of(data_dir)) == 100000
  assert download_cifar10.main(['--data_dir', data_dir, '--url', server.url,
                                '--md5', server.md5]) == 0
  assert server.ranges_asked() == [None, 'bytes=100000-']
  assert_holds(data_dir, tiny_data)


def test_unreachable_url_leaves_nothing(data_dir, capsys):
  port, = free_ports(1)  # Nothing listens there.
  url = 'http://127.0.0.1:%d/cifar-10-binary.tar.gz' % port
  assert download_cifar10.main(['--data_dir', data_dir, '--url', url]) == 1
  err = one_line(capsys.readouterr().err)
  assert err.startswith('Error: could not download %s' % url)
  assert os.listdir(os.path.dirname(data_dir)) == []


def test_refuses_to_overwrite_other_files(served, tmp_path, capsys):
  url, md5 = served
  data_dir = tmp_path / 'cifar-10-batches-bin'
  data_dir.mkdir()
  (data_dir / 'notes.txt').write_text('mine')
  assert download_cifar10.main(['--data_dir', str(data_dir), '--url', url,
                                '--md5', md5]) == 1
  assert 'does not hold valid CIFAR-10' in capsys.readouterr().err
  assert os.listdir(data_dir) == ['notes.txt']
  shutil.rmtree(data_dir)


def test_another_process_finishing_first_is_success(served, data_dir,
                                                    tiny_data, monkeypatch,
                                                    capsys):
  # The pods of a TFJob fetch into one shared volume at the same time: the
  # loser of the final rename finds valid data there and is content.
  url, md5 = served
  real_fetch = resumable_download.fetch

  def fetch_while_another_finishes(*args):
    got = real_fetch(*args)
    shutil.copytree(tiny_data, data_dir)
    return got

  monkeypatch.setattr(resumable_download, 'fetch', fetch_while_another_finishes)
  assert download_cifar10.main(['--data_dir', data_dir, '--url', url,
                                '--md5', md5]) == 0
  assert 'already holds CIFAR-10' in capsys.readouterr().out
  assert_holds(data_dir, tiny_data)  # And its .part file is gone.


def test_a_second_process_waits_for_the_first(served, data_dir, tiny_data,
                                               tmp_path):
  # Two downloaders sharing a .part file take turns: the second waits on its
  # lock, then finds the first one's data and does nothing.
  url, md5 = served
  part = part_of(data_dir)
  log = str(tmp_path / 'second.log')
  os.makedirs(os.path.dirname(data_dir))
  with open(part, 'wb') as held, open(log, 'w') as out:
    fcntl.flock(held, fcntl.LOCK_EX)
    proc = subprocess.Popen([sys.executable, SCRIPT, '--data_dir', data_dir,
                             '--url', url, '--md5', md5], stdout=out,
                            stderr=subprocess.STDOUT, cwd=ROOT)
    try:
      deadline = time.time() + 20
      while 'Waiting' not in open(log).read():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
      # The first one finishes: its data in place, its .part file deleted.
      shutil.copytree(tiny_data, data_dir)
      os.remove(part)
      fcntl.flock(held, fcntl.LOCK_UN)
      assert proc.wait(timeout=20) == 0
    finally:
      if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
  with open(log) as f:
    assert f.read() == ('Waiting for another process downloading into %s\n'
                        '%s already holds CIFAR-10; nothing to do\n' % (
                            part, data_dir))
  assert_holds(data_dir, tiny_data)
