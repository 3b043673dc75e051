//! A MESI-like directory of shared kernel cache lines, used only to price accesses.
//!
//! Seed 000 removed false sharing (`is_lazy` written on every context switch into the line the
//! flusher reads) and needless atomics; for that to show, an access must cost what the line's
//! whereabouts imply: a hit if this CPU holds it, a transfer from the sibling, the socket or the
//! other socket if another CPU modified it last. Ownership is performance state only; the
//! explorer never sees it.
//!
//! A line is in one place at a time: ownership transfers (a read of a line another CPU modified,
//! a read-for-ownership) are serialized per line, so CPUs hammering one line queue behind each
//! other instead of all paying one transfer latency in parallel. A transfer requested at `at`
//! starts when the previous one has completed (`busy_until`). Hits and reads of clean shared
//! copies do not queue.

use crate::profile::Costs;
use crate::topology::{CpuId, Distance, Topology, MAX_CPUS};
use shootdown_engine::Time;

/// Identity of a cache line (the model maps each kernel variable to one).
pub type LineId = u64;

/// How many sharers a line keeps inline before it switches to a bit per CPU.
const FEW: usize = 6;

/// The CPUs holding a clean copy of a line. Most lines are shared by a few CPUs, so they are
/// kept inline (no allocation, work proportional to the sharers); a line many CPUs read (an
/// mm's `tlb_gen`, its cpumask) switches to a bit per CPU. Either way a write's invalidation
/// costs what the reads that made the copies already cost: nothing here scans all CPUs.
///
/// The methods take the line's `side` words: for a line of the flat family its bits live there
/// (`Side`), at a place computed from the line alone; for any other line `side` is empty.
#[derive(Clone, Debug)]
enum Sharers {
    Few {
        n: u8,
        cpus: [u32; FEW],
    },
    /// A bit per CPU on the heap (a hashed line).
    Many(Box<[u64]>),
    /// A bit per CPU in the line's `side` words (a line of the flat family, such as a CPU's
    /// `cpu_tlbstate`, which every flushing CPU reads, or its `flush_tlb_info`, which every
    /// target reads). The driver's prefetch can reach the word a step needs without reading
    /// the entry first ([`LineDirectory::prefetch_sharer`]): behind a heap pointer it was the
    /// commonest cold load of a step at 4096 CPUs.
    Side,
}

impl Sharers {
    const EMPTY: Sharers = Sharers::Few {
        n: 0,
        cpus: [0; FEW],
    };

    /// The bit per CPU, if the set is kept as one.
    #[inline]
    fn bits<'a>(&'a self, side: &'a [u64]) -> Option<&'a [u64]> {
        match self {
            Sharers::Few { .. } => None,
            Sharers::Many(bits) => Some(bits),
            Sharers::Side => Some(side),
        }
    }

    #[inline]
    fn contains(&self, cpu: usize, side: &[u64]) -> bool {
        match self {
            Sharers::Few { n, cpus } => cpus[..*n as usize].contains(&(cpu as u32)),
            Sharers::Many(bits) => bits[cpu / 64] & (1 << (cpu % 64)) != 0,
            Sharers::Side => side[cpu / 64] & (1 << (cpu % 64)) != 0,
        }
    }

    /// Add `cpu` (a machine of `words` × 64 CPUs). Inlined, like the other methods: a step
    /// makes several accesses, and the calls' register saves cost more than their work.
    #[inline]
    fn insert(&mut self, cpu: usize, words: usize, side: &mut [u64]) {
        if self.contains(cpu, side) {
            return;
        }
        match self {
            Sharers::Few { n, cpus } if (*n as usize) < FEW => {
                cpus[*n as usize] = cpu as u32;
                *n += 1;
            }
            Sharers::Few { .. } => self.grow(cpu, words, side),
            Sharers::Many(bits) => bits[cpu / 64] |= 1 << (cpu % 64),
            Sharers::Side => side[cpu / 64] |= 1 << (cpu % 64),
        }
    }

