//! Rows as arrangements hold them: a batch's keys (or values) laid end to end
//! in one vector of values, not a vector of rows each with its own header and
//! allocation. All rows of one arrangement's keys have the same width (as do
//! its values: a relation has one arity, a join key one length), so a row's
//! place is its index times the width; a container that is handed rows of
//! different widths keeps where each ends instead.
//!
//! The spines, batchers and builders below are differential's own ordered
//! batches over this container; an arrangement's cursor reads a key or a
//! value as a [`RowRef`].

use crate::value::{Row, Value};
use differential_dataflow::batcher::merge::chunker::ContainerChunker;
use differential_dataflow::batcher::merge::vec::VecMerger;
use differential_dataflow::batcher::merge::MergeBatcher;
use differential_dataflow::trace::implementations::ord_neu::{OrdKeyBatch, OrdKeyBuilder, OrdValBatch, OrdValBuilder};
use differential_dataflow::trace::implementations::spine_fueled::Spine;
use differential_dataflow::trace::implementations::{BatchContainer, OffsetList};
use std::rc::Rc;
use timely::container::PushInto;

/// A row read out of an arrangement: its values, borrowed.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct RowRef<'a>(pub &'a [Value]);

impl RowRef<'_> {
    pub fn to_row(self) -> Row {
        Row::from(self.0)
    }
}

impl std::ops::Deref for RowRef<'_> {
    type Target = [Value];
    fn deref(&self) -> &[Value] {
        self.0
    }
}

impl AsRef<[Value]> for RowRef<'_> {
    fn as_ref(&self) -> &[Value] {
        self.0
    }
}

impl<'b> PartialEq<&'b Row> for RowRef<'_> {
    fn eq(&self, other: &&'b Row) -> bool {
        self.0 == &other[..]
    }
}

/// Rows end to end: `values` holds row `i` at `i * width ..` while every row
/// pushed had the same width; once one does not, `ends` says where each ends.
pub struct RowContainer {
    values: Vec<Value>,
    /// The width of every row, while they all have one (from the first row).
    width: usize,
    /// Where each row ends in `values`; empty while all rows have one width.
    ends: Vec<usize>,
    rows: usize,
    /// Rows asked for by `with_capacity`: reserved as values once the first
    /// row gives the width.
    expected: usize,
}

impl RowContainer {
    /// Appends a row, taking its values (a moved value is not counted again).
    fn push_values(&mut self, len: usize, values: impl IntoIterator<Item = Value>) {
        if self.rows == 0 {
            self.width = len;
            self.values.reserve_exact(self.expected.max(1) * len);
        } else if self.ends.is_empty() && len != self.width {
            // Widths differ: from here on, each row's end is kept.
            self.ends = (1..=self.rows).map(|i| i * self.width).collect();
        }
        self.values.extend(values);
        if !self.ends.is_empty() || len != self.width {
            self.ends.push(self.values.len());
        }
        self.rows += 1;
    }
}

impl Default for RowContainer {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

impl PushInto<Row> for RowContainer {
    fn push_into(&mut self, row: Row) {
        self.push_values(row.len(), row);
    }
}

impl PushInto<&Row> for RowContainer {
    fn push_into(&mut self, row: &Row) {
        self.push_values(row.len(), row.iter().cloned());
    }
}

impl BatchContainer for RowContainer {
    type Owned = Row;
    type ReadItem<'a> = RowRef<'a>;

    fn into_owned<'a>(item: RowRef<'a>) -> Row {
        item.to_row()
    }
    fn clone_onto<'a>(item: RowRef<'a>, other: &mut Row) {
        other.clear();
        other.extend(item.0.iter().cloned());
    }
    fn push_ref(&mut self, item: RowRef<'_>) {
        self.push_values(item.0.len(), item.0.iter().cloned());
    }
    fn push_own(&mut self, item: &Row) {
        self.push_into(item);
    }
    fn clear(&mut self) {
        self.values.clear();
        self.ends.clear();
        self.rows = 0;
    }
    fn with_capacity(size: usize) -> Self {
        RowContainer { values: Vec::new(), width: 0, ends: Vec::new(), rows: 0, expected: size }
    }
    fn merge_capacity(a: &Self, b: &Self) -> Self {
        RowContainer { values: Vec::with_capacity(a.values.len() + b.values.len()), width: 0, ends: Vec::new(), rows: 0, expected: a.rows + b.rows }
    }
    fn reborrow<'b, 'a: 'b>(item: RowRef<'a>) -> RowRef<'b> {
        item
    }
    #[inline]
    fn index(&self, index: usize) -> RowRef<'_> {
        debug_assert!(index < self.rows, "row {index} of {}", self.rows);
        if self.ends.is_empty() {
            let at = index * self.width;
            RowRef(&self.values[at..at + self.width])
        } else {
            RowRef(&self.values[if index == 0 { 0 } else { self.ends[index - 1] }..self.ends[index]])
        }
    }
    fn len(&self) -> usize {
        self.rows
    }
}

/// A batch's times or diffs: a `Vec` that grows as it is pushed to, not one
/// sized up front for every update. Differential's builders ask for room for
/// all of a batch's updates, but write an update's (time, diff) only where
/// it is not the one before it again — rarely, once a trace is compacted to
/// one time — and the room asked for stayed with the batch: a sixth of the
/// engine's heap after a cold load, for nothing.
pub struct Grown<T>(Vec<T>);

