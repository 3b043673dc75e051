//! Errors of the checker's public API: always `FILE: KEY: REASON`.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckError {
    pub file: String,
    pub key: String,
    pub reason: String,
}

impl CheckError {
    pub fn new(file: &str, key: &str, reason: impl Into<String>) -> Self {
        CheckError {
            file: file.to_string(),
            key: key.to_string(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.file, self.key, self.reason)
    }
}

impl std::error::Error for CheckError {}