    /// A full inline set plus `cpu`, as a bit per CPU: in `side` if the line has side words
    /// (all clear while the set is inline), else on the heap.
    #[cold]
    #[inline(never)]
    fn grow(&mut self, cpu: usize, words: usize, side: &mut [u64]) {
        let Sharers::Few { cpus, .. } = *self else {
            unreachable!("only a full inline set grows")
        };
        let mut heap = Vec::new();
        let bits = if side.is_empty() {
            heap = vec![0u64; words];
            &mut heap[..]
        } else {
            side
        };
        for c in cpus.into_iter().chain([cpu as u32]) {
            bits[c as usize / 64] |= 1 << (c % 64);
        }
        *self = if heap.is_empty() {
            Sharers::Side
        } else {
            Sharers::Many(heap.into_boxed_slice())
        };
    }

    /// Exactly `{cpu}`?
    #[inline]
    fn is_only(&self, cpu: usize, side: &[u64]) -> bool {
        match self {
            Sharers::Few { n, cpus } => *n == 1 && cpus[0] == cpu as u32,
            _ => self
                .bits(side)
                .into_iter()
                .flatten()
                .enumerate()
                .all(|(i, &w)| w == if i == cpu / 64 { 1 << (cpu % 64) } else { 0 }),
        }
    }

    /// Every sharer.
    #[inline]
    fn for_each(&self, side: &[u64], mut f: impl FnMut(usize)) {
        match self {
            Sharers::Few { n, cpus } => cpus[..*n as usize].iter().for_each(|&c| f(c as usize)),
            _ => {
                for (i, &word) in self.bits(side).into_iter().flatten().enumerate() {
                    let mut w = word;
                    while w != 0 {
                        f(i * 64 + w.trailing_zeros() as usize);
                        w &= w - 1;
                    }
                }
            }
        }
    }

    /// No sharers (a write invalidated every copy).
    #[inline]
    fn clear(&mut self, side: &mut [u64]) {
        if let Sharers::Side = self {
            side.fill(0);
        }
        *self = Sharers::EMPTY;
    }
}

#[derive(Clone, Debug)]
struct Line {
    owner: Option<u32>,
    sharers: Sharers,
    /// When the last ownership transfer of this line completes.
    busy_until: Time,
}

impl Line {
    /// A line no CPU holds.
    const UNTOUCHED: Line = Line {
        owner: None,
        sharers: Sharers::EMPTY,
        busy_until: Time::ZERO,
    };
}

/// Hashes a line id with splitmix64's finalizer: ids are structured (class in the top byte,
/// CPUs in fixed fields), and every bit must reach the bucket index.
#[derive(Clone, Copy, Debug, Default)]
struct LineHasher(u64);
impl std::hash::Hasher for LineHasher {
    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = x;
    }
}

/// The directory: one entry per line ever touched. Most lines live in a hash table; two
/// families the caller numbers densely live in arrays instead. One holds a line per pair of
/// CPUs (the `call_single_data`s), packed, so that a CPU walking its targets touches
/// neighbouring entries rather than a random bucket of a table that grows with the square of
/// the CPUs. The other holds each CPU's own lines (its per-CPU variables), whole and side by
/// side: one slot each, where a cold hash probe costs two cache misses at thousands of CPUs.
#[derive(Clone, Debug, Default)]
pub struct LineDirectory {
    lines: std::collections::HashMap<LineId, Line, std::hash::BuildHasherDefault<LineHasher>>,
    words: usize,
    dense: Dense,
    flat: Flat,
}

/// A family of lines numbered densely, `base..base + len`.
#[derive(Clone, Copy, Debug, Default)]
struct Family {
    base: LineId,
    len: u64,
}

impl Family {
    fn new(ids: std::ops::Range<LineId>) -> Self {
        Family {
            base: ids.start,
            len: ids.end - ids.start,
        }
    }
    /// The line's place in the family, if it belongs to it.
    fn index(&self, line: LineId) -> Option<usize> {
        let i = line.wrapping_sub(self.base);
        (i < self.len).then_some(i as usize)
    }
}

/// A family kept whole in an array ([`LineDirectory::with_flat`]), allocated on first use,
/// with `words` side words per line for the sharer sets that grow to a bit per CPU
/// ([`Sharers::Side`]; zeroed pages, touched only where a set grows).
#[derive(Clone, Debug, Default)]
struct Flat {
    ids: Family,
    lines: Vec<Line>,
    side: Vec<u64>,
}

