//! The timed driver's event queue: the agents' next runs, earliest first, ties by agent.
//!
//! Nearly every step re-queues the agent that just ran, one sift-down from the root, and with
//! thousands of agents that sift-down was a fifth of a step: a binary heap of 128-bit
//! `(time, agent)` entries is 12 levels deep at 4096 agents, each level a load the next
//! comparison waits for. Here a key is one `u64` — the time above the agent's bits — and a node has eight children in one aligned cache line: 4 levels for 4096 agents,
//! each one line and a branch-free minimum of eight. (A 4-ary heap of 128-bit entries was
//! slower: its minimum of four compiled to branches.)
//!
//! A time that does not fit beside the agent's bits (from 2^48 ps, 281 s, on a machine of
//! 65,536 agents; 2^52 ps at 4096) goes to a binary heap of full entries that
//! the minimum consults too: such runs are correct, only slower.
//!
//! Which entry pops is a function of the entries alone — they are totally ordered, and equal
//! entries are equal — so the queue's shape never changes a result (checked against
//! `BinaryHeap` by a proptest).

use crate::model::AgentId;
use crate::time::Time;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// An unused slot: larger than any key.
const EMPTY: u64 = u64::MAX;

/// A node's eight children, one cache line.
#[derive(Clone, Copy, Debug)]
#[repr(align(64))]
struct Group([u64; 8]);

impl Group {
    const EMPTY: Group = Group([EMPTY; 8]);

    /// The slot of the least key, and the key (branch-free: a tournament of selects).
    #[inline(always)]
    fn min(&self) -> (usize, u64) {
        self.min_but(8)
    }

    /// [`Group::min`] leaving out slot `skip` (none if 8). Selects rather than a copy with
    /// the slot overwritten, whose reads would wait for the copy's stores.
    #[inline(always)]
    fn min_but(&self, skip: usize) -> (usize, u64) {
        let v = |j: usize| (j, if j == skip { EMPTY } else { self.0[j] });
        let pick = |(i, a): (usize, u64), (j, b): (usize, u64)| if b < a { (j, b) } else { (i, a) };
        let a = pick(v(0), v(1));
        let b = pick(v(2), v(3));
        let c = pick(v(4), v(5));
        let d = pick(v(6), v(7));
        pick(pick(a, b), pick(c, d))
    }
}

/// A min-queue of `(time, agent)` entries. Node `j` of the heap is slot `(j - 1) % 8` of group
/// `(j - 1) / 8 + 1`, the root slot 7 of group 0; the children of node `j` are group `j + 1`.
#[derive(Clone, Debug)]
pub(crate) struct EventQueue {
    groups: Vec<Group>,
    len: usize,
    /// Bits of the agent in a key.
    shift: u32,
    /// The latest time a key holds.
    fits: u64,
    /// Entries whose time does not fit a key.
    far: BinaryHeap<Reverse<(Time, AgentId)>>,
}

impl EventQueue {
    /// A queue for agents `0..agents`.
    pub(crate) fn new(agents: usize) -> Self {
        Self::with_fits(agents, u64::MAX)
    }

    /// A queue whose keys hold times up to `fits` at most (smaller in tests, to reach the far
    /// heap).
    fn with_fits(agents: usize, fits: u64) -> Self {
        let shift = usize::BITS - agents.max(2).saturating_sub(1).leading_zeros();
        EventQueue {
            groups: vec![Group::EMPTY; 1 + agents.div_ceil(8)],
            len: 0,
            shift,
            // The all-ones key is kept free for empty slots.
            fits: fits.min((EMPTY >> shift) - 1),
            far: BinaryHeap::new(),
        }
    }

    #[inline(always)]
    fn slot(&self, j: usize) -> u64 {
        if j == 0 {
            self.groups[0].0[7]
        } else {
            self.groups[(j - 1) / 8 + 1].0[(j - 1) % 8]
        }
    }

    #[inline(always)]
    fn set(&mut self, j: usize, k: u64) {
        if j == 0 {
            self.groups[0].0[7] = k;
        } else {
            self.groups[(j - 1) / 8 + 1].0[(j - 1) % 8] = k;
        }
    }

    #[inline(always)]
    fn decode(&self, k: u64) -> (Time, AgentId) {
        (
            Time(k >> self.shift),
            (k & ((1 << self.shift) - 1)) as AgentId,
        )
    }

    /// The key of an entry, if its time fits one.
    #[inline(always)]
    fn key(&self, at: Time, agent: AgentId) -> Option<u64> {
        (at.0 <= self.fits).then(|| at.0 << self.shift | agent as u64)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.len + self.far.len()
    }

    /// The earliest entry.
    #[inline]
    pub(crate) fn peek(&self) -> Option<(Time, AgentId)> {
        let near = (self.len > 0).then(|| self.decode(self.slot(0)));
        match self.far.peek() {
            None => near,
            Some(&Reverse(f)) => Some(near.map_or(f, |n| n.min(f))),
        }
    }

