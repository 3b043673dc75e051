//! CPU topology: `sockets × cores_per_socket × threads_per_core` logical CPUs, numbered like
//! Linux on most Intel servers: first one thread of every core of every socket, then the SMT
//! siblings (so CPUs 0..23 on a 2×12×2 machine are distinct cores, socket 0 first).

use serde::Serialize;

/// Index of a logical CPU (or, inside a guest, of a vCPU).
pub type CpuId = usize;

/// The most logical CPUs a topology may have.
pub const MAX_CPUS: usize = 16384;

/// How far apart two CPUs are; IPI latency and cache-line transfer cost depend on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Distance {
    SameCpu,
    /// SMT siblings share L1/L2.
    SameCore,
    /// Cores of one socket that share its last-level cache (every core of an Intel socket).
    SameSocket,
    /// Cores of one socket with last-level caches of their own: AMD's core complexes (CCX),
    /// whose lines travel over the socket's fabric.
    CrossLlc,
    CrossSocket,
}

/// Built only by [`Topology::new`], which validates the counts and derives the divisors.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Topology {
    pub sockets: usize,
    pub cores_per_socket: usize,
    pub threads_per_core: usize,
    /// Cores sharing one last-level cache: `cores_per_socket` on Intel, the CCX's 8 on AMD
    /// Zen 3 ([`Topology::with_cores_per_llc`]).
    pub cores_per_llc: usize,
    /// `cpu % nr_cores` and `core / cores_per_socket` by multiplication ([`FastDiv`]): they
    /// are on every cache-line transfer and IPI of the timed driver ([`Topology::distance`]).
    #[serde(skip)]
    core_div: FastDiv,
    #[serde(skip)]
    socket_div: FastDiv,
    #[serde(skip)]
    llc_div: FastDiv,
}

/// Division and remainder of 32-bit numbers by a fixed divisor, by multiplication (Lemire,
/// Kaser and Kurz, "Faster remainder by direct computation", 2019: with `m = ⌈2^64 / d⌉`,
/// `n / d` is the high word of `m · n` and `n % d` the high word of `(m · n mod 2^64) · d`,
/// exactly, for every 32-bit `n` and `d`). A hardware division costs 20 to 90 cycles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FastDiv {
    d: u64,
    /// `⌈2^64 / d⌉`, which is `2^64` (0 here) for `d = 1`.
    m: u64,
}

impl FastDiv {
    fn new(d: usize) -> Self {
        let d = d as u64;
        assert!((1..=u32::MAX as u64).contains(&d));
        FastDiv {
            d,
            m: (u64::MAX / d).wrapping_add(1),
        }
    }
    fn div(self, n: usize) -> usize {
        debug_assert!(n <= u32::MAX as usize);
        if self.d == 1 {
            return n;
        }
        ((self.m as u128 * n as u128) >> 64) as usize
    }
    fn rem(self, n: usize) -> usize {
        debug_assert!(n <= u32::MAX as usize);
        let low = self.m.wrapping_mul(n as u64);
        ((low as u128 * self.d as u128) >> 64) as usize
    }
}

impl Topology {
    /// Validate; the error names the offending key.
    pub fn new(
        sockets: usize,
        cores_per_socket: usize,
        threads_per_core: usize,
    ) -> Result<Self, (&'static str, String)> {
        if sockets == 0 {
            return Err(("sockets", "must be at least 1".into()));
        }
        if cores_per_socket == 0 {
            return Err(("cores_per_socket", "must be at least 1".into()));
        }
        if !(1..=8).contains(&threads_per_core) {
            return Err(("threads_per_core", "must be between 1 and 8".into()));
        }
        // Checked: a typo'd count must fail here, not overflow in `nr_cpus`.
        let fits = sockets
            .checked_mul(cores_per_socket)
            .and_then(|n| n.checked_mul(threads_per_core))
            .is_some_and(|n| n <= MAX_CPUS);
        if !fits {
            let key = if sockets > MAX_CPUS {
                "sockets"
            } else {
                "cores_per_socket"
            };
            return Err((
                key,
                format!(
                    "{sockets} x {cores_per_socket} x {threads_per_core} logical CPUs is more than \
                     the {MAX_CPUS} supported"
                ),
            ));
        }
        let t = Topology {
            sockets,
            cores_per_socket,
            threads_per_core,
            cores_per_llc: cores_per_socket,
            core_div: FastDiv::new(sockets * cores_per_socket),
            socket_div: FastDiv::new(cores_per_socket),
            llc_div: FastDiv::new(cores_per_socket),
        };
        Ok(t)
    }

