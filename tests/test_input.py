"""The binary reader and its queue, on hand-made and synthetic records."""

import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import cifar10_input

tf1 = tf.compat.v1


def write_records(path, labels, images_chw):
  """Writes CIFAR-10 records: label byte then CHW image bytes."""
  rec = np.concatenate([np.asarray(labels, np.uint8)[:, None],
                        images_chw.reshape(len(labels), -1)], axis=1)
  rec.astype(np.uint8).tofile(path)


@pytest.fixture
def handmade(tmp_path):
  """Two training files and a test file with known, distinct contents."""
  rng = np.random.default_rng(7)
  data = {}
  for name, labels in [('data_batch_1.bin', [3, 1, 4]),
                       ('data_batch_2.bin', [1, 5]),
                       ('test_batch.bin', [9, 2, 6, 5])]:
    images = rng.integers(0, 256, size=(len(labels), 3, 32, 32),
                          dtype=np.uint8)
    write_records(str(tmp_path / name), labels, images)
    data[name] = (labels, images)
  return str(tmp_path), data


def read_batches(data_dir, eval_data, batch_size, num_batches=1, **kwargs):
  """Builds the pipeline in a fresh graph; returns num_batches batches."""
  kwargs.setdefault('num_preprocess_threads', 1)  # One thread keeps order.
  kwargs.setdefault('distort', False)
  kwargs.setdefault('standardize', False)
  kwargs.setdefault('shuffle', False)
  with tf.Graph().as_default():
    images, labels = cifar10_input.generate_batch_inputs(
        eval_data=eval_data, data_dir=data_dir, batch_size=batch_size,
        **kwargs)
    with tf1.train.MonitoredSession() as sess:
      return [sess.run([images, labels]) for _ in range(num_batches)]


def test_decodes_handmade_records_exactly(handmade):
  data_dir, data = handmade
  (images, labels), = read_batches(data_dir, eval_data=False, batch_size=5)
  want_labels = data['data_batch_1.bin'][0] + data['data_batch_2.bin'][0]
  want_chw = np.concatenate([data['data_batch_1.bin'][1],
                             data['data_batch_2.bin'][1]])
  assert labels.tolist() == want_labels
  assert images.dtype == np.float32 and labels.dtype == np.int32
  assert images.shape == (5, 32, 32, 3)
  # Pixel (y, x) of channel c is byte 1 + c*1024 + y*32 + x of the record.
  raw = np.fromfile(os.path.join(data_dir, 'data_batch_1.bin'), np.uint8)
  assert images[0, 0, 0, 0] == raw[1]
  assert images[0, 0, 1, 0] == raw[1 + 1]
  assert images[0, 1, 0, 0] == raw[1 + 32]
  assert images[0, 0, 0, 1] == raw[1 + 1024]
  assert images[0, 31, 31, 2] == raw[3072]
  assert images[1, 5, 7, 2] == raw[3073 + 1 + 2048 + 5 * 32 + 7]
  np.testing.assert_array_equal(images, want_chw.transpose(0, 2, 3, 1))


def test_eval_reads_only_the_test_file(handmade):
  data_dir, data = handmade
  batches = read_batches(data_dir, eval_data=True, batch_size=4,
                         num_batches=2)
  labels, images = data['test_batch.bin']
  for got_images, got_labels in batches:
    assert got_labels.tolist() == labels
    np.testing.assert_array_equal(got_images, images.transpose(0, 2, 3, 1))


def test_one_epoch_sees_every_record_once_with_a_partial_last_batch(handmade):
  data_dir, data = handmade
  with tf.Graph().as_default():
    images, labels = cifar10_input.generate_batch_inputs(
        eval_data=True, shuffle=False, data_dir=data_dir, batch_size=3,
        num_preprocess_threads=1, num_epochs=1)
    seen = []
    with tf1.train.MonitoredSession() as sess:
      while not sess.should_stop():
        seen.append(sess.run(labels).tolist())
  assert seen == [[9, 2, 6], [5]]


