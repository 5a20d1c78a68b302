//! Greedy offset assignment, as TFLite (`GreedyBySize`) and XLA's heap
//! simulator (`GlobalDecreasingSizeBestFitHeap`) do it: take buffers in a
//! fixed order and put each into the best gap left by the already placed
//! buffers whose lifetimes overlap it.
//!
//! Every strategy is one ordering plus one fit rule; [`Greedy::ALL`] lists
//! them and the interval planner keeps the best result.

use crate::buffer::{align_up, Buffer};

/// The order in which a greedy pass takes buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Decreasing size, then decreasing lifetime (TFLite, XLA's default).
    Size,
    /// Decreasing lifetime length, then decreasing size.
    Lifetime,
    /// Decreasing size × lifetime.
    Area,
    /// Increasing start time (a linear scan, as an online allocator would).
    Start,
}

/// Which gap a buffer goes into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// The smallest gap that holds it (ties: the lowest).
    Best,
    /// The lowest gap that holds it.
    First,
}

/// One greedy strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Greedy {
    pub order: Order,
    pub fit: Fit,
}

impl Greedy {
    pub const ALL: [Greedy; 8] = [
        Greedy::new(Order::Size, Fit::Best),
        Greedy::new(Order::Lifetime, Fit::Best),
        Greedy::new(Order::Area, Fit::Best),
        Greedy::new(Order::Start, Fit::Best),
        Greedy::new(Order::Size, Fit::First),
        Greedy::new(Order::Lifetime, Fit::First),
        Greedy::new(Order::Area, Fit::First),
        Greedy::new(Order::Start, Fit::First),
    ];

    pub const fn new(order: Order, fit: Fit) -> Greedy {
        Greedy { order, fit }
    }

    /// A stable name such as `greedy-size-best`.
    pub fn name(self) -> String {
        let o = match self.order {
            Order::Size => "size",
            Order::Lifetime => "lifetime",
            Order::Area => "area",
            Order::Start => "start",
        };
        let f = match self.fit {
            Fit::Best => "best",
            Fit::First => "first",
        };
        format!("greedy-{o}-{f}")
    }

    /// Offsets for `bufs` (same order), each a multiple of `align`.
    pub fn assign(self, bufs: &[Buffer], align: u64) -> Vec<u64> {
        let mut idx: Vec<usize> = (0..bufs.len()).filter(|&i| bufs[i].is_live()).collect();
        let area = |b: &Buffer| b.size as u128 * b.length() as u128;
        match self.order {
            Order::Size => idx.sort_by(|&a, &b| {
                let (x, y) = (&bufs[a], &bufs[b]);
                y.size
                    .cmp(&x.size)
                    .then(y.length().cmp(&x.length()))
                    .then(a.cmp(&b))
            }),
            Order::Lifetime => idx.sort_by(|&a, &b| {
                let (x, y) = (&bufs[a], &bufs[b]);
                y.length()
                    .cmp(&x.length())
                    .then(y.size.cmp(&x.size))
                    .then(a.cmp(&b))
            }),
            Order::Area => idx.sort_by(|&a, &b| {
                let (x, y) = (&bufs[a], &bufs[b]);
                area(y)
                    .cmp(&area(x))
                    .then(y.size.cmp(&x.size))
                    .then(a.cmp(&b))
            }),
            Order::Start => idx.sort_by(|&a, &b| {
                let (x, y) = (&bufs[a], &bufs[b]);
                x.lower
                    .cmp(&y.lower)
                    .then(y.size.cmp(&x.size))
                    .then(a.cmp(&b))
            }),
        }
        let mut offsets = vec![0u64; bufs.len()];
        let mut placed: Vec<usize> = Vec::with_capacity(idx.len());
        let mut busy: Vec<(u64, u64)> = Vec::new();
        for i in idx {
            let b = &bufs[i];
            busy.clear();
            busy.extend(
                placed
                    .iter()
                    .filter(|&&j| bufs[j].overlaps_in_time(b))
                    .map(|&j| (offsets[j], offsets[j].saturating_add(bufs[j].size))),
            );
            busy.sort_unstable();
            offsets[i] = fit_gap(&busy, b.size, align, self.fit);
            placed.push(i);
        }
        offsets
    }
}

/// The offset of the chosen gap among `busy` regions (sorted by start).
fn fit_gap(busy: &[(u64, u64)], size: u64, align: u64, fit: Fit) -> u64 {
    let mut best: Option<(u64, u64)> = None; // (gap size, offset)
    let mut cursor = 0u64;
    for &(lo, hi) in busy {
        let start = align_up(cursor, align);
        if lo > start && lo - start >= size {
            let gap = lo - start;
            match fit {
                Fit::First => return start,
                Fit::Best => {
                    if best.is_none_or(|(g, _)| gap < g) {
                        best = Some((gap, start));
                    }
                }
            }
        }
        cursor = cursor.max(hi);
    }
    best.map(|(_, o)| o)
        .unwrap_or_else(|| align_up(cursor, align))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_takes_the_tight_gap() {
        let busy = [(0, 10), (20, 30), (34, 40)];
        assert_eq!(fit_gap(&busy, 4, 1, Fit::Best), 30);
        assert_eq!(fit_gap(&busy, 4, 1, Fit::First), 10);
        assert_eq!(fit_gap(&busy, 11, 1, Fit::Best), 40);
        assert_eq!(fit_gap(&busy, 4, 16, Fit::First), 16);
        assert_eq!(fit_gap(&busy, 5, 16, Fit::First), 48);
    }
}