    /// The same machine with `n` cores to a last-level cache (a divisor of
    /// `cores_per_socket`).
    pub fn with_cores_per_llc(mut self, n: usize) -> Result<Self, (&'static str, String)> {
        if n == 0 || self.cores_per_socket % n != 0 {
            return Err((
                "cores_per_llc",
                format!(
                    "must divide cores_per_socket ({}) (got {n})",
                    self.cores_per_socket
                ),
            ));
        }
        self.cores_per_llc = n;
        self.llc_div = FastDiv::new(n);
        Ok(self)
    }
    pub fn nr_cpus(&self) -> usize {
        self.sockets * self.cores_per_socket * self.threads_per_core
    }
    pub fn nr_cores(&self) -> usize {
        self.sockets * self.cores_per_socket
    }
    /// Core index (0..nr_cores) of a CPU.
    pub fn core_of(&self, cpu: CpuId) -> usize {
        self.core_div.rem(cpu)
    }
    /// Which hardware thread of its core a CPU is (0..threads_per_core): Linux numbers all
    /// cores' first threads, then the second threads.
    pub fn thread_of(&self, cpu: CpuId) -> usize {
        self.core_div.div(cpu)
    }
    pub fn socket_of(&self, cpu: CpuId) -> usize {
        self.socket_div.div(self.core_of(cpu))
    }
    /// Last-level cache index (0..nr_cores / cores_per_llc) of a CPU.
    pub fn llc_of(&self, cpu: CpuId) -> usize {
        self.llc_div.div(self.core_of(cpu))
    }
    pub fn distance(&self, a: CpuId, b: CpuId) -> Distance {
        if a == b {
            Distance::SameCpu
        } else if self.core_of(a) == self.core_of(b) {
            Distance::SameCore
        } else if self.socket_of(a) != self.socket_of(b) {
            Distance::CrossSocket
        } else if self.llc_of(a) == self.llc_of(b) {
            Distance::SameSocket
        } else {
            Distance::CrossLlc
        }
    }
    /// The CPUs of one socket in placement order: all cores' first threads, then siblings
    /// (what `numactl --cpunodebind` plus the scheduler's spreading gives).
    pub fn cpus_of_socket(&self, socket: usize) -> Vec<CpuId> {
        let mut v = Vec::new();
        for t in 0..self.threads_per_core {
            for c in 0..self.cores_per_socket {
                v.push(t * self.nr_cores() + socket * self.cores_per_socket + c);
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn haswell_numbering() {
        let t = Topology::new(2, 12, 2).unwrap();
        assert_eq!(t.nr_cpus(), 48);
        assert_eq!(t.socket_of(0), 0);
        assert_eq!(t.socket_of(12), 1);
        assert_eq!(t.socket_of(24), 0);
        assert_eq!(t.distance(0, 24), Distance::SameCore);
        assert_eq!(t.distance(0, 1), Distance::SameSocket);
        assert_eq!(t.distance(0, 12), Distance::CrossSocket);
        assert_eq!((t.core_of(30), t.thread_of(30)), (6, 1));
        assert_eq!((t.core_of(5), t.thread_of(5)), (5, 0));
        assert_eq!(t.cpus_of_socket(1)[0], 12);
        assert_eq!(t.cpus_of_socket(0).len(), 24);
        assert_eq!(t.llc_of(23), 1);
    }

    /// A 2-socket Zen 3 (Milan): 8 CCXs of 8 cores per socket, SMT siblings N and N + 128.
    #[test]
    fn milan_ccx() {
        let t = Topology::new(2, 64, 2)
            .unwrap()
            .with_cores_per_llc(8)
            .unwrap();
        assert_eq!(t.distance(0, 7), Distance::SameSocket);
        assert_eq!(t.distance(0, 8), Distance::CrossLlc);
        assert_eq!(t.distance(0, 128), Distance::SameCore);
        assert_eq!(t.distance(7, 128 + 1), Distance::SameSocket);
        assert_eq!(t.distance(0, 64), Distance::CrossSocket);
        assert_eq!(t.llc_of(64 + 128 + 9), 9);
        assert!(Topology::new(2, 64, 2)
            .unwrap()
            .with_cores_per_llc(7)
            .is_err());
    }
    proptest::proptest! {
        /// The multiplications give the hardware division's quotients and remainders.
        #[test]
        fn fast_division_is_division(n in 0u32.., d in 1u32..) {
            let f = FastDiv::new(d as usize);
            proptest::prop_assert_eq!(f.div(n as usize), (n / d) as usize);
            proptest::prop_assert_eq!(f.rem(n as usize), (n % d) as usize);
        }
    }

    #[test]
    fn fast_division_by_small_and_extreme_divisors() {
        for d in [1u32, 2, 3, 7, 12, 24, 1000, 1024, 16384, u32::MAX] {
            let f = FastDiv::new(d as usize);
            for n in [
                0u32,
                1,
                2,
                d - 1,
                d,
                d.wrapping_add(1),
                16383,
                16384,
                u32::MAX,
            ] {
                assert_eq!(f.div(n as usize), (n / d) as usize, "{n} / {d}");
                assert_eq!(f.rem(n as usize), (n % d) as usize, "{n} % {d}");
            }
        }
    }

    #[test]
    fn rejects_impossible() {
        assert_eq!(Topology::new(0, 4, 1).unwrap_err().0, "sockets");
        assert_eq!(Topology::new(1, 4, 9).unwrap_err().0, "threads_per_core");
    }
}
