//! Typed access to a workload's `[workload]` table that remembers which keys were read, so that
//! any key a workload does not know is reported as an error naming it.

use std::cell::RefCell;
use std::collections::BTreeSet;

/// `(key, reason)`; the caller prefixes the file and `workload.`.
pub type ParamError = (String, String);

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

    /// An integer `>= min`, or `default` when absent.
    pub fn int(&self, key: &str, default: i64, min: i64) -> Result<i64, ParamError> {
        match self.get(key) {
            None => Ok(default),
            Some(toml::Value::Integer(i)) if *i >= min => Ok(*i),
            Some(toml::Value::Integer(i)) => {
                Err((key.into(), format!("must be at least {min} (got {i})")))
            }
            Some(v) => Err((
                key.into(),
                format!("expected an integer, got {}", v.type_str()),
            )),
        }
    }

    /// A non-negative number (integer or float).
    pub fn num(&self, key: &str, default: f64) -> Result<f64, ParamError> {
        match self.get(key) {
            None => Ok(default),
            Some(toml::Value::Integer(i)) if *i >= 0 => Ok(*i as f64),
            Some(toml::Value::Float(f)) if *f >= 0.0 && f.is_finite() => Ok(*f),
            Some(v) => Err((
                key.into(),
                format!("expected a non-negative number, got {v}"),
            )),
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
