//! A MESI-like directory of shared kernel cache lines, used only to price accesses.
//!
//! Seed 000 removed false sharing (`is_lazy` written on every context switch into the line the
//! flusher reads) and needless atomics; for that to show, an access must cost what the line's
//! whereabouts imply: a hit if this CPU holds it, a transfer from the sibling, the socket or the
//! other socket if another CPU modified it last. Ownership is performance state only; the
//! explorer never sees it.

use crate::profile::Costs;
use crate::topology::{CpuId, Distance, Topology};
use rustc_hash::FxHashMap;
use shootdown_engine::Time;

/// Identity of a cache line (the model maps each kernel variable to one).
pub type LineId = u64;

#[derive(Clone, Debug)]
struct Line {
    owner: Option<u32>,
    sharers: Vec<u64>,
}

#[derive(Clone, Debug, Default)]
pub struct LineDirectory {
    lines: FxHashMap<LineId, Line>,
    words: usize,
}

impl LineDirectory {
    pub fn new(nr_cpus: usize) -> Self {
        LineDirectory {
            lines: FxHashMap::default(),
            words: nr_cpus.div_ceil(64).max(1),
        }
    }

    fn transfer(costs: &Costs, d: Distance) -> Time {
        match d {
            Distance::SameCpu => costs.l1_hit,
            Distance::SameCore => costs.line_same_core,
            Distance::SameSocket => costs.line_same_socket,
            Distance::CrossSocket => costs.line_cross_socket,
        }
    }

    /// Cost of `cpu` reading (`write == false`) or writing `line`, updating ownership.
    pub fn access(
        &mut self,
        topo: &Topology,
        costs: &Costs,
        cpu: CpuId,
        line: LineId,
        write: bool,
    ) -> Time {
        let words = self.words;
        let l = self.lines.entry(line).or_insert_with(|| Line {
            owner: None,
            sharers: vec![0; words],
        });
        let (w, b) = (cpu / 64, 1u64 << (cpu % 64));
        if l.owner == Some(cpu as u32) {
            return costs.l1_hit;
        }
        if !write {
            if l.sharers[w] & b != 0 {
                return costs.l1_hit;
            }
            let cost = match l.owner.take() {
                Some(o) => {
                    let o = o as usize;
                    l.sharers[o / 64] |= 1 << (o % 64);
                    Self::transfer(costs, topo.distance(o, cpu))
                }
                None => costs.line_shared_read,
            };
            l.sharers[w] |= b;
            cost
        } else {
            // Read-for-ownership: invalidate every other copy; the farthest one sets the price.
            let mut cost = costs.line_shared_read;
            if let Some(o) = l.owner {
                cost = cost.max(Self::transfer(costs, topo.distance(o as usize, cpu)));
            }
            for (i, word) in l.sharers.iter().enumerate() {
                let mut bits = *word;
                while bits != 0 {
                    let s = i * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    if s != cpu {
                        cost = cost.max(Self::transfer(costs, topo.distance(s, cpu)));
                    }
                }
            }
            if l.owner.is_none()
                && l.sharers[w] == b
                && l.sharers
                    .iter()
                    .all(|x| *x == 0 || std::ptr::eq(x, &l.sharers[w]))
            {
                cost = costs.l1_hit; // exclusive already: silent upgrade
            }
            l.owner = Some(cpu as u32);
            l.sharers.iter_mut().for_each(|x| *x = 0);
            cost
        }
    }
}
