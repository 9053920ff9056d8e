"""The CIFAR-10 downloader against a local HTTP server."""

import hashlib
import http.server
import io
import os
import shutil
import tarfile
import threading

import pytest

import download_cifar10
from conftest import free_ports


@pytest.fixture
def served(tmp_path, tiny_data):
  """Serves a cifar-10-binary.tar.gz made from tiny_data; yields (url, md5)."""
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w:gz') as tar:
    tar.add(tiny_data, arcname='cifar-10-batches-bin')
  body = buf.getvalue()

  class Handler(http.server.BaseHTTPRequestHandler):

    def do_GET(self):  # pylint: disable=invalid-name
      if self.path != '/cifar-10-binary.tar.gz':
        self.send_error(404)
        return
      self.send_response(200)
      self.send_header('Content-Length', str(len(body)))
      self.end_headers()
      self.wfile.write(body)

    def log_message(self, *args):
      pass

  server = http.server.HTTPServer(('127.0.0.1', 0), Handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  yield ('http://127.0.0.1:%d/cifar-10-binary.tar.gz' % server.server_port,
         hashlib.md5(body).hexdigest())
  server.shutdown()
  server.server_close()


def test_downloads_checks_and_unpacks(served, tmp_path, tiny_data, capsys):
  url, md5 = served
  data_dir = str(tmp_path / 'data' / 'cifar-10-batches-bin')
  assert download_cifar10.main(['--data_dir', data_dir, '--url', url,
                                '--md5', md5]) == 0
  assert sorted(os.listdir(data_dir)) == sorted(os.listdir(tiny_data))
  for name in os.listdir(tiny_data):
    with open(os.path.join(data_dir, name), 'rb') as got, \
        open(os.path.join(tiny_data, name), 'rb') as want:
      assert got.read() == want.read()
  assert os.listdir(tmp_path / 'data') == ['cifar-10-batches-bin']
  assert 'CIFAR-10 is in' in capsys.readouterr().out
  # A second run finds valid data and does nothing, without the network.
  assert download_cifar10.main(['--data_dir', data_dir, '--url',
                                'http://127.0.0.1:9/none']) == 0
  assert 'nothing to do' in capsys.readouterr().out


def test_md5_mismatch_leaves_nothing(served, tmp_path, capsys):
  url, _ = served
  data_dir = str(tmp_path / 'data' / 'cifar-10-batches-bin')
  assert download_cifar10.main(['--data_dir', data_dir, '--url', url]) == 1
  err = capsys.readouterr().err
  assert err.startswith('Error: ') and 'expected %s' % download_cifar10.MD5 in err
  assert err.count('\n') == 1
  assert os.listdir(tmp_path / 'data') == []


def test_unreachable_url_leaves_nothing(tmp_path, capsys):
  port, = free_ports(1)  # Nothing listens there.
  data_dir = str(tmp_path / 'data' / 'cifar-10-batches-bin')
  url = 'http://127.0.0.1:%d/cifar-10-binary.tar.gz' % port
  assert download_cifar10.main(['--data_dir', data_dir, '--url', url]) == 1
  err = capsys.readouterr().err
  assert err.startswith('Error: could not download %s' % url)
  assert os.listdir(tmp_path / 'data') == []


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


def test_another_process_finishing_first_is_success(served, tmp_path,
                                                    tiny_data, monkeypatch,
                                                    capsys):
  # The pods of a TFJob fetch into one shared volume at the same time: the
  # loser of the final rename finds valid data there and is content.
  url, md5 = served
  data_dir = str(tmp_path / 'data' / 'cifar-10-batches-bin')
  real_fetch = download_cifar10.fetch

  def fetch_while_another_finishes(*args):
    got = real_fetch(*args)
    shutil.copytree(tiny_data, data_dir)
    return got

  monkeypatch.setattr(download_cifar10, 'fetch', fetch_while_another_finishes)
  assert download_cifar10.main(['--data_dir', data_dir, '--url', url,
                                '--md5', md5]) == 0
  assert 'already holds CIFAR-10' in capsys.readouterr().out
  assert os.listdir(tmp_path / 'data') == ['cifar-10-batches-bin']
