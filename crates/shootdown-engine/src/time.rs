//! Simulated time. Integer picoseconds so that sub-nanosecond costs (a cache hit, a single
//! instruction) add up exactly and identically on every machine.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::{Add, AddAssign, Sub};

/// A point in (or span of) simulated time, in picoseconds.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Time(pub u64);

impl Time {
    pub const ZERO: Time = Time(0);
    pub const MAX: Time = Time(u64::MAX);

    /// From nanoseconds given as a float (cost-profile values); rounded to the picosecond.
    pub fn from_ns_f64(ns: f64) -> Time {
        Time((ns * 1000.0).round().max(0.0) as u64)
    }
    pub const fn from_ns(ns: u64) -> Time {
        Time(ns * 1000)
    }
    pub const fn from_us(us: u64) -> Time {
        Time(us * 1_000_000)
    }
    pub const fn from_ms(ms: u64) -> Time {
        Time(ms * 1_000_000_000)
    }
    pub fn as_ns_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }
    pub fn as_us_f64(self) -> f64 {
        self.0 as f64 / 1_000_000.0
    }
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e12
    }
    pub fn saturating_sub(self, o: Time) -> Time {
        Time(self.0.saturating_sub(o.0))
    }
}

impl Add for Time {
    type Output = Time;
    fn add(self, o: Time) -> Time {
        Time(self.0.saturating_add(o.0))
    }
}
impl AddAssign for Time {
    fn add_assign(&mut self, o: Time) {
        self.0 = self.0.saturating_add(o.0)
    }
}
impl Sub for Time {
    type Output = Time;
    fn sub(self, o: Time) -> Time {
        Time(self.0 - o.0)
    }
}
impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}us", self.as_us_f64())
    }
}
