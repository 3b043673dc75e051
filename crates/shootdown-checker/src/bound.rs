//! The state bound: its default, and what to suggest when a search reaches it.
//!
//! **The default** is a share of the memory available when each search starts, divided by what a
//! stored state costs the strategy (measured, `docs/performance.md`): depth-first search keeps
//! fingerprints only (≈ 40 B a state all included), breadth-first search keeps the index and a
//! frontier of whole states (≈ 173 B a state on `pv_tlb_flush_4vcpu` under TSO). So a check
//! stops before the machine runs out of memory, and the machine, not a constant, says how far
//! a check can go. The bound used is reported with the result; `--max-states` fixes it (for a
//! verdict that must not depend on the machine).
//!
//! **The hint.** A search that reached the bound does not know how many states remain. It
//! knows how its discovery of new states went: [`Growth`] samples the states stored against
//! the transitions applied, and the rate of new states per transition falls as a search runs
//! out of new states. Where the last windows' rates fall geometrically, the rest of the curve
//! is extrapolated (the integral of the fitted exponential) for an estimate of the whole state
//! space; where they do not fall, no estimate is given, and the note says so.

/// Bytes a stored state costs depth-first search, all included (`docs/performance.md`,
/// "Explorer": 33–40 B on `pv_tlb_flush_4vcpu` and `flush_catchup_3cpu`).
pub const DFS_BYTES_PER_STATE: u64 = 40;

/// Bytes a stored state costs breadth-first search, all included (`docs/performance.md`:
/// 173 B on `pv_tlb_flush_4vcpu` under TSO, where the frontier of whole states peaks).
pub const BFS_BYTES_PER_STATE: u64 = 173;

/// The share of available memory the default bound may use: the rest is for the process
/// itself, a hash table's growth and whatever else the machine runs.
pub const MEMORY_SHARE: f64 = 0.25;

/// The default bound never goes below this (a machine that reports little memory still checks
/// the shipped scenarios) nor above what breadth-first search's 32-bit state ids can name.
pub const MIN_DEFAULT: u64 = 1_000_000;
const MAX_DEFAULT: u64 = u32::MAX as u64 - 1;

/// Memory available to a new allocation, bytes: `MemAvailable` of `/proc/meminfo` (Linux);
/// None where it cannot be read.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The default state bound of a strategy (`depth_first`: fingerprints only), from `available`
/// bytes of memory (None: [`MIN_DEFAULT`] × 10, the figure of a machine with a few GB).
pub fn default_max_states(depth_first: bool, available: Option<u64>) -> u64 {
    let per_state = if depth_first {
        DFS_BYTES_PER_STATE
    } else {
        BFS_BYTES_PER_STATE
    };
    match available {
        Some(bytes) => {
            let n = (bytes as f64 * MEMORY_SHARE / per_state as f64) as u64;
            // Two significant digits: a bound a user can read and type.
            round_up(n.clamp(MIN_DEFAULT, MAX_DEFAULT), 2).min(MAX_DEFAULT)
        }
        None => MIN_DEFAULT * 10,
    }
}

/// `n` rounded up to `digits` significant digits.
pub fn round_up(n: u64, digits: u32) -> u64 {
    let mut scale = 1u64;
    while n / scale >= 10u64.pow(digits) {
        scale *= 10;
    }
    n.div_ceil(scale) * scale
}

/// Levels fitted: the last this many ratios of consecutive level sizes.
const FIT_RATIOS: usize = 3;

/// A ratio of level sizes at or above this is not a shrinking tail.
const SHRINKING: f64 = 0.99;

/// Breadth-first search's level sizes: states first stored at each depth, and how much of
/// the level being expanded was expanded (for the size of the level it was generating).
#[derive(Clone, Debug, Default)]
pub struct LevelSizes {
    sizes: Vec<u64>,
    /// The level being expanded, and how many of its states were.
    current: u32,
    expanded: u64,
}

/// What the level sizes say about the states left when a search stopped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Outlook {
    /// The levels shrink by `ratio` a level: about `total` states in all.
    Ending { total: u64, ratio: f64 },
    /// The levels were still growing (or not shrinking): the last ratio of level sizes.
    Growing { ratio: f64 },
    /// Too few levels to say.
    Unknown,
    /// A search without levels (depth-first).
    NoLevels,
}

impl LevelSizes {
    /// A state stored at `depth`.
    #[inline]
    pub fn store(&mut self, depth: u32) {
        let d = depth as usize;
        if self.sizes.len() <= d {
            self.sizes.resize(d + 1, 0);
        }
        self.sizes[d] += 1;
    }

    /// A state of level `depth` expanded (levels are expanded in order).
    #[inline]
    pub fn expand(&mut self, depth: u32) {
        if depth != self.current {
            self.current = depth;
            self.expanded = 0;
        }
        self.expanded += 1;
    }