def test_preprocessing_standardizes_and_augments(handmade):
  data_dir, _ = handmade
  # 5 training records, read in order by one thread: batch i is epoch i.
  plain, = read_batches(data_dir, eval_data=False, batch_size=5,
                        standardize=True)
  epochs = read_batches(data_dir, eval_data=False, batch_size=5,
                        num_batches=2, standardize=True, distort=True)
  for images, labels in epochs:
    assert images.shape == (5, 32, 32, 3)
    np.testing.assert_array_equal(labels, plain[1])
    np.testing.assert_allclose(images.mean(axis=(1, 2, 3)), 0, atol=1e-3)
    np.testing.assert_allclose(images.std(axis=(1, 2, 3)), 1, atol=1e-2)
    # The images differ from their unaugmented decode. (Standardization
    # undoes brightness and most of contrast; an image left uncropped and
    # unflipped, 1 in 162, would match: so 4 of 5, not all.)
    assert differing(images, plain[0]) >= 4
  # And the same record is augmented anew in each epoch.
  assert differing(epochs[0][0], epochs[1][0]) >= 4


@pytest.mark.parametrize('padding', [0, 2, 4])
def test_random_crops_shift_each_image_by_up_to_the_padding(padding):
  # Each crop is its own image shifted by (dy, dx), black where it moved
  # off: |dy| black rows, at the bottom when it moved up (dy > 0), and |dx|
  # black columns likewise. Pixels of 1..255 tell black from the image.
  n = 2000  # All (2p + 1)^2 shifts (81 at 4) show: missing one, p < 2e-9.
  images = np.random.default_rng(0).integers(
      1, 256, (n, 32, 32, 3)).astype(np.float32)
  with tf.Graph().as_default():
    crops = cifar10_input.random_crops(tf.constant(images), padding)
    with tf1.Session() as sess:
      got = sess.run(crops)
  shifts = set()
  for image, original in zip(got, images):
    rows = np.flatnonzero(image[:, :, 0].max(axis=1))  # Not all black.
    cols = np.flatnonzero(image[:, :, 0].max(axis=0))
    dy, dx = (31 - rows[-1]) - rows[0], (31 - cols[-1]) - cols[0]
    padded = np.zeros((32 + 2 * padding, 32 + 2 * padding, 3), np.float32)
    padded[padding:padding + 32, padding:padding + 32] = original
    np.testing.assert_array_equal(
        image, padded[padding + dy:padding + dy + 32,
                      padding + dx:padding + dx + 32])
    shifts.add((int(dy), int(dx)))
  span = range(-padding, padding + 1)
  assert shifts == {(y, x) for y in span for x in span}


@pytest.mark.parametrize('padding', [0, 2])
def test_the_pipeline_crops_with_the_padding_given(tmp_path, padding):
  # White records through the whole training pipeline: the brightness and
  # contrast jitter keep a one-valued image one-valued, so the rows and
  # columns that differ from the centre are the black the crop shifted in.
  white = np.full((40, 3, 32, 32), 255, np.uint8)
  for name in ('data_batch_1.bin', 'test_batch.bin'):
    write_records(str(tmp_path / name), [0] * 40, white)
  (images, _), = read_batches(str(tmp_path), eval_data=False, batch_size=40,
                              distort=True, crop_padding=padding)
  most = 0
  for image in images:
    centre = image[16, 16, 0]
    dy = np.count_nonzero(np.abs(image[:, 16, 0] - centre) > 1)
    dx = np.count_nonzero(np.abs(image[16, :, 0] - centre) > 1)
    assert dy <= padding and dx <= padding
    most = max(most, dy, dx)
  # An image shifts by the whole padding one way or both with p = 0.64 at
  # 2: one of 40 does but for p = 2e-18.
  assert most == padding
  # The rest of the augmentation stays on, without crops too: each image
  # brightened by its own draw from -63..63. Uncropped, an image is one
  # value, 255 plus that (the contrast scales about it); cropped, the black
  # shifted in moves the mean the contrast scales about.
  centres = images[:, 16, 16, 0]
  assert np.ptp(centres) > 20, centres
  if padding == 0:
    assert 255 - 63 <= centres.min() <= centres.max() <= 255 + 63, centres


def test_the_trainer_passes_crop_padding_to_the_pipeline(flags, monkeypatch,
                                                          handmade):
  import train_distributed  # pylint: disable=g-import-not-at-top
  flags(['train_distributed.py', '--crop_padding=3',
         '--data_dir=' + handmade[0]])
  given = {}

  class Built(Exception):
    pass

  def record(**kwargs):
    given.update(kwargs)
    raise Built()

  monkeypatch.setattr(cifar10_input, 'generate_batch_inputs', record)
  with tf.Graph().as_default(), pytest.raises(Built):
    train_distributed.inputs(seed=0)
  assert (given['crop_padding'], given['distort']) == (3, True)


