"""--random_erasing (Zhong et al., AAAI 2020) on photos made by hand: one
rectangle a photo, of the paper's areas and aspects, anywhere in the photo,
filled as asked; none at 0; never in the evaluator's photos."""

import numpy as np
import pytest
import tensorflow as tf

import cifar10_input

tf1 = tf.compat.v1

# The paper's ranges, written out here: an area of 2-40% of the 32x32
# photo, a height over width of 0.3 to 1/0.3, each side rounded to whole
# pixels (so up to half a pixel more or less on each side).
SIDE = 32
AREA = (0.02 * SIDE * SIDE, 0.4 * SIDE * SIDE)
ASPECT = (0.3, 1 / 0.3)


def erase(images, probability, fill='noise'):
  """random_erasing's photos, seeded: the same draws at every run."""
  with tf.Graph().as_default():
    tf1.set_random_seed(0)
    erased = cifar10_input.random_erasing(tf.constant(images), probability,
                                          fill)
    with tf1.Session() as sess:
      return sess.run(erased)


def rectangles(erased, images, tolerance=0.0):
  """[(top, left, height, width) or None] of what changed (by more than
  tolerance) in each photo, checked to be one rectangle through every
  channel. (A value drawn as noise may equal the one it replaces to the
  last bit, about once in 10^7 values: a few of a rectangle's may stay.)"""
  found = []
  for after, before in zip(erased, images):
    changed = np.abs(after - before) > tolerance
    mask = changed.any(axis=2)
    if not mask.any():
      found.append(None)
      continue
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(
        mask.any(axis=0))
    top, left = rows[0], cols[0]
    height, width = rows[-1] - top + 1, cols[-1] - left + 1
    inside = changed[top:top + height, left:left + width].sum()
    assert inside >= height * width * 3 - 2
    assert changed.sum() == inside  # Nothing outside it.
    found.append((top, left, height, width))
  return found


@pytest.fixture(scope='module')
def photos():
  # Standardized photos: values of mean 0 and deviation 1, none alike, so
  # that any value the erasing writes differs from the one it replaces.
  images = np.random.default_rng(0).standard_normal(
      (3000, SIDE, SIDE, 3)).astype(np.float32)
  return images


def test_each_photo_erased_has_one_rectangle_of_the_papers_sizes(photos):
  found = [r for r in rectangles(erase(photos, 1.0), photos) if r]
  # About 5% of the draws do not fit in the photo: all 10 of a photo's
  # miss about once in 10^13 photos. Every photo is erased.
  assert len(found) == len(photos)
  heights = np.array([h for _, _, h, _ in found])
  widths = np.array([w for _, _, _, w in found])
  # Each side rounded to whole pixels: the area and aspect within the
  # paper's ranges widened by half a pixel a side. The smallest area, 20.48
  # px, rounds to no less than 15.4 px (2 x 8 at the widest aspect).
  assert ((heights * widths >= 15) & (heights < SIDE) &
          (widths < SIDE)).all()
  assert ((heights - 0.5) * (widths - 0.5) <= AREA[1]).all()
  assert ((heights - 0.5) / (widths + 0.5) <= ASPECT[1]).all()
  assert ((heights + 0.5) / (widths - 0.5) >= ASPECT[0]).all()
  # And the draws span the ranges: small and large, tall and wide.
  assert (heights * widths).min() < 1.5 * AREA[0]
  assert (heights * widths).max() > 0.85 * AREA[1]
  assert (heights / widths).min() < 0.4 and (heights / widths).max() > 2.5


def test_the_rectangle_falls_anywhere_in_the_photo(photos):
  found = [r for r in rectangles(erase(photos, 1.0), photos) if r]
  # Touching each edge in some photos, away from all of them in others;
  # and whole there, not cut by the edge: within the paper's sizes.
  assert all(h * w >= 15 and (h - 0.5) / (w + 0.5) <= ASPECT[1] and
             (h + 0.5) / (w - 0.5) >= ASPECT[0] for _, _, h, w in found)
  assert any(top == 0 for top, _, _, _ in found)
  assert any(left == 0 for _, left, _, _ in found)
  assert any(top + h == SIDE for top, _, h, _ in found)
  assert any(left + w == SIDE for _, left, _, w in found)
  assert any(top > 0 and left > 0 and top + h < SIDE and left + w < SIDE
             for top, left, h, w in found)


