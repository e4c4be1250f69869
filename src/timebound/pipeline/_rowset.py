"""RowSet: an Arrow table, an active selection and a permutation, with copy-on-write overlays.

The selection and the permutation are one array of base-row indices (the active rows, in order);
``None`` means every row in table order. Writes go to the top overlay layer at column
granularity: :meth:`RowSet.commit` moves the layer's columns one layer down and
:meth:`RowSet.rollback` drops the layer. Neither touches row data, so their cost grows with the
number of keys written, never with the number of rows.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["RowSet"]


class RowSet:
    """Columns (one dict per overlay layer, base first) plus the active-row index."""

    __slots__ = ("_index", "_layers", "_tables", "nrows")

    def __init__(self, columns: dict[str, pa.Array], nrows: int) -> None:
        self._layers: list[dict[str, pa.Array]] = [columns]
        self._index: pa.Array | None = None  # active base rows, in order; None = all, in order
        self.nrows = nrows  # base rows
        # Projections handed to tasks, by key tuple: tasks reading the same keys share one
        # until one of those keys is written or the rows change.
        self._tables: dict[tuple[str, ...], pa.Table] = {}

    @property
    def index(self) -> pa.Array | None:
        return self._index

    @index.setter
    def index(self, value: pa.Array | None) -> None:
        self._index = value
        self._tables.clear()

    # Reading ------------------------------------------------------------------------------

    @property
    def active_count(self) -> int:
        return self.nrows if self.index is None else len(self.index)

    @property
    def depth(self) -> int:
        """The number of open overlays."""
        return len(self._layers) - 1

    def has(self, key: str) -> bool:
        return any(key in layer for layer in self._layers)

    def keys(self) -> list[str]:
        """Every key present, in first-write order (base columns first)."""
        seen: dict[str, None] = {}
        for layer in self._layers:
            seen.update(dict.fromkeys(layer))
        return list(seen)

    def _base_column(self, key: str) -> pa.Array:
        for layer in reversed(self._layers):
            col = layer.get(key)
            if col is not None:
                return col
        raise KeyError(key)

    def column(self, key: str) -> pa.Array:
        """The active rows of ``key``, in order."""
        col = self._base_column(key)
        return col if self.index is None else col.take(self.index)

    def table(self, keys: Iterable[str] | None = None) -> pa.Table:
        """The active rows of ``keys`` (every key by default) as a table, in order."""
        names = tuple(self.keys() if keys is None else keys)
        table = self._tables.get(names)
        if table is None:
            if names:
                table = pa.Table.from_arrays([self.column(k) for k in names], names=list(names))
            else:
                # No columns, but still the right number of rows.
                table = pa.table({"_": pa.nulls(self.active_count)}).select([])
            self._tables[names] = table
        return table

    # Writing ------------------------------------------------------------------------------

    def write(self, key: str, column: pa.Array) -> None:
        """Store ``column`` (one value per active row) for ``key`` in the top layer."""
        if self.index is not None:
            self._compact()
        self._layers[-1][key] = column
        for names in [n for n in self._tables if key in n]:
            del self._tables[names]

    def _compact(self) -> None:
        """Make the active rows the base rows (after filter/sort/take/dedupe, before a write)."""
        if self.depth:
            # Inside an overlay the rowset is preserved (``_region.check_preserved``), so the
            # index never changes there; compaction happens at begin().
            raise AssertionError("a rowset is compacted only outside overlays")
        index = self.index
        assert index is not None
        self._layers[0] = {k: v.take(index) for k, v in self._layers[0].items()}
        self.nrows = len(index)
        self.index = None

    def begin(self) -> int:
        """Open an overlay: later writes are staged until commit or rollback. Returns its
        depth, for :meth:`rollback_to`."""
        if self.index is not None and not self.depth:
            self._compact()
        self._layers.append({})
        self._tables.clear()
        return self.depth

    def commit(self) -> None:
        """Apply the top overlay's columns to the layer below (no row data is copied)."""
        if not self.depth:
            raise RuntimeError("commit without an open overlay")
        top = self._layers.pop()
        self._layers[-1].update(top)
        self._tables.clear()

    def rollback(self) -> None:
        """Drop the top overlay: none of its writes remain visible."""
        if not self.depth:
            raise RuntimeError("rollback without an open overlay")
        self._layers.pop()
        self._tables.clear()

    def rollback_to(self, depth: int) -> None:
        """Drop the overlay opened at ``depth`` and every overlay opened inside it (a nested
        region cut before it could settle)."""
        if not 1 <= depth <= self.depth:
            raise RuntimeError(f"no open overlay at depth {depth}")
        del self._layers[depth:]
        self._tables.clear()

    # Shape-changing operations (never inside an overlay) -----------------------------------

    def _select(self, positions: pa.Array) -> None:
        """Keep the active rows at ``positions`` (indices into the active rows), in order."""
        positions = positions.cast(pa.int64())
        self.index = positions if self.index is None else self.index.take(positions)

    def filter(self, mask: pa.Array) -> None:
        """Keep the active rows where ``mask`` is true (null counts as false)."""
        self._select(pc.indices_nonzero(pc.fill_null(mask, False)))

    def sort(self, key: str, descending: bool) -> None:
        """Reorder the active rows by ``key`` (stable; nulls last)."""
        order = pc.array_sort_indices(
            self.column(key),
            order="descending" if descending else "ascending",
            null_placement="at_end",
        )
        self._select(order)

    def take(self, n: int) -> None:
        """Keep the first ``n`` active rows."""
        if self.index is not None:
            self.index = self.index.slice(0, n)
        elif n < self.nrows:
            # All rows in order: the first n of every column are zero-copy slices.
            self._layers[0] = {k: v.slice(0, n) for k, v in self._layers[0].items()}
            self.nrows = n
            self._tables.clear()

    def dedupe(self, key: str) -> None:
        """Keep the first active row of each value of ``key`` (nulls are one value)."""
        values = self.column(key)
        firsts = (
            pa.table({"v": values, "i": pa.array(range(len(values)), type=pa.int64())})
            .group_by("v", use_threads=False)
            .aggregate([("i", "min")])
            .column("i_min")
        )
        self._select(firsts.take(pc.sort_indices(firsts)))