    pub(crate) fn push(&mut self, at: Time, agent: AgentId) {
        let Some(k) = self.key(at, agent) else {
            self.far.push(Reverse((at, agent)));
            return;
        };
        if self.len / 8 + 2 > self.groups.len() {
            self.groups.push(Group::EMPTY);
        }
        let mut j = self.len;
        self.len += 1;
        while j > 0 {
            let p = (j - 1) / 8;
            let pk = self.slot(p);
            if pk < k {
                break;
            }
            self.set(j, pk);
            j = p;
        }
        self.set(j, k);
    }

    /// Remove the earliest entry.
    #[inline]
    pub(crate) fn pop(&mut self) {
        if self.far_is_first() {
            self.far.pop();
            return;
        }
        self.len -= 1;
        let last = self.slot(self.len);
        self.set(self.len, EMPTY);
        if self.len > 0 {
            self.sift_down(last);
        }
    }

    /// Replace the earliest entry by `(at, agent)`: one sift-down, where a pop and a push
    /// would be two walks.
    #[inline]
    pub(crate) fn replace_top(&mut self, at: Time, agent: AgentId) {
        match self.key(at, agent) {
            Some(k) if !self.far_is_first() => self.sift_down(k),
            _ => {
                self.pop();
                self.push(at, agent);
            }
        }
    }

    /// Is the earliest entry in the far heap?
    #[inline(always)]
    fn far_is_first(&self) -> bool {
        match self.far.peek() {
            None => false,
            Some(&Reverse(f)) => self.len == 0 || f < self.decode(self.slot(0)),
        }
    }

    /// Put `k` at the root and move it down to its place.
    #[inline(always)]
    fn sift_down(&mut self, k: u64) {
        let mut j = 0;
        while let Some(g) = self.groups.get(j + 1) {
            let (i, m) = g.min();
            if m >= k {
                break;
            }
            self.set(j, m);
            j = 8 * j + 1 + i;
        }
        self.set(j, k);
    }

    /// The agents of the second- and third-earliest entries, as far as a cheap look can tell
    /// (hints only: the far heap is not consulted): the least child of the root, then the
    /// lesser of the root's next child and that child's least child.
    #[inline]
    pub(crate) fn next_two(&self) -> Option<(AgentId, AgentId)> {
        if self.len < 3 {
            return None;
        }
        let g = &self.groups[1];
        let (i, second) = g.min();
        let (_, other) = g.min_but(i);
        let below = self.groups.get(i + 2).map_or(EMPTY, |c| c.min().1);
        let third = other.min(below);
        Some((self.decode(second).1, self.decode(third).1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Push(u64, usize),
        Pop,
        Replace(u64, usize),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        proptest::collection::vec(
            prop_oneof![
                (0u64..200, 0usize..40).prop_map(|(d, a)| Op::Push(d, a)),
                Just(Op::Pop),
                (0u64..200, 0usize..40).prop_map(|(d, a)| Op::Replace(d, a)),
            ],
            1..400,
        )
    }

    proptest! {
        /// The same entries pop in the same order as from a binary heap of `(time, agent)`,
        /// whether times fit a key or go to the far heap. Times are pushed at or after the
        /// earliest entry, as the driver does.
        #[test]
        fn pops_in_the_binary_heaps_order(ops in ops(), fits in prop_oneof![Just(u64::MAX), 0u64..300]) {
            let mut q = EventQueue::with_fits(40, fits);
            let mut h: BinaryHeap<Reverse<(Time, usize)>> = BinaryHeap::new();
            for op in ops {
                let now = h.peek().map_or(0, |Reverse((t, _))| t.0);
                match op {
                    Op::Push(d, a) => {
                        q.push(Time(now + d), a);
                        h.push(Reverse((Time(now + d), a)));
                    }
                    Op::Pop => {
                        if h.pop().is_some() {
                            q.pop();
                        }
                    }
                    Op::Replace(d, a) => {
                        if h.pop().is_some() {
                            h.push(Reverse((Time(now + d), a)));
                            q.replace_top(Time(now + d), a);
                        }
                    }
                }
                prop_assert_eq!(q.peek(), h.peek().map(|r| r.0));
                prop_assert_eq!(q.len(), h.len());
            }
        }
    }

    #[test]
    fn the_next_two_are_the_second_and_third_earliest_of_a_full_heap() {
        let mut q = EventQueue::new(4096);
        for a in 0..4096 {
            q.push(Time(1000 + (a as u64 * 7919) % 4096), a);
        }
        let mut order = Vec::new();
        let mut c = q.clone();
        while let Some((_, a)) = c.peek() {
            order.push(a);
            c.pop();
        }
        assert_eq!(q.next_two(), Some((order[1], order[2])));
    }
}
