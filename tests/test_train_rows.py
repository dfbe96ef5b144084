"""Trace rows read by preads (edge0.train.rows) equal numpy's indexing of the same arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from numpy.lib.format import open_memmap

from edge0.train import rows
from edge0.train.rows import take


def _traces(path: Path, shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    data = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    m = open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    m[:] = data
    m.flush()
    del m
    return data


@pytest.mark.parametrize("dtype", ["float16", "float32", "int16"])
def test_rows_of_a_mapped_file_are_numpys_rows(tmp_path: Path, dtype: str) -> None:
    data = _traces(tmp_path / "h.npy", (7, 5, 33, 24), dtype)
    mapped = np.load(tmp_path / "h.npy", mmap_mode="r")
    rng = np.random.default_rng(1)
    for view in (mapped, mapped[:4], mapped[2:6]):  # prefix and offset slices of the map
        n = view.shape[0]
        seqs, pos = rng.integers(-n, n, 600), rng.integers(-33, 33, 600)
        for layer in (0, 3, -1):
            got = take(view, seqs, layer, pos)
            assert rows._file_of(view) is not None  # read by preads, not by the map
            np.testing.assert_array_equal(got, np.asarray(view[seqs, layer, pos]))
            first, last = _bounds(view, mapped)
            np.testing.assert_array_equal(got, data[first:last][seqs, layer, pos])


def _bounds(view: np.ndarray, root: np.ndarray) -> tuple[int, int]:
    first = (view.ctypes.data - root.ctypes.data) // root.strides[0]
    return first, first + view.shape[0]


def test_arrays_in_memory_and_writable_maps_index_as_numpy(tmp_path: Path) -> None:
    data = _traces(tmp_path / "t.npy", (3, 2, 9, 4), "int16")
    writable = open_memmap(tmp_path / "t.npy", mode="r+")
    seqs, pos = np.array([0, 2, 1]), np.array([8, 0, 4])
    for arr in (data, writable):
        assert rows._file_of(arr) is None
        np.testing.assert_array_equal(take(arr, seqs, 1, pos), data[seqs, 1, pos])


def test_rows_outside_the_traces_are_an_error(tmp_path: Path) -> None:
    _traces(tmp_path / "h.npy", (2, 3, 8, 4), "float32")
    mapped = np.load(tmp_path / "h.npy", mmap_mode="r")
    with pytest.raises(IndexError, match="2 windows of 8 tokens"):
        take(mapped, np.array([2]), 0, np.array([0]))
    with pytest.raises(IndexError, match="3 layers"):
        take(mapped, np.array([0]), 3, np.array([0]))


def test_a_replaced_file_is_read_anew(tmp_path: Path) -> None:
    path = tmp_path / "h.npy"
    _traces(path, (2, 1, 4, 8), "float32", seed=0)
    first = take(np.load(path, mmap_mode="r"), np.array([1]), 0, np.array([3]))
    new = tmp_path / "new.npy"
    data = _traces(new, (2, 1, 4, 8), "float32", seed=1)
    new.replace(path)  # a fresh tune writes new files under the same names
    second = take(np.load(path, mmap_mode="r"), np.array([1]), 0, np.array([3]))
    np.testing.assert_array_equal(second, data[[1], 0, [3]])
    assert not np.array_equal(first, second)
    rows.close()
