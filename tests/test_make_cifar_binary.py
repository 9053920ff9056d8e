"""scripts/make_cifar_binary.py, run as a user runs it, on small generated
images and IDX files; the expected bytes are written out by hand."""

import gzip
import os
import struct
import subprocess
import sys

import numpy as np
from PIL import Image
import pytest
import tensorflow as tf

from training.storage import data_layout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, 'scripts', 'make_cifar_binary.py')
RECORD = 3073


def convert(*args):
  """Runs the script; returns (exit status, stdout, stderr)."""
  proc = subprocess.run([sys.executable, SCRIPT] + [str(a) for a in args],
                        capture_output=True, text=True, timeout=120)
  return proc.returncode, proc.stdout, proc.stderr


def read_records(path):
  """Returns (labels [n], images [n, 3, 32, 32]) of a CIFAR binary file."""
  data = np.fromfile(path, np.uint8).reshape(-1, RECORD)
  return data[:, 0], data[:, 1:].reshape(-1, 3, 32, 32)


def all_records(out_dir):
  """The training files' records, in file order, and the test file's."""
  names = sorted(n for n in os.listdir(out_dir) if n.startswith('data_batch'))
  train = [read_records(os.path.join(out_dir, n)) for n in names]
  return ((np.concatenate([t[0] for t in train]),
           np.concatenate([t[1] for t in train])),
          read_records(os.path.join(out_dir, 'test_batch.bin')))


def solid(path, colour, size=(40, 30), mode='RGB'):
  """Writes an image of one colour."""
  Image.new(mode, size, colour).save(path)


def colour_of(label, index):
  """A colour of its own for each image: (label, index, 200)."""
  return (label * 10, index, 200)


def image_tree(root, counts, ext='png'):
  """Class folders of solid images, colour_of(label, index) each."""
  for label, count in enumerate(counts):
    folder = os.path.join(root, 'class_%s' % 'abcdefghij'[label])
    os.makedirs(folder)
    for index in range(count):
      solid(os.path.join(folder, '%d.%s' % (index, ext)),
            colour_of(label, index))


def test_a_folder_tree_becomes_records_with_each_image_once(tmp_path):
  source, out = tmp_path / 'images', tmp_path / 'out'
  image_tree(source, [8, 8, 8])
  code, stdout, stderr = convert(source, out, '--test_fraction=0.25',
                                 '--num_train_files=2')
  assert (code, stderr) == (0, '')
  assert stdout.splitlines()[-1] == (
      'Wrote 18 training records (2 files) and 6 test records of 3 classes, '
      'from the images in %s, to %s' % (source, out))
  assert sorted(os.listdir(out)) == ['batches.meta.txt', 'data_batch_1.bin',
                                     'data_batch_2.bin', 'test_batch.bin']
  assert os.path.getsize(out / 'data_batch_1.bin') == 9 * RECORD
  assert (out / 'batches.meta.txt').read_text() == (
      'class_a\nclass_b\nclass_c\n\n')
  (train_labels, train), (test_labels, test) = all_records(out)
  # Exactly 2 of each class's 8 in the test set.
  assert np.bincount(test_labels).tolist() == [2, 2, 2]
  assert np.bincount(train_labels).tolist() == [6, 6, 6]
  # Each record is one source image, solid, in R, G, B planes; each image
  # is in exactly one record, under its own class.
  seen = []
  for labels, images in ((train_labels, train), (test_labels, test)):
    for label, image in zip(labels, images):
      r, g, b = (int(image[c, 0, 0]) for c in range(3))
      assert (image == np.array([r, g, b], np.uint8)[:, None, None]).all()
      assert r == label * 10 and b == 200
      seen.append((label, g))
  assert sorted(seen) == [(l, i) for l in range(3) for i in range(8)]
  # Shuffled, not class by class.
  assert train_labels.tolist() != sorted(train_labels.tolist())
  assert data_layout.check_data(str(out), eval_data=False)[1] == 18