def differing(images, others):
  """How many images differ from their counterparts in others."""
  return sum(np.abs(a - b).mean() > 0.05 for a, b in zip(images, others))


def test_shuffle_batch_uses_16_threads_and_sizes_queue_from_data(tiny_data):
  with tf.Graph().as_default() as graph:
    cifar10_input.generate_batch_inputs(
        eval_data=False, shuffle=True, data_dir=tiny_data, batch_size=8)
    runners = tf1.get_collection(tf1.GraphKeys.QUEUE_RUNNERS)
    batch_runner, = [r for r in runners if 'shuffle_batch' in r.name]
    assert len(batch_runner.enqueue_ops) == 16
    queue, = [op for op in graph.get_operations()
              if op.type == 'RandomShuffleQueueV2']
    # 200 records: 40% is 80 kept after dequeue, plus 3 batches of room.
    assert queue.get_attr('min_after_dequeue') == 80
    assert queue.get_attr('capacity') == 104
  assert cifar10_input.queue_sizes(200, 8) == (80, 104)
  # The real CIFAR-10: the reference's 20,000, never more.
  assert cifar10_input.queue_sizes(50000, 128) == (20000, 20384)
  assert cifar10_input.queue_sizes(10 ** 6, 128) == (20000, 20384)


def test_a_100_record_dataset_does_not_stall(tmp_path):
  rng = np.random.default_rng(0)
  write_records(str(tmp_path / 'data_batch_1.bin'),
                rng.integers(0, 10, 100),
                rng.integers(0, 256, (100, 3, 32, 32), dtype=np.uint8))
  batches = read_batches(str(tmp_path), eval_data=False, batch_size=64,
                         num_batches=4, shuffle=True, num_preprocess_threads=4)
  assert [b[0].shape[0] for b in batches] == [64] * 4


def test_seed_changes_the_order(tiny_data):
  # The seed is each random op's own: the file order's and the shuffling
  # queue's. (The same seed twice need not give the same batch: the queue
  # samples from what its reader has enqueued so far, which timing sets.)
  for seed in 1, 2:
    with tf.Graph().as_default() as graph:
      cifar10_input.generate_batch_inputs(
          eval_data=False, data_dir=tiny_data, batch_size=32, shuffle=True,
          seed=seed, num_preprocess_threads=1)
      assert sorted((op.type, op.get_attr('seed2'))
                    for op in graph.get_operations()
                    if op.type.startswith('RandomShuffle')) == [
                        ('RandomShuffle', seed),
                        ('RandomShuffleQueueV2', seed)]

  def first_labels(seed):
    (_, labels), = read_batches(tiny_data, eval_data=False, batch_size=32,
                                shuffle=True, seed=seed)
    return labels.tolist()
  assert first_labels(1) != first_labels(2)


@pytest.mark.parametrize('setup, message', [
    (lambda d: None, 'does not exist'),
    (lambda d: os.makedirs(d), 'no data_batch_*.bin'),
    (lambda d: (os.makedirs(d),
                np.zeros(3073 * 2 - 1, np.uint8).tofile(d + '/data_batch_1.bin')),
     'has 6145 bytes, not a positive multiple of the 3073-byte'),
    (lambda d: (os.makedirs(d),
                open(d + '/data_batch_1.bin', 'w').close()),
     'has 0 bytes'),
    (lambda d: (os.makedirs(d),
                np.full(3073 * 3, 10, np.uint8).tofile(d + '/data_batch_1.bin')),
     "record 0 has label 10, but labels must be 0..9 (CIFAR-10's 10 classes; "
     'for more, list their names in batches.meta.txt)'),
    # Your own data: its classes are the names of batches.meta.txt.
    (lambda d: (os.makedirs(d),
                pathlib.Path(d, 'batches.meta.txt').write_text('a\nb\n\nc\n\n'),
                np.full(3073, 3, np.uint8).tofile(d + '/data_batch_1.bin')),
     'record 0 has label 3, but labels must be 0..2 (%s/batches.meta.txt '
     'names 3 classes)'),
    (lambda d: (os.makedirs(d),
                pathlib.Path(d, 'batches.meta.txt').write_text('x\n' * 257),
                np.zeros(3073, np.uint8).tofile(d + '/data_batch_1.bin')),
     '%s/batches.meta.txt names 257 classes, but a label byte holds at most '
     '256'),
])
def test_bad_data_is_reported_before_any_graph_is_built(tmp_path, setup,
                                                         message):
  data_dir = str(tmp_path / 'data')
  setup(data_dir)
  with tf.Graph().as_default() as graph:
    with pytest.raises(cifar10_input.DataError) as err:
      cifar10_input.generate_batch_inputs(False, True, data_dir, 8)
    assert not graph.get_operations()
  assert message.replace('%s', data_dir) in str(err.value)
  assert '\n' not in str(err.value)