/// A family kept packed in an array ([`LineDirectory::with_dense`]), allocated on first use
/// (zeroed pages, so untouched lines cost nothing).
#[derive(Clone, Debug, Default)]
struct Dense {
    ids: Family,
    slots: Vec<Slot>,
}

/// A line of the dense family, packed in 16 bytes (so that the csd lines of 4096 CPUs fit a
/// server's last-level cache better): `[owner + 1 | first sharer + 1 << 16 | second sharer + 1
/// << 32 | MOVED, busy_until]`, zero meaning none (CPU ids are below [`MAX_CPUS`] < 2^16). A
/// line with more than two sharers is moved to the hash table for good (its slot says so),
/// where it keeps the general sharer set.
type Slot = [u64; 2];
const MOVED: u64 = 1 << 63;
const _: () = assert!(MAX_CPUS < 0xffff);

impl Dense {
    /// The 16-bit field `k` (0: owner, 1 and 2: sharers): a CPU, or `None`.
    fn field(s: &Slot, k: u32) -> Option<u32> {
        match (s[0] >> (16 * k)) & 0xffff {
            0 => None,
            v => Some(v as u32 - 1),
        }
    }

    fn unpack(s: &Slot) -> Line {
        let mut sharers = Sharers::EMPTY;
        if let Sharers::Few { n, cpus } = &mut sharers {
            for c in [1, 2].into_iter().filter_map(|k| Self::field(s, k)) {
                cpus[*n as usize] = c;
                *n += 1;
            }
        }
        Line {
            owner: Self::field(s, 0),
            sharers,
            busy_until: Time(s[1]),
        }
    }

    /// The line packed, or `None` if its sharers do not fit.
    fn pack(l: &Line) -> Option<Slot> {
        let Sharers::Few { n, cpus } = &l.sharers else {
            return None;
        };
        if *n > 2 {
            return None;
        }
        let mut w = l.owner.map_or(0, |o| o as u64 + 1);
        for (i, &c) in cpus[..*n as usize].iter().enumerate() {
            w |= (c as u64 + 1) << (16 * (i + 1));
        }
        Some([w, l.busy_until.0])
    }
}

impl LineDirectory {
    pub fn new(nr_cpus: usize) -> Self {
        LineDirectory {
            lines: Default::default(),
            words: nr_cpus.div_ceil(64).max(1),
            dense: Dense::default(),
            flat: Flat::default(),
        }
    }

    /// Keep lines `ids` whole in an array rather than the hash table (same prices, one slot
    /// per line): for a family of lines the caller numbers densely, such as each CPU's own
    /// lines side by side. The array is allocated when one of them is first touched.
    pub fn with_flat(mut self, ids: std::ops::Range<LineId>) -> Self {
        self.flat = Flat {
            ids: Family::new(ids),
            lines: Vec::new(),
            side: Vec::new(),
        };
        self
    }

    /// Start fetching `line`'s entry into the host's cache, if it has a slot of its own (a
    /// hint for the timed driver: see `shootdown_engine::Model::prefetch`).
    #[inline]
    pub fn prefetch(&self, line: LineId) {
        let (flat, dense) = (&self.flat, &self.dense);
        if let Some(l) = flat.ids.index(line).and_then(|i| flat.lines.get(i)) {
            shootdown_engine::prefetch(l);
        } else if let Some(s) = dense.ids.index(line).and_then(|i| dense.slots.get(i)) {
            shootdown_engine::prefetch(s);
        }
    }

    /// Start fetching the word of `line`'s sharer set that says whether `cpu` holds a copy,
    /// if the line is of the flat family (whether or not its set is kept there yet: the
    /// entry that would say so is what the prefetch must not wait for).
    #[inline]
    pub fn prefetch_sharer(&self, line: LineId, cpu: CpuId) {
        let flat = &self.flat;
        if let Some(w) = flat
            .ids
            .index(line)
            .and_then(|i| flat.side.get(i * self.words + cpu / 64))
        {
            shootdown_engine::prefetch(w);
        }
    }