def test_images_are_cropped_at_the_centre_and_grey_fills_three_planes(
    tmp_path):
  source, out = tmp_path / 'images', tmp_path / 'out'
  os.makedirs(source / 'wide')
  os.makedirs(source / 'grey')
  # 96x32: blue, red, green thirds; the centre crop is the red third.
  wide = np.zeros((32, 96, 3), np.uint8)
  wide[:, :32, 2] = 255
  wide[:, 32:64, 0] = 255
  wide[:, 64:, 1] = 255
  for i in range(2):
    Image.fromarray(wide).save(source / 'wide' / ('%d.jpg' % i), quality=100)
  # Grey 64x64, left half 50, right half 150: halved, in all three planes.
  grey = np.full((64, 64), 50, np.uint8)
  grey[:, 32:] = 150
  for i in range(2):
    Image.fromarray(grey, 'L').save(source / 'grey' / ('%d.png' % i))
  code, _, stderr = convert(source, out, '--test_fraction=0.5')
  assert (code, stderr) == (0, '')
  (labels, images), (test_labels, test_images) = all_records(out)
  labels = np.concatenate([labels, test_labels])
  images = np.concatenate([images, test_images]).astype(int)
  for label, image in zip(labels, images):
    if label == 1:  # 'wide', after 'grey'.
      # JPEG blurs the edges a little; the middle is red.
      assert np.abs(image[:, :, 4:28] - np.array(
          [255, 0, 0])[:, None, None]).max() <= 8
    else:
      assert (image[0] == image[1]).all() and (image[1] == image[2]).all()
      # Scaled with bicubic weights: only the pixels by the edge blend.
      assert (image[0, :, :13] == 50).all() and (image[0, :, 19:] == 150).all()


