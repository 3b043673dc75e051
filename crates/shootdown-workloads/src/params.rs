//! Typed access to a workload's `[workload]` table that remembers which keys were read, so that
//! any key a workload does not know is reported as an error naming it.

use shootdown_hw::profile::show_number;
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::ops::RangeInclusive;

/// `(key, reason)`; the caller prefixes the file and `workload.`.
pub type ParamError = (String, String);

/// Upper bounds of workload parameters: far beyond any experiment, small enough that products
/// of them cannot overflow and that building a workload stays within memory.
pub mod limits {
    /// Threads (tasks) of one workload.
    pub const THREADS: i64 = 1 << 16;
    /// Memory one workload maps, in MiB (64 GiB: 16 M PTEs).
    pub const MEMORY_MB: i64 = 1 << 16;
    /// Iterations, rounds, request counts.
    pub const COUNT: i64 = 1_000_000_000;
    /// A per-operation duration in ns (one second).
    pub const NS: i64 = 1_000_000_000;
    /// A simulated window in ms (one hour).
    pub const MS: f64 = 3_600_000.0;
    /// The size of one object (an ebizzy chunk, a sysbench block) in KiB: 1 GiB.
    pub const OBJECT_KB: i64 = 1 << 20;
}

pub struct Params<'a> {
    table: &'a toml::Table,
    used: RefCell<BTreeSet<String>>,
}

impl<'a> Params<'a> {
    pub fn new(table: &'a toml::Table) -> Self {
        let used = RefCell::new(BTreeSet::from(["kind".to_string()]));
        Params { table, used }
    }

    fn get(&self, key: &str) -> Option<&'a toml::Value> {
        self.used.borrow_mut().insert(key.to_string());
        self.table.get(key)
    }

    /// An integer in `range`, or `default` when absent. Every integer has an upper bound too: a
    /// typo'd count must be an error here, not an overflow or an endless run later.
    pub fn int(
        &self,
        key: &str,
        default: i64,
        range: RangeInclusive<i64>,
    ) -> Result<i64, ParamError> {
        match self.get(key) {
            None => Ok(default),
            Some(toml::Value::Integer(i)) if range.contains(i) => Ok(*i),
            Some(toml::Value::Integer(i)) => Err((
                key.into(),
                format!(
                    "must be between {} and {} (got {i})",
                    range.start(),
                    range.end()
                ),
            )),
            Some(v) => Err((
                key.into(),
                format!("expected an integer, got {}", v.type_str()),
            )),
        }
    }

    /// A number (integer or float) in `0..=max`, or `default` when absent.
    pub fn num(&self, key: &str, default: f64, max: f64) -> Result<f64, ParamError> {
        let v = match self.get(key) {
            None => return Ok(default),
            Some(toml::Value::Integer(i)) => *i as f64,
            Some(toml::Value::Float(f)) => *f,
            Some(v) => {
                return Err((
                    key.into(),
                    format!("expected a number, got {}", v.type_str()),
                ))
            }
        };
        if (0.0..=max).contains(&v) {
            Ok(v)
        } else {
            Err((
                key.into(),
                format!("must be between 0 and {max} (got {})", show_number(v)),
            ))
        }
    }

    pub fn boolean(&self, key: &str, default: bool) -> Result<bool, ParamError> {
        match self.get(key) {
            None => Ok(default),
            Some(toml::Value::Boolean(b)) => Ok(*b),
            Some(v) => Err((
                key.into(),
                format!("expected true or false, got {}", v.type_str()),
            )),
        }
    }

    pub fn string(&self, key: &str, default: &str, allowed: &[&str]) -> Result<String, ParamError> {
        match self.get(key) {
            None => Ok(default.into()),
            Some(toml::Value::String(s)) if allowed.is_empty() || allowed.contains(&s.as_str()) => {
                Ok(s.clone())
            }
            Some(toml::Value::String(s)) => Err((
                key.into(),
                format!("unknown value '{s}' (expected {})", allowed.join(" | ")),
            )),
            Some(v) => Err((
                key.into(),
                format!("expected a string, got {}", v.type_str()),
            )),
        }
    }

    /// The whole table, for a workload that parses nested tables itself (mark the keys it reads
    /// with [`Params::mark_used`]).
    pub fn table_ref(&self) -> &'a toml::Table {
        self.table
    }

    /// Mark a key as known without reading it through these accessors (a sub-table the caller
    /// parses itself, like `host`).
    pub fn mark_used(&self, key: &str) {
        self.used.borrow_mut().insert(key.to_string());
    }

    /// Call after reading every parameter: the first key nobody asked for is an error.
    pub fn finish(&self) -> Result<(), ParamError> {
        let used = self.used.borrow();
        match self.table.keys().find(|k| !used.contains(*k)) {
            Some(k) => Err((
                k.clone(),
                format!(
                    "unknown workload parameter (known: {})",
                    used.iter()
                        .filter(|u| *u != "kind" && *u != "host")
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
            None => Ok(()),
        }
    }
}