    /// Keep lines `ids` in a flat array rather than the hash table (same prices, better
    /// locality): for a family of lines the caller numbers densely and walks in order. The
    /// array is allocated when one of them is first touched. A family of more than 2^26 lines
    /// (1 GB) stays hashed.
    pub fn with_dense(mut self, ids: std::ops::Range<LineId>) -> Self {
        if ids.end - ids.start > 1 << 26 {
            return self;
        }
        self.dense = Dense {
            ids: Family::new(ids),
            slots: Vec::new(),
        };
        self
    }

    fn transfer(costs: &Costs, d: Distance) -> Time {
        match d {
            Distance::SameCpu => costs.l1_hit,
            Distance::SameCore => costs.line_same_core,
            Distance::SameSocket => costs.line_same_socket,
            Distance::CrossLlc => costs.line_cross_llc,
            Distance::CrossSocket => costs.line_cross_socket,
        }
    }

    /// Cost of `cpu` reading (`write == false`) or writing `line` at time `at`, updating
    /// ownership: the transfer latency plus any wait for transfers of the line still in flight.
    pub fn access(
        &mut self,
        topo: &Topology,
        costs: &Costs,
        cpu: CpuId,
        line: LineId,
        write: bool,
        at: Time,
    ) -> Time {
        let words = self.words;
        if let Some(i) = self.flat.ids.index(line) {
            let flat = &mut self.flat;
            if flat.lines.is_empty() {
                flat.lines = vec![Line::UNTOUCHED; flat.ids.len as usize];
                flat.side = vec![0; flat.ids.len as usize * words];
            }
            let side = &mut flat.side[i * words..][..words];
            return Self::access_line(&mut flat.lines[i], side, words, topo, costs, cpu, write, at);
        }
        if let Some(i) = self.dense.ids.index(line) {
            if self.dense.slots.is_empty() {
                self.dense.slots = vec![[0; 2]; self.dense.ids.len as usize];
            }
            let slot = &mut self.dense.slots[i];
            if slot[0] & MOVED == 0 {
                let mut l = Dense::unpack(slot);
                let cost = Self::access_line(&mut l, &mut [], words, topo, costs, cpu, write, at);
                match Dense::pack(&l) {
                    Some(packed) => *slot = packed,
                    None => {
                        *slot = [MOVED, 0];
                        self.lines.insert(line, l);
                    }
                }
                return cost;
            }
        }
        let l = self.lines.entry(line).or_insert(Line::UNTOUCHED);
        Self::access_line(l, &mut [], words, topo, costs, cpu, write, at)
    }

