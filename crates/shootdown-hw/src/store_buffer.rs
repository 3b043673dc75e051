//! x86-TSO store buffers: each CPU's stores enter a private FIFO and reach memory later, in
//! order. A CPU's own loads see its buffered stores (store forwarding); other CPUs do not. Locked
//! read-modify-writes, MFENCE and serializing instructions (a CR3 write, INVLPG, IRET) drain the
//! buffer first. Only the explorer runs with TSO; the timed driver uses sequential consistency.

use std::collections::VecDeque;

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct StoreBuffer<L> {
    pending: VecDeque<(L, u64)>,
}

shootdown_engine::clone_by_fields!(StoreBuffer<L> {
    pending,
});

impl<L> Default for StoreBuffer<L> {
    fn default() -> Self {
        StoreBuffer {
            pending: VecDeque::new(),
        }
    }
}

impl<L: Copy + Eq> StoreBuffer<L> {
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
    pub fn len(&self) -> usize {
        self.pending.len()
    }
    pub fn push(&mut self, loc: L, val: u64) {
        self.pending.push_back((loc, val));
    }
    /// The newest buffered value for `loc`, if any (store forwarding).
    pub fn forward(&self, loc: L) -> Option<u64> {
        self.pending
            .iter()
            .rev()
            .find(|(l, _)| *l == loc)
            .map(|(_, v)| *v)
    }
    /// The buffered stores, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &(L, u64)> {
        self.pending.iter()
    }
    /// The oldest store, which is the next to reach memory.
    pub fn pop_oldest(&mut self) -> Option<(L, u64)> {
        self.pending.pop_front()
    }
    pub fn oldest(&self) -> Option<&(L, u64)> {
        self.pending.front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn fifo_and_forwarding() {
        let mut sb = StoreBuffer::default();
        sb.push('a', 1);
        sb.push('b', 2);
        sb.push('a', 3);
        assert_eq!(sb.forward('a'), Some(3));
        assert_eq!(sb.forward('c'), None);
        assert_eq!(sb.pop_oldest(), Some(('a', 1)));
    }
}