def test_train_and_test_folders_are_the_split(tmp_path):
  source, out = tmp_path / 'images', tmp_path / 'out'
  image_tree(source / 'train', [3, 2])
  image_tree(source / 'test', [1, 1])
  code, stdout, _ = convert(source, out)
  assert code == 0
  assert 'Wrote 5 training records (5 files) and 2 test records of 2' in stdout
  assert (out / 'batches.meta.txt').read_text() == 'class_a\nclass_b\n\n'
  (train_labels, train), (test_labels, test) = all_records(out)
  # Each record's red is 10 x the label of the folder its image came from.
  for labels, images in ((train_labels, train), (test_labels, test)):
    assert (images[:, 0, 0, 0] == 10 * labels).all(), (labels, images[:, 0])
  assert sorted(zip(test_labels.tolist(), test[:, 1, 0, 0].tolist())) == [
      (0, 0), (1, 0)]
  assert sorted(zip(train_labels.tolist(), train[:, 1, 0, 0].tolist())) == [
      (0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]


def test_the_split_follows_the_seed(tmp_path):
  """--seed picks the test images: the same seed, the same bytes; another,
  other images, as many of each class."""
  source = tmp_path / 'images'
  image_tree(source, [8, 8, 8])
  outs = {}
  for name, seed in (('a', 0), ('b', 0), ('c', 1)):
    code, _, stderr = convert(source, tmp_path / name, '--test_fraction=0.25',
                              '--seed=%d' % seed)
    assert (code, stderr) == (0, '')
    outs[name] = tmp_path / name
  for f in os.listdir(outs['a']):
    assert (outs['a'] / f).read_bytes() == (outs['b'] / f).read_bytes(), f
  tests = {}
  for name in ('a', 'c'):
    _, (labels, images) = all_records(outs[name])
    assert np.bincount(labels).tolist() == [2, 2, 2]
    tests[name] = sorted(zip(labels.tolist(), images[:, 1, 0, 0].tolist()))
  assert tests['a'] != tests['c']


def test_256_classes_fit_the_label_byte(tmp_path):
  """The label byte's limit is 256 classes, labels 0..255, not 255."""
  source, out = tmp_path / 'images', tmp_path / 'out'
  for i in range(256):
    os.makedirs(source / ('%03d' % i))
    for j in range(2):
      solid(source / ('%03d' % i) / ('%d.png' % j), (i, j, 0), size=(2, 2))
  code, stdout, stderr = convert(source, out, '--test_fraction=0.5')
  assert (code, stderr) == (0, ''), stdout
  (train_labels, train), (test_labels, test) = all_records(out)
  for labels, images in ((train_labels, train), (test_labels, test)):
    assert sorted(labels.tolist()) == list(range(256))
    assert (images[:, 0, 0, 0] == labels).all()


def test_jpeg_of_any_case_and_small_images_fill_32x32(tmp_path):
  """.JPEG and .jpeg files count as images; one smaller than 32x32 is
  scaled up to fill it."""
  source, out = tmp_path / 'images', tmp_path / 'out'
  os.makedirs(source / 'a')
  os.makedirs(source / 'b')
  for i, name in enumerate(('X.JPEG', 'y.jpeg', 'z.Jpg')):
    Image.new('RGB', (20, 10), (200, 40 * i, 0)).save(
        source / 'a' / name, 'JPEG', quality=100)
  for i in range(3):
    solid(source / 'b' / ('%d.PNG' % i), (10, 20, 30), size=(5, 7))
  code, stdout, stderr = convert(source, out, '--test_fraction=0.34')
  assert (code, stderr) == (0, '')
  assert 'Wrote 4 training records (4 files) and 2 test records of 2' in stdout
  (train_labels, train), (test_labels, test) = all_records(out)
  labels = np.concatenate([train_labels, test_labels])
  images = np.concatenate([train, test]).astype(int)
  assert sorted(labels.tolist()) == [0, 0, 0, 1, 1, 1]
  greens = []
  for label, image in zip(labels, images):
    # Every pixel of the 32x32, not only the middle: scaled up, not pasted.
    want = (200, image[1, 16, 16], 0) if label == 0 else (10, 20, 30)
    assert np.abs(image - np.array(want)[:, None, None]).max() <= 3, label
    if label == 0:
      greens.append(image[1, 16, 16])
  assert np.abs(np.sort(greens) - [0, 40, 80]).max() <= 3, greens


def write_idx(path, array):
  """An IDX file of unsigned bytes, gzipped when path ends in .gz."""
  header = struct.pack('>BBBB', 0, 0, 8, array.ndim) + struct.pack(
      '>%dI' % array.ndim, *array.shape)
  opener = gzip.open if str(path).endswith('.gz') else open
  with opener(path, 'wb') as f:
    f.write(header + array.astype(np.uint8).tobytes())


def idx_set(folder, train=7, test=3, gz=True):
  """MNIST-named IDX files: training image k is filled with k + 1, test
  image k with 100 + k, each with a marker of 255 at row 0, column 1; the
  labels are k % 10 and (k + 3) % 10."""
  os.makedirs(folder, exist_ok=True)
  suffix = '.gz' if gz else ''
  for prefix, n, fill, shift in (('train', train, 1, 0),
                                 ('t10k', test, 100, 3)):
    images = np.zeros((n, 28, 28), np.uint8) + np.arange(
        fill, fill + n)[:, None, None]
    images[:, 0, 1] = 255
    write_idx(folder / ('%s-images-idx3-ubyte%s' % (prefix, suffix)), images)
    write_idx(folder / ('%s-labels-idx1-ubyte%s' % (prefix, suffix)),
              (np.arange(n) + shift) % 10)


@pytest.mark.parametrize('gz', [True, False])
def test_idx_files_keep_their_split_and_order_centred_on_black(tmp_path, gz):
  source, out = tmp_path / 'idx', tmp_path / 'out'
  idx_set(source, train=12, test=3, gz=gz)
  code, stdout, stderr = convert(source, out, '--class_names=' + ','.join(
      'c%d' % i for i in range(10)))
  assert (code, stderr) == (0, '')
  assert stdout.splitlines()[-1] == (
      'Wrote 12 training records (5 files) and 3 test records of 10 classes, '
      'from the IDX files in %s, to %s' % (source, out))
  # 12 records in 5 files: 3, 3, 2, 2, 2, in their order.
  assert [os.path.getsize(out / ('data_batch_%d.bin' % i)) // RECORD
          for i in range(1, 6)] == [3, 3, 2, 2, 2]
  (train_labels, train), (test_labels, test) = all_records(out)
  assert train_labels.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
  assert test_labels.tolist() == [3, 4, 5]
  for images, fill in ((train, 1), (test, 100)):
    for k, image in enumerate(images):
      expected = np.zeros((32, 32), np.uint8)
      expected[2:30, 2:30] = fill + k
      expected[2, 3] = 255
      for plane in range(3):
        assert (image[plane] == expected).all()
  assert (out / 'batches.meta.txt').read_text() == (
      '\n'.join('c%d' % i for i in range(10)) + '\n\n')


def test_idx_test_prefix_and_large_images_are_scaled(tmp_path):
  """IDX files named test-... are the test set (KMNIST's style), and
  images larger than 32x32 are scaled down to it, in all three planes."""
  source, out = tmp_path / 'idx', tmp_path / 'out'
  os.makedirs(source)
  for prefix, n, fill in (('train', 4, 50), ('test', 2, 90)):
    images = np.full((n, 40, 40), fill, np.uint8)
    images[:, :, 20:] = 200  # Right half bright.
    write_idx(source / ('%s-images-idx3-ubyte' % prefix), images)
    write_idx(source / ('%s-labels-idx1-ubyte' % prefix), np.arange(n) % 2)
  code, stdout, stderr = convert(source, out)
  assert (code, stderr) == (0, '')
  assert ('Wrote 4 training records (4 files) and 2 test records of 2 '
          'classes' in stdout)
  (train_labels, train), (test_labels, test) = all_records(out)
  assert train_labels.tolist() == [0, 1, 0, 1]
  assert test_labels.tolist() == [0, 1]
  for images, fill in ((train, 50), (test, 90)):
    for image in images.astype(int):
      assert (image[0] == image[1]).all() and (image[1] == image[2]).all()
      # 40 -> 32: the halves meet at column 16; only the columns by it
      # blend (bicubic).
      assert (image[0, :, :13] == fill).all(), image[0, 0]
      assert (image[0, :, 19:] == 200).all(), image[0, 0]


def test_idx_classes_are_named_by_number_unless_named(tmp_path):
  source = tmp_path / 'idx'
  idx_set(source, train=12, test=3)
  code, stdout, _ = convert(source, tmp_path / 'out')
  assert code == 0
  assert ' of 10 classes, ' in stdout
  assert (tmp_path / 'out' / 'batches.meta.txt').read_text() == (
      '0\n1\n2\n3\n4\n5\n6\n7\n8\n9\n\n')
  code, _, stderr = convert(source, tmp_path / 'out2', '--class_names=a,b')
  assert (code, stderr) == (1, 'Error: --class_names names 2 classes, but '
                               'the labels go up to 9\n')
  assert not (tmp_path / 'out2').exists()


def test_a_folder_tree_shows_progress(tmp_path):
  source, out = tmp_path / 'images', tmp_path / 'out'
  image_tree(source, [10, 10])
  _, stdout, _ = convert(source, out, '--test_fraction=0.5')
  # (Read as text, the progress bar's carriage returns end lines.)
  lines = stdout.splitlines()
  # The progress bar's last state: all 20 images, 100%; then what it wrote.
  assert lines[-2].startswith('100%|') and '| 20/20 [' in lines[-2], lines
  assert lines[-1].startswith('Wrote 10 training records')


def bad(tmp_path, name):
  """A SOURCE for each kind of bad input."""
  source = tmp_path / name
  if name == 'empty_class':
    image_tree(source, [2])
    os.makedirs(source / 'class_z')
  elif name == 'unreadable':
    image_tree(source, [2, 2])
    (source / 'class_b' / 'broken.png').write_bytes(b'not a png at all')
  elif name == 'too_many_classes':
    for i in range(257):
      os.makedirs(source / ('%03d' % i))
      solid(source / ('%03d' % i) / 'a.png', (i % 256, 0, 0), size=(2, 2))
  elif name == 'nothing':
    os.makedirs(source)
    (source / 'notes.txt').write_text('no images here')
  elif name == 'idx_without_labels':
    idx_set(source)
    os.remove(source / 't10k-labels-idx1-ubyte.gz')
  elif name == 'split_classes_differ':
    image_tree(source / 'train', [2, 2])
    image_tree(source / 'test', [2])
  elif name == 'idx_truncated':
    idx_set(source, gz=False)
    path = source / 'train-images-idx3-ubyte'
    path.write_bytes(path.read_bytes()[:-100])
  return source


@pytest.mark.parametrize('name, says', [
    ('empty_class', 'class_z holds no PNG or JPEG images'),
    ('unreadable', 'broken.png cannot be read as an image'),
    ('too_many_classes', 'has 257 class folders: the CIFAR-10 layout\'s '
     'label byte holds at most 256 classes'),
    ('nothing', 'holds neither IDX files nor class folders'),
    ('idx_without_labels', 't10k-labels-idx1-ubyte.gz is missing'),
    ('idx_truncated', 'the file is truncated'),
    ('split_classes_differ', 'have different class folders: they need the '
     'same'),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, name, says):
  out = tmp_path / 'out'
  code, stdout, stderr = convert(bad(tmp_path, name), out)
  assert code == 1
  assert len(stderr.splitlines()) == 1, stderr
  assert stderr.startswith('Error: ') and says in stderr, stderr
  assert not out.exists()
  assert 'Wrote' not in stdout


def test_existing_data_is_never_overwritten(tmp_path):
  source, out = tmp_path / 'images', tmp_path / 'out'
  image_tree(source, [2, 2])
  os.makedirs(out)
  (out / 'data_batch_1.bin').write_bytes(b'\0' * RECORD)
  code, _, stderr = convert(source, out)
  assert code == 1
  assert stderr == ('Error: %s already holds CIFAR-10 binary files: give '
                    'another OUT_DIR, or delete them first\n' % out)
  assert (out / 'data_batch_1.bin').read_bytes() == b'\0' * RECORD
  assert sorted(os.listdir(out)) == ['data_batch_1.bin']


@pytest.mark.slow
def test_twelve_classes_of_your_own_train_and_are_evaluated(procs,
                                                             tmp_path):
  source, data = tmp_path / 'images', tmp_path / 'data'
  image_tree(source, [3] * 10)
  for extra in ('class_k', 'class_l'):  # Labels 10 and 11.
    os.makedirs(source / extra)
    for index in range(3):
      solid(source / extra / ('%d.png' % index), (250, index, 0))
  code, _, stderr = convert(source, data, '--test_fraction=0.34')
  assert (code, stderr) == (0, '')
  train_dir = str(tmp_path / 'train')
  procs.trainer('single', '--ps_hosts=', '--data_dir=%s' % data,
                '--train_dir=' + train_dir, '--max_steps=4', '--batch_size=8',
                '--num_preprocess_threads=1')
  assert procs.wait_all(timeout=180) == {'single': 0}, procs.tails()
  # The logits have one column per class of batches.meta.txt.
  assert tf.train.load_variable(
      train_dir, 'InceptionResnetV2/Logits/weights').shape == (768, 12)
  procs.trainer('evaluator', '--job_name=evaluator', '--data_dir=%s' % data,
                '--train_dir=' + train_dir, '--run_once')
  assert procs.wait_all(timeout=180)['evaluator'] == 0, procs.tails()
  # One test image of each of the 12 classes, all evaluated.
  assert np.bincount(read_records(data / 'test_batch.bin')[0]).tolist() == (
      [1] * 12)
  assert '(12 examples)' in procs.log('evaluator'), procs.log('evaluator')


def test_a_failed_write_is_one_line_and_leaves_no_file(tmp_path):
  source, out = tmp_path / 'images', tmp_path / 'out'
  image_tree(source, [2, 2])
  os.makedirs(out)
  # A folder where the test file's temporary goes: its write fails midway,
  # after the training files' temporaries were written.
  os.makedirs(out / 'test_batch.bin.tmp')
  code, stdout, stderr = convert(source, out)
  assert code == 1
  assert stderr.startswith('Error: could not write %s: ' % out), stderr
  assert len(stderr.splitlines()) == 1
  assert sorted(os.listdir(out)) == ['test_batch.bin.tmp']
  assert 'Wrote' not in stdout