    /// [`Self::access`] on the line's entry and its side words (empty unless it is of the flat
    /// family).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn access_line(
        l: &mut Line,
        side: &mut [u64],
        words: usize,
        topo: &Topology,
        costs: &Costs,
        cpu: CpuId,
        write: bool,
        at: Time,
    ) -> Time {
        if l.owner == Some(cpu as u32) {
            return costs.l1_hit;
        }
        if !write {
            if l.sharers.contains(cpu, side) {
                return costs.l1_hit;
            }
            let cost = match l.owner.take() {
                Some(o) => {
                    let o = o as usize;
                    l.sharers.insert(o, words, side);
                    Self::queue(
                        &mut l.busy_until,
                        at,
                        Self::transfer(costs, topo.distance(o, cpu)),
                    )
                }
                None => costs.line_shared_read,
            };
            l.sharers.insert(cpu, words, side);
            cost
        } else {
            // Read-for-ownership: invalidate every other copy; the farthest one sets the price.
            let mut cost = costs.line_shared_read;
            if let Some(o) = l.owner {
                cost = cost.max(Self::transfer(costs, topo.distance(o as usize, cpu)));
            }
            l.sharers.for_each(side, |s| {
                if s != cpu {
                    cost = cost.max(Self::transfer(costs, topo.distance(s, cpu)));
                }
            });
            if l.owner.is_none() && l.sharers.is_only(cpu, side) {
                cost = costs.l1_hit; // exclusive already: silent upgrade
            } else {
                cost = Self::queue(&mut l.busy_until, at, cost);
            }
            l.owner = Some(cpu as u32);
            l.sharers.clear(side);
            cost
        }
    }

    /// A transfer of `cost` requested at `at` behind the line's in-flight transfers: returns
    /// the wait plus the transfer and books the line until it completes.
    fn queue(busy_until: &mut Time, at: Time, cost: Time) -> Time {
        let start = (*busy_until).max(at);
        *busy_until = start + cost;
        *busy_until - at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::COST_KEYS;

    /// Every cost a different number of nanoseconds, so that a hit, a shared read and each
    /// distance of transfer price differently (in a real machine's order).
    fn distinct_costs() -> Costs {
        let mut map: std::collections::BTreeMap<String, f64> = COST_KEYS
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.to_string(), 100.0 + i as f64))
            .collect();
        for (k, ns) in [
            ("l1_hit", 1.0),
            ("line_shared_read", 7.0),
            ("line_same_core", 13.0),
            ("line_same_socket", 29.0),
            ("line_cross_llc", 45.0),
            ("line_cross_socket", 61.0),
        ] {
            map.insert(k.into(), ns);
        }
        Costs::from_ns_map(&map).expect("all keys")
    }

    #[test]
    fn transfers_of_one_line_queue_but_hits_do_not() {
        let topo = Topology::new(1, 4, 1).unwrap();
        let c = &distinct_costs();
        let mut d = LineDirectory::new(4);
        let t0 = Time::from_ns(1000);
        // cpu0 takes the line; once it has it, cpu1 and cpu2 want it at the same moment: cpu2
        // waits for cpu1's transfer before its own.
        assert_eq!(d.access(&topo, c, 0, 7, true, t0), c.line_shared_read);
        let a = d.access(&topo, c, 1, 7, true, t0 + c.line_shared_read);
        let b = d.access(&topo, c, 2, 7, true, t0 + c.line_shared_read);
        assert_eq!(a, c.line_same_socket);
        assert_eq!(b, c.line_same_socket + c.line_same_socket);
        // The owner's own accesses are hits, whatever is in flight.
        assert_eq!(d.access(&topo, c, 2, 7, true, t0), c.l1_hit);
        // Much later, nothing is in flight: one transfer.
        let later = t0 + Time::from_ns(10_000);
        assert_eq!(d.access(&topo, c, 3, 7, false, later), c.line_same_socket);
    }

    #[test]
    fn sharers_beyond_the_first_64_cpus_are_tracked() {
        // 2 sockets x 80 CPUs: CPUs 64.. live in the second word of the sharer set.
        let topo = Topology::new(2, 80, 1).unwrap();
        let c = &distinct_costs();
        let mut d = LineDirectory::new(topo.nr_cpus());
        let mut t = Time::from_ns(1000);
        let mut step = |d: &mut LineDirectory, cpu, write| {
            t += Time::from_ns(10_000);
            d.access(&topo, c, cpu, 3, write, t)
        };
        // Socket 1 owns it; a reader on socket 1 gets a copy, and the old owner keeps one.
        step(&mut d, 100, true);
        assert_eq!(step(&mut d, 150, false), c.line_same_socket);
        assert_eq!(step(&mut d, 150, false), c.l1_hit);
        assert_eq!(step(&mut d, 100, false), c.l1_hit);
        // A write from socket 0 invalidates both copies on socket 1.
        assert_eq!(step(&mut d, 5, true), c.line_cross_socket);
        // CPU 70 reads, then writes: not a silent upgrade, CPU 5 still holds a copy.
        assert_eq!(step(&mut d, 70, false), c.line_same_socket);
        assert_eq!(step(&mut d, 70, true), c.line_same_socket);
        // CPU 70 now owns it exclusively: its own accesses hit.
        assert_eq!(step(&mut d, 70, true), c.l1_hit);
    }

    #[test]
    fn a_line_many_cpus_read_prices_its_write_by_the_farthest_copy() {
        // More readers than kept inline: the sharer set becomes a bitmap, same prices.
        let topo = Topology::new(2, 8, 1).unwrap();
        let c = &distinct_costs();
        let mut d = LineDirectory::new(topo.nr_cpus());
        let mut t = Time::from_ns(1000);
        let mut step = |d: &mut LineDirectory, cpu, write| {
            t += Time::from_ns(10_000);
            d.access(&topo, c, cpu, 9, write, t)
        };
        step(&mut d, 0, true);
        for cpu in 1..8 {
            step(&mut d, cpu, false); // socket 0 only
        }
        assert_eq!(step(&mut d, 3, false), c.l1_hit);
        assert_eq!(step(&mut d, 2, true), c.line_same_socket);
        assert_eq!(step(&mut d, 2, true), c.l1_hit);
        for cpu in [1, 9, 4, 5, 6, 7, 10] {
            step(&mut d, cpu, false);
        }
        assert_eq!(
            step(&mut d, 0, true),
            c.line_cross_socket,
            "CPUs 9, 10 hold copies"
        );
        assert_eq!(step(&mut d, 0, false), c.l1_hit);
        // Read by the owner alone after a write: a later write is a silent upgrade.
        step(&mut d, 12, false);
        step(&mut d, 12, true);
        assert_eq!(step(&mut d, 12, true), c.l1_hit);
    }

    proptest::proptest! {
        /// Lines kept in arrays are priced exactly as hashed ones, whatever the access
        /// sequence: packing, the two inline sharers and the move of a line with more to the
        /// hash table; lines kept whole, their sharers in side words once more than a few
        /// (on a machine of one sharer word and of three).
        #[test]
        fn dense_lines_are_priced_as_hashed_ones(
            cores in 5usize..=40,
            accesses in proptest::collection::vec(
                (0usize..12, 0u64..6, proptest::bool::weighted(0.15), 0u64..40),
                1..300,
            )
        ) {
            let topo = Topology::new(2, cores, 2).unwrap();
            let c = &distinct_costs();
            let mut hashed = LineDirectory::new(topo.nr_cpus());
            let mut dense = LineDirectory::new(topo.nr_cpus()).with_dense(2..4).with_flat(4..6);
            let mut t = Time::from_ns(1000);
            for (k, line, write, dt) in accesses {
                // Twelve CPUs spread over the machine: sets outgrow the inline six, over
                // several sharer words, and their members come back.
                let cpu = k * topo.nr_cpus() / 12;
                t += Time::from_ns(dt);
                proptest::prop_assert_eq!(
                    hashed.access(&topo, c, cpu, line, write, t),
                    dense.access(&topo, c, cpu, line, write, t)
                );
            }
        }

        /// What `Machine::load_hit` relies on: once a CPU has read a line, reading it again
        /// (with no other access in between) is an L1 hit that changes nothing — the prices
        /// of any accesses after it are those without it.
        #[test]
        fn a_line_read_again_by_its_reader_is_a_hit(
            before in proptest::collection::vec((0usize..20, 0u64..6, proptest::bool::ANY, 0u64..40), 0..100),
            (cpu, line) in (0usize..20, 0u64..6),
            again in 1usize..4,
            after in proptest::collection::vec((0usize..20, 0u64..6, proptest::bool::ANY, 0u64..40), 0..50),
        ) {
            let topo = Topology::new(2, 5, 2).unwrap();
            let c = &distinct_costs();
            let mut d = LineDirectory::new(topo.nr_cpus()).with_dense(2..5);
            let mut t = Time::from_ns(1000);
            for &(cpu, line, write, dt) in &before {
                t += Time::from_ns(dt);
                d.access(&topo, c, cpu, line, write, t);
            }
            d.access(&topo, c, cpu, line, false, t);
            let mut without = d.clone();
            for i in 0..again {
                let at = t + Time::from_ns(i as u64);
                proptest::prop_assert_eq!(d.access(&topo, c, cpu, line, false, at), c.l1_hit);
            }
            for (cpu, line, write, dt) in after {
                t += Time::from_ns(dt);
                proptest::prop_assert_eq!(
                    d.access(&topo, c, cpu, line, write, t),
                    without.access(&topo, c, cpu, line, write, t)
                );
            }
        }
    }
}
