//! The files a run reads, each with a digest of the bytes it read: the experiment file and every
//! profile file of its `inherits` chain. A sweep's cache key covers exactly these (plus the
//! `--set` overrides, `quick` and the model's build), so an edit of any of them recomputes the
//! points it affects and nothing is served stale.

use serde::Serialize;
use sha2::{Digest, Sha256};
use std::path::Path;

/// One file a run read.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Input {
    /// The path as it was opened.
    pub path: String,
    /// SHA-256 of the bytes read, in hex.
    pub sha256: String,
}

impl Input {
    pub(crate) fn new(path: &Path, text: &str) -> Input {
        let digest = Sha256::digest(text.as_bytes());
        Input {
            path: path.display().to_string(),
            sha256: digest.iter().map(|b| format!("{b:02x}")).collect(),
        }
    }
}