    /// The complete level sizes, and the one being generated scaled up by the share of its
    /// parents' level expanded: the tail's ratio, and the states it extrapolates to.
    pub fn outlook(&self) -> Outlook {
        let k = self.current as usize;
        if self.sizes.len() <= k || self.expanded == 0 {
            return Outlook::Unknown;
        }
        let mut sizes: Vec<f64> = self.sizes[..=k].iter().map(|&n| n as f64).collect();
        let partial = self.sizes.get(k + 1).copied().unwrap_or(0) as f64;
        let share = self.expanded as f64 / sizes[k];
        if share < 1.0 {
            sizes.push(partial / share);
        } else if partial > 0.0 {
            sizes.push(partial);
        }
        if sizes.len() < FIT_RATIOS + 2 {
            return Outlook::Unknown;
        }
        let last = sizes[sizes.len() - 1];
        let before = sizes[sizes.len() - 1 - FIT_RATIOS];
        if last <= 0.0 || before <= 0.0 {
            return Outlook::Unknown;
        }
        let ratio = (last / before).powf(1.0 / FIT_RATIOS as f64);
        if ratio >= SHRINKING {
            return Outlook::Growing { ratio };
        }
        // The levels to come, a geometric series from the last one.
        let rest = last * ratio / (1.0 - ratio);
        let total: f64 = sizes.iter().sum::<f64>() + rest;
        Outlook::Ending {
            total: total.ceil() as u64,
            ratio,
        }
    }
}

/// The note for a search that stopped at `bound` after `states` states (`reach`: how deep).
pub fn bound_note(bound: u64, states: u64, reach: &str, outlook: Outlook) -> String {
    let head = format!(
        "stopped at the state bound ({bound} states; {states} stored, {reach}) before exploring every interleaving: nothing is proved"
    );
    match outlook {
        Outlook::Ending { total, ratio } => format!(
            "{head}; the last levels shrank by ×{ratio:.2} a level, which extrapolates to about {total} states in all: try --max-states {}",
            round_up(total + total / 4, 2)
        ),
        Outlook::Growing { ratio } => format!(
            "{head}; the levels were not yet shrinking (×{ratio:.2} a level), so how many remain cannot be estimated: try --max-states {}, or check a smaller configuration (--set)",
            round_up(bound.saturating_mul(10), 2)
        ),
        Outlook::Unknown => format!(
            "{head}; too few levels to estimate how many remain: try --max-states {}",
            round_up(bound.saturating_mul(10), 2)
        ),
        Outlook::NoLevels => format!(
            "{head}; how many remain cannot be estimated (depth-first search has no levels to extrapolate; breadth-first search estimates it, --strategy parallel): try --max-states {}",
            round_up(bound.saturating_mul(10), 2)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_up_keeps_two_digits() {
        assert_eq!(round_up(1_234_567, 2), 1_300_000);
        assert_eq!(round_up(1_200_000, 2), 1_200_000);
        assert_eq!(round_up(7, 2), 7);
    }

    #[test]
    fn default_scales_with_memory_and_strategy() {
        let gib = 1u64 << 30;
        let dfs = default_max_states(true, Some(16 * gib));
        let bfs = default_max_states(false, Some(16 * gib));
        assert_eq!(dfs, round_up(16 * gib / 4 / 40, 2));
        assert!(bfs < dfs / 4, "{bfs} {dfs}");
        assert_eq!(default_max_states(true, Some(1)), MIN_DEFAULT);
        assert_eq!(default_max_states(false, None), 10 * MIN_DEFAULT);
    }

    /// Levels that shrink geometrically extrapolate to their total, the level being
    /// generated scaled by the share of its parents expanded; growing levels give no estimate.
    #[test]
    fn outlook_extrapolates_shrinking_levels() {
        let full: Vec<u64> = (0..30)
            .map(|d| {
                if d < 10 {
                    100 * (d + 1)
                } else {
                    (1000.0 * 0.8f64.powi(d as i32 - 9)) as u64
                }
            })
            .collect();
        let total: u64 = full.iter().sum();
        let mut l = LevelSizes::default();
        // Stop at depth 15 with half of it expanded.
        for (d, &n) in full.iter().enumerate().take(16) {
            for _ in 0..n {
                l.store(d as u32);
            }
        }
        for d in 0..16u32 {
            let n = if d == 15 {
                full[15] / 2
            } else {
                full[d as usize]
            };
            for _ in 0..n {
                l.expand(d);
            }
        }
        for _ in 0..full[16] / 2 {
            l.store(16);
        }
        match l.outlook() {
            Outlook::Ending { total: est, ratio } => {
                assert!((ratio - 0.8).abs() < 0.02, "{ratio}");
                assert!(
                    (est as f64 - total as f64).abs() < 0.03 * total as f64,
                    "{est} {total}"
                );
            }
            o => panic!("{o:?}"),
        }
        let mut g = LevelSizes::default();
        for d in 0..8u32 {
            for _ in 0..(d + 1) * 10 {
                g.store(d);
                g.expand(d);
            }
        }
        assert!(matches!(g.outlook(), Outlook::Growing { .. }));
        assert_eq!(LevelSizes::default().outlook(), Outlook::Unknown);
    }
}