def test_the_share_erased_is_the_probability(photos):
  found = rectangles(erase(photos, 0.3), photos)
  share = sum(r is not None for r in found) / len(found)
  # 3000 photos at 0.3: a standard deviation of 0.0084 (seeded: one draw).
  assert 0.27 <= share <= 0.33, share


@pytest.mark.parametrize('fill', ['noise', 'mean'])
def test_the_fill_follows_the_photos_own_statistics(fill):
  # Photos of their own mean and deviation (raw pixels, --nostandardize):
  # photo i has mean 100 + i and deviation 1 + i / 10.
  rng = np.random.default_rng(1)
  n = 200
  images = (100 + np.arange(n)[:, None, None, None] + (
      1 + np.arange(n)[:, None, None, None] / 10) * rng.standard_normal(
          (n, SIDE, SIDE, 3))).astype(np.float32)
  erased = erase(images, 1.0, fill)
  found = rectangles(erased, images)
  standard = []
  for after, before, r in zip(erased, images, found):
    if r is None:
      continue
    top, left, h, w = r
    values = after[top:top + h, left:left + w]  # [h, w, 3]
    if fill == 'mean':
      np.testing.assert_allclose(values, before.mean(), rtol=1e-5)
    else:
      standard.append(((values - before.mean()) / before.std()).reshape(
          -1, 3))
  if fill == 'noise':  # Normal noise of each photo's mean and deviation,
    standard = np.concatenate(standard)  # each value drawn on its own.
    assert abs(standard.mean()) < 0.02 and abs(standard.std() - 1) < 0.02
    assert 0.6 < np.mean(np.abs(standard) < 1) < 0.72  # A normal's 0.68.
    assert np.abs(np.corrcoef(standard.T) - np.eye(3)).max() < 0.05


def test_no_erasing_leaves_every_photo_bit_for_bit(photos):
  assert erase(photos[:100], 0.0).tobytes() == photos[:100].tobytes()


def records(tmp_path):
  """A training and a test file of 64 records each, of pixels 0 or 255 and
  each row its own mirror: the training pipeline's flip changes nothing,
  and its brightness and contrast (per channel) little that the
  standardization after them does not undo."""
  rng = np.random.default_rng(2)
  for name in ('data_batch_1.bin', 'test_batch.bin'):
    half = rng.integers(0, 2, (64, 3, SIDE, SIDE // 2)) * 255
    chw = np.concatenate([half, half[..., ::-1]], axis=3)
    rec = np.concatenate([rng.integers(0, 10, (64, 1)), chw.reshape(64, -1)],
                         axis=1).astype(np.uint8)
    rec.tofile(str(tmp_path / name))
  return str(tmp_path)


def read(data_dir, eval_data, **kwargs):
  """One in-order batch of 64, through the pipeline, seeded."""
  with tf.Graph().as_default():
    tf1.set_random_seed(3)
    images, _ = cifar10_input.generate_batch_inputs(
        eval_data=eval_data, shuffle=False, data_dir=data_dir, batch_size=64,
        num_preprocess_threads=1, seed=3, **kwargs)
    with tf1.train.MonitoredSession() as sess:
      return sess.run(images)


def test_the_training_pipeline_erases_and_the_evaluators_never(tmp_path):
  data_dir = records(tmp_path)
  plain = read(data_dir, False, distort=False)  # Standardized: about +-1.
  augmented = read(data_dir, False, distort=True, crop_padding=0)
  np.testing.assert_allclose(augmented, plain, atol=0.3)
  # Erased after the standardization: the augmented photos (the same
  # seeds: the erasing's ops come after the augmentation's), each with a
  # rectangle at its mean, about 0 after the standardization.
  erased = read(data_dir, False, distort=True, crop_padding=0, erasing=1.0,
                erasing_fill='mean')
  found = rectangles(erased, augmented)
  assert all(found)
  for photo, before, (top, left, h, w) in zip(erased, augmented, found):
    np.testing.assert_allclose(photo[top:top + h, left:left + w],
                               before.mean(), atol=1e-6)
    assert abs(before.mean()) < 1e-4  # Standardized, not raw, pixels.
  # The evaluator's reading (eval_data, distort by default off): not one
  # photo erased, asked or not.
  test = read(data_dir, True)
  assert read(data_dir, True, erasing=1.0).tobytes() == test.tobytes()
  # And training with erasing at 0: the same photos as without the argument.
  assert read(data_dir, False, erasing=0.0).tobytes() == read(
      data_dir, False).tobytes()