impl<T: Ord + Clone + 'static> BatchContainer for Grown<T> {
    type Owned = T;
    type ReadItem<'a> = &'a T;

    #[inline(always)]
    fn into_owned(item: &T) -> T {
        item.clone()
    }
    #[inline(always)]
    fn clone_onto(item: &T, other: &mut T) {
        other.clone_from(item);
    }
    fn reborrow<'b, 'a: 'b>(item: &'a T) -> &'b T {
        item
    }
    fn push_ref(&mut self, item: &T) {
        self.0.push(item.clone())
    }
    fn push_own(&mut self, item: &T) {
        self.0.push(item.clone())
    }
    fn clear(&mut self) {
        self.0.clear()
    }
    fn with_capacity(_size: usize) -> Self {
        Grown(Vec::new())
    }
    fn merge_capacity(_a: &Self, _b: &Self) -> Self {
        Grown(Vec::new())
    }
    #[inline(always)]
    fn index(&self, index: usize) -> &T {
        &self.0[index]
    }
    fn get(&self, index: usize) -> Option<&T> {
        self.0.get(index)
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

impl<T> PushInto<T> for Grown<T> {
    fn push_into(&mut self, item: T) {
        self.0.push(item)
    }
}

impl<T: Clone> PushInto<&T> for Grown<T> {
    fn push_into(&mut self, item: &T) {
        self.0.push(item.clone())
    }
}

/// A batch layout: keys and values as rows end to end.
type ValLayout<T> = (RowContainer, RowContainer, Grown<T>, Grown<isize>, OffsetList);
/// A batch layout of keys alone.
type KeyLayout<T> = (RowContainer, Vec<()>, Grown<T>, Grown<isize>, OffsetList);

pub type RowValSpine<T> = Spine<Rc<OrdValBatch<ValLayout<T>>>>;
pub type RowValBuilder<T> = OrdValBuilder<ValLayout<T>, Vec<((Row, Row), T, isize)>>;
pub type RowValBatcher<T> = MergeBatcher<ContainerChunker<Vec<((Row, Row), T, isize)>>, VecMerger<(Row, Row), T, isize>, RowValBuilder<T>>;
pub type RowKeySpine<T> = Spine<Rc<OrdKeyBatch<KeyLayout<T>>>>;
pub type RowKeyBuilder<T> = OrdKeyBuilder<KeyLayout<T>, Vec<((Row, ()), T, isize)>>;
pub type RowKeyBatcher<T> = MergeBatcher<ContainerChunker<Vec<((Row, ()), T, isize)>>, VecMerger<(Row, ()), T, isize>, RowKeyBuilder<T>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn row(vs: &[i64]) -> Row {
        vs.iter().map(|v| Value::Int(*v)).collect()
    }

    #[test]
    fn a_batchs_times_get_no_room_up_front_and_read_back_as_pushed() {
        let mut times = Grown::<u64>::with_capacity(100_000);
        assert_eq!(times.0.capacity(), 0, "room for every update was asked for");
        assert_eq!(Grown::merge_capacity(&times, &times).0.capacity(), 0);
        times.push_own(&7);
        times.push_into(9);
        assert_eq!((times.len(), *times.index(0), times.get(1), times.get(2)), (2, 7, Some(&9), None));
    }

    #[test]
    fn rows_of_one_width_are_read_back_as_pushed() {
        let mut c = RowContainer::with_capacity(3);
        for r in [row(&[1, 2]), row(&[3, 4]), row(&[5, 6])] {
            c.push_own(&r);
        }
        assert_eq!(c.len(), 3);
        assert_eq!(c.index(1).to_row(), row(&[3, 4]));
        assert_eq!(c.values.capacity(), 6, "reserved for three rows of two once the width was known");
    }

    #[test]
    fn rows_of_another_width_switch_to_ends_and_read_back_right() {
        let mut c = RowContainer::default();
        for r in [row(&[1, 2]), row(&[3, 4]), row(&[5]), row(&[]), row(&[6, 7, 8])] {
            c.push_own(&r);
        }
        let read: Vec<Row> = (0..c.len()).map(|i| c.index(i).to_row()).collect();
        assert_eq!(read, vec![row(&[1, 2]), row(&[3, 4]), row(&[5]), row(&[]), row(&[6, 7, 8])]);
    }

    #[test]
    fn empty_rows_are_counted_not_lost() {
        let mut c = RowContainer::default();
        c.push_own(&row(&[]));
        c.push_own(&row(&[]));
        assert_eq!(c.len(), 2);
        assert_eq!(c.index(1).0, &[] as &[Value]);
        c.clear();
        assert!(c.is_empty());
        c.push_own(&row(&[9]));
        assert_eq!(c.index(0).to_row(), row(&[9]));
    }

    #[test]
    fn a_row_ref_orders_as_its_row_does() {
        let (a, b) = (row(&[1, 5]), row(&[2]));
        assert_eq!(RowRef(&a).cmp(&RowRef(&b)), a.cmp(&b));
        assert!(RowRef(&a) == &a);
    }
}
