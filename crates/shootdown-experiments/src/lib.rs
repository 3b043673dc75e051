//! The front end's core: experiment and profile files, the points an experiment expands into,
//! running them (in parallel, deterministically), and the records they produce.
//!
//! The Python package (`python/shootdown`) and its CLI are thin layers over this crate, reached
//! through `crates/shootdown-py`. Everything here speaks JSON-serialisable types so the records a
//! user sees in a DataFrame are exactly what the model produced.
//!
//! Layering: this crate sits on top of engine → hw → linux → workloads; nothing below imports it.

mod error;
mod inputs;
mod overrides;
mod profile_file;
mod run;
mod spec;

pub use error::ConfigError;
pub use inputs::Input;
pub use profile_file::load_profile;
pub use run::{
    profile_point, profile_points, run_point, run_points, trace_point, trace_window_start,
    PointProfile, PointResult,
};
pub use spec::{Experiment, Point, PublishedCell, VariantSpec};

use std::path::{Path, PathBuf};

/// Load an experiment file, apply `--set KEY=VALUE` overrides, resolve its profile (searched in
/// `profiles/` next to the experiment tree, see [`profile_dirs`]) and validate everything that
/// can be validated before running.
pub fn load(path: &Path, sets: &[String]) -> Result<Experiment, ConfigError> {
    spec::load_experiment(path, sets)
}

/// Directories searched for `profiles/<name>.toml`: `$SHOOTDOWN_PROFILES` if set, then
/// `profiles/` in each ancestor of the experiment file, then `$SHOOTDOWN_SHIPPED_PROFILES` (the
/// installed package's profiles, set by the Python layer), so that an experiment copied out of
/// the tree still finds the shipped machines while a `profiles/` beside it takes precedence.
pub fn profile_dirs(experiment_path: &Path) -> Vec<PathBuf> {
    profile_dir_list(experiment_path)
}

pub(crate) fn profile_dir_list(experiment_path: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(p) = std::env::var("SHOOTDOWN_PROFILES") {
        dirs.push(PathBuf::from(p));
    }
    let abs =
        std::fs::canonicalize(experiment_path).unwrap_or_else(|_| experiment_path.to_path_buf());
    let mut cur = abs.parent();
    while let Some(d) = cur {
        dirs.push(d.join("profiles"));
        cur = d.parent();
    }
    if let Ok(p) = std::env::var("SHOOTDOWN_SHIPPED_PROFILES") {
        dirs.push(PathBuf::from(p));
    }
    dirs
}
