//! One error type for everything a user can get wrong: it always names the file, the key and
//! the reason, and prints as one line (`FILE: KEY: REASON`).

use std::fmt;
use std::path::Path;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub key: String,
    pub reason: String,
}

impl ConfigError {
    pub fn new(file: &Path, key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            file: file.display().to_string(),
            key: key.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reason = self.reason.replace('\n', " ");
        if self.key.is_empty() {
            write!(f, "{}: {}", self.file, reason)
        } else {
            write!(f, "{}: {}: {}", self.file, self.key, reason)
        }
    }
}

impl std::error::Error for ConfigError {}