@pytest.mark.parametrize('meta, labels, classes', [
    ('a\nb\n\nc\n\n', [0, 2, 1], 3),        # Blank lines are no classes.
    ('\n'.join('c%d' % i for i in range(256)), [255, 11], 256),
    ('\n\n', [9, 0], 10),                       # No names: CIFAR-10's 10.
    (None, [9], 10)])
def test_the_classes_are_those_batches_meta_names(tmp_path, meta, labels,
                                                  classes):
  data_dir = tmp_path / 'data'
  os.makedirs(data_dir)
  if meta is not None:
    (data_dir / 'batches.meta.txt').write_text(meta)
  records = np.zeros((len(labels), 3073), np.uint8)
  records[:, 0] = labels
  records.tofile(str(data_dir / 'data_batch_1.bin'))
  assert cifar10_input.num_classes(str(data_dir))[0] == classes
  assert cifar10_input.check_data(str(data_dir), eval_data=False)[1] == len(
      labels)


def test_missing_test_file(handmade):
  data_dir, _ = handmade
  os.remove(os.path.join(data_dir, 'test_batch.bin'))
  with pytest.raises(cifar10_input.DataError, match='test_batch.bin is missing'):
    cifar10_input.check_data(data_dir, eval_data=True)
  assert cifar10_input.check_data(data_dir, eval_data=False)[1] == 5


def test_show_inputs_shows_the_crops_of_the_padding_given(tmp_path,
                                                           monkeypatch,
                                                           capsys):
  """scripts/show_inputs.py's --crop_padding and --random_erasing reach the
  reader it draws from, and the reader crops with it: white records stay
  one value each without crops; with 4 pixels, black shifts in."""
  import show_inputs  # pylint: disable=g-import-not-at-top
  white = np.full((20, 3, 32, 32), 255, np.uint8)
  for name in ('data_batch_1.bin', 'test_batch.bin'):
    write_records(str(tmp_path / name), [0] * 20, white)
  path = str(tmp_path / 'data_batch_1.bin')
  _, uncropped, _ = show_inputs.read_records(path, 20, 0, 0)
  assert all(np.ptp(image) < 1e-3 for image in uncropped)
  _, cropped, _ = show_inputs.read_records(path, 20, 0, 4)
  # Each image unshifted with p = 1/81: all 20 of them, never.
  assert sum(np.ptp(image) > 1 for image in cropped) >= 10
  given = []
  real = show_inputs.read_records
  monkeypatch.setattr(show_inputs, 'read_records',
                      lambda *args: given.append(args) or real(*args))
  png = tmp_path / 'inputs.png'
  show_inputs.main(['--data_dir=' + str(tmp_path), '--out=' + str(png),
                    '--num=4', '--crop_padding=3', '--random_erasing=0.5',
                    '--erasing_fill=mean'])
  assert given == [(path, 4, 0, 3, 0.5, 'mean')] and png.exists()
  png.unlink()
  capsys.readouterr()  # What the runs above printed.
  with pytest.raises(SystemExit) as exited:  # One line, status 2.
    show_inputs.main(['--data_dir=' + str(tmp_path), '--out=' + str(png),
                      '--crop_padding=-1'])
  assert exited.value.code == 2
  assert capsys.readouterr().err == (
      'Error: --crop_padding must be 0 or more (got -1)\n')
  for flag, error in [('--random_erasing=2', '--random_erasing must be from '
                       '0 to 1 (got 2)'),
                      ('--erasing_fill=zeros', '--erasing_fill must be one '
                       'of noise, mean (got zeros)')]:
    with pytest.raises(SystemExit) as exited:
      show_inputs.main(['--data_dir=' + str(tmp_path), '--out=' + str(png),
                        flag])
    assert exited.value.code == 2
    assert capsys.readouterr().err == 'Error: %s\n' % error
  assert not png.exists()
